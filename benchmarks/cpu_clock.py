"""The CPU clock the cost benchmarks read: the least CPU seconds of a few runs of one piece of work.

The machines are shared, so a benchmark reads this process's CPU time (``time.process_time``), not the wall
clock, and keeps the fastest of its repeats: the run the host disturbed least.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def fastest(work: Callable[[], object], repeats: int = 3) -> float:
    """The least CPU seconds of ``repeats`` runs of ``work``."""
    times = []
    for _ in range(repeats):
        started = time.process_time()
        work()
        times.append(time.process_time() - started)
    return min(times)
