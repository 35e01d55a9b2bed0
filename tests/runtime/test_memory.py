"""Memory a round freed goes back to the system once asked for (fedfair.runtime.memory)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from fedfair.runtime.memory import arenas_for

# Frees one 4 MiB block (which raises the size glibc maps from past it), then holds 100 blocks of that size and
# frees all but the last: from the heap, that last one pins the rest until the free pages are given back.
PROGRAM = """
import sys
from fedfair.runtime.memory import release_freed

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096

size = 4 << 20
block = bytearray(size)
del block
before = resident()
blocks = [bytearray(b"x" * size) for _ in range(100)]
del blocks[:-1]
if sys.argv[1] == "released":
    assert release_freed()
print((resident() - before) / size)
"""


def held_after_frees(released: bool) -> float:
    """Blocks' worth of memory the program above still holds once 99 of its 100 blocks are freed."""
    argument = "released" if released else "kept"
    output = subprocess.run([sys.executable, "-c", PROGRAM, argument], capture_output=True, text=True, check=True)
    return float(output.stdout)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_blocks_go_back_to_the_system_once_released() -> None:
    assert held_after_frees(released=False) > 50  # glibc keeps them: what the release is for
    assert held_after_frees(released=True) < 5


# Threads that each allocate while the others hold their arenas (a barrier keeps all of them inside at once), then
# glibc's own count of its arenas (malloc_stats writes one "Arena N:" a heap to stderr).
ARENAS_PROGRAM = """
import ctypes, sys, threading
from fedfair.runtime.memory import share_arenas

if sys.argv[1] == "shared":
    assert share_arenas()
barrier = threading.Barrier(32)
held = []

def allocate():
    blocks = [bytearray(1000) for _ in range(100)]
    barrier.wait()
    held.append(blocks)

threads = [threading.Thread(target=allocate) for _ in range(32)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL(None).malloc_stats()
"""


def arenas_made(shared: bool) -> int:
    """How many arenas the program above leaves, with its arenas shared (share_arenas) or as glibc makes them."""
    argument = "shared" if shared else "own"
    ran = subprocess.run([sys.executable, "-c", ARENAS_PROGRAM, argument], capture_output=True, text=True, check=True)
    return sum(line.startswith("Arena ") for line in ran.stderr.splitlines())


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="arenas are glibc's")
def test_a_runtime_process_shares_at_most_one_arena_a_core_among_its_threads() -> None:
    """Issue 97: each thread that meets a held arena makes its own, up to 8 a core, and keeps what it freed apart;
    capped, 32 threads allocating at once share at most one a core (at least 4)."""
    cap = arenas_for(os.cpu_count() or 1)
    assert arenas_made(shared=False) > cap  # what the cap is for (glibc allows 8 a core)
    assert arenas_made(shared=True) <= cap


def test_the_arena_cap_is_one_a_core_and_never_below_four() -> None:
    assert [arenas_for(cores) for cores in (1, 2, 4, 16, 64)] == [4, 4, 4, 16, 64]
