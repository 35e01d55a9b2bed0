"""Handing freed buffers back to the system, so a process's memory is what it holds, not what it once held.

A round allocates and frees model-sized buffers in many pieces: gRPC messages of a megabyte, slices of an
encoding, a download's reassembly. glibc's allocator maps a large block of its own and unmaps it when it is
freed, but each such free raises the size from which it maps (up to 32 MiB), so later blocks of that size
come from the heaps of the threads that asked; freed there, they mostly stay with the process. A
collaborator at d = 10^7 then held about seven float32 models' worth more than it used (round_bench,
``--processes``), and an aggregator with its parties as threads more still. Fixing the size keeps every
block from :data:`MAPPED_FROM` up mapped on its own, returned to the system the moment it is freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

MAPPED_FROM = 4 << 20
"""Blocks of this many bytes or more are mapped on their own: a model's worth at d = 10^6 and up (float32),
never a gRPC message (1 MiB) or a small object. Kept on benchmarks/allocator_ab.py's latest run
(interleaved, secure rounds, parties as threads, the masked upload streamed): at d = 10^7 with 3 sites the
peak is 1,204 MB here against 1,559 with glibc's own threshold (1,174 at 256 KiB); the price is CPU, a round
at d = 10^6 with 10 sites costing 1.57 CPU-s here against 1.20 with glibc's own and 1.18 at 19c2d03."""

_M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter for that size (malloc.h); setting it also stops the size from moving."""


def return_large_frees() -> bool:
    """Have this process map every block of :data:`MAPPED_FROM` bytes or more on its own; whether it could.

    Process-wide and idempotent: the aggregator and each collaborator call it as they start. Only glibc
    has this setting; elsewhere (macOS, musl) nothing changes and the answer is False.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    library = ctypes.util.find_library("c")
    if library is None:
        return False
    mallopt = ctypes.CDLL(library).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MAPPED_FROM))
