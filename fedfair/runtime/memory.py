"""Handing the memory a large model's round freed back to the system (glibc's malloc_trim), where it pays.

glibc keeps what a thread frees in that thread's arena; a round frees many buffers below its mmap threshold
(gRPC messages, upload words, a state's pieces), and at d = 10^7 a process of three sites as threads held
some 500 MB free in its arenas at its peak. malloc_trim(0) gives every free page back, but the next round
faults them in again: once a round per party it cost a round at d = 10^6 with 10 sites 0.3-0.45 CPU-s
(1.33-1.54 without), so only a site whose chain keeps its state in a file (64 MiB or more,
:mod:`fedfair.runtime.collaborator.chain`) calls it; at the aggregator it measured no gain at d = 10^7.
benchmarks/allocator_ab.py measures both goals.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """The C library's malloc_trim where it is glibc's; None elsewhere (macOS, musl), where nothing is trimmed."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    trim = ctypes.CDLL(library).malloc_trim
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return trim


def release_freed() -> bool:
    """Give every wholly free page of this process's heaps back to the system; whether it could (glibc only)."""
    trim = _malloc_trim()
    return trim is not None and bool(trim(0))
