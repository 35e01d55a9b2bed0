"""What a party's process knows of itself without loading the network stack: when it started.

Kept apart from the peer layer (which loads grpc) so that a command's --help, and the launcher before it
starts anything, can read it without paying for grpc's import.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def process_started() -> float:
    """When this process started, on the time.monotonic() clock: the start of an operator's wait for the command.

    Read from /proc (Linux: the process's start on the boot clock); elsewhere, now.
    """
    now = time.monotonic()
    try:
        # The fields after the command's name, which may itself hold spaces and parentheses; starttime is field 22.
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, IndexError, ValueError):
        return now
    return now - max(age, 0.0)
