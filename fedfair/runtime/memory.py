"""Handing the memory a large model's round freed back to the system (glibc's malloc_trim), where it pays.

malloc_trim(0) gives every free page of glibc's arenas back, but the next round faults them in again: once a round
per party it cost a round at d = 10^6 with 10 sites 0.3-0.45 CPU-s (1.33-1.54 without), so only a site whose chain
keeps its state in a file (64 MiB or more, :mod:`fedfair.runtime.collaborator.chain`) calls it; at the aggregator it
measured no gain at d = 10^7 (benchmarks/allocator_ab.py). A thread that allocates while another holds its arena
gets its own, up to 8 a core, and none reuses another's freed memory: at d = 10^7 with three sites as threads
(2 cores, 16 arenas) 334 MB lay free in arenas at a secure round's peak, which moved by 130 MB between runs. The
aggregator and a collaborator therefore cap their arenas at one a core, at least 4 (:func:`share_arenas`): at
most that many threads run at once, so a thread seldom waits for one (docs/design.md, "Memory").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
from collections.abc import Callable


M_ARENA_MAX = -8
"""glibc's mallopt parameter for the most arenas a process makes (malloc.h)."""

MIN_ARENAS = 4
"""The fewest arenas :func:`share_arenas` leaves a process, however few its cores."""


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc's; None elsewhere (macOS, musl), where the allocator is left alone."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    library = ctypes.util.find_library("c")
    return None if library is None else ctypes.CDLL(library)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """The C library's malloc_trim where it is glibc's; None elsewhere, where nothing is trimmed."""
    glibc = _glibc()
    if glibc is None:
        return None
    trim = glibc.malloc_trim
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return trim


def arenas_for(cores: int) -> int:
    """The arenas a process on `cores` cores shares its threads' allocations among: one a core, at least 4."""
    return max(MIN_ARENAS, cores)


def share_arenas() -> bool:
    """Cap the arenas this process's threads allocate from at :func:`arenas_for` its cores; whether it could.

    Call it as the process starts its threads (an arena made before stays); glibc only, elsewhere nothing changes.
    """
    glibc = _glibc()
    if glibc is None:
        return False
    mallopt = glibc.mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas_for(os.cpu_count() or 1)))


def release_freed() -> bool:
    """Give every wholly free page of this process's heaps back to the system; whether it could (glibc only)."""
    trim = _malloc_trim()
    return trim is not None and bool(trim(0))
