"""A freed large block goes back to the system once the process asked for it (fedfair.runtime.memory)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# Frees one block of the size fedfair maps from (which, by default, raises the size glibc maps from), then holds
# 100 blocks of that size and frees all but the last: from the heap, that last one pins the rest; mapped on their
# own, each goes back.
PROGRAM = """
import sys
from fedfair.runtime.memory import MAPPED_FROM, return_large_frees

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096

if sys.argv[1] == "fixed":
    assert return_large_frees()
size = MAPPED_FROM
block = bytearray(size)
del block
before = resident()
blocks = [bytearray(b"x" * size) for _ in range(100)]
del blocks[:-1]
print((resident() - before) / size)
"""


def held_after_frees(fixed: bool) -> float:
    """Blocks' worth of memory the program above still holds once 99 of its 100 blocks are freed."""
    argument = "fixed" if fixed else "default"
    output = subprocess.run([sys.executable, "-c", PROGRAM, argument], capture_output=True, text=True, check=True)
    return float(output.stdout)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_freed_large_blocks_go_back_to_the_system() -> None:
    assert held_after_frees(fixed=False) > 50  # the default keeps them: what the setting is for
    assert held_after_frees(fixed=True) < 5
