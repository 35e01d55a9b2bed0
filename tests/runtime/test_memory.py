"""Memory a round freed goes back to the system once asked for (fedfair.runtime.memory)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

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
