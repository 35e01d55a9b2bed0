"""How long the attack rows wait for a process: the budget measured on an idle machine, stretched by load.

A row's budget (e.g. 180 s for a site to finish its federation) was measured with the machine to itself.
Beside two CPU hogs on 2 cores the same federation takes about twice as long, and a fixed budget turned
rows that work into timeouts (issue 79). :func:`patient` stretches a budget by the machine's load per CPU
(the 1-minute load average, which the run's own processes raise too), at least 1x and at most
:data:`MOST_STRETCH`, so a process that is truly stuck is still reported.
"""

from __future__ import annotations

import os

MOST_STRETCH = 4.0
"""The largest stretch: 180 s becomes at most 12 minutes, on a machine loaded 4 runnable tasks per CPU."""


def stretch(load: float | None = None, cpus: int | None = None) -> float:
    """The factor a budget is stretched by: `load` (default: the 1-minute load average) per CPU of `cpus`
    (default: the CPUs this process may run on), within [1, :data:`MOST_STRETCH`]."""
    if load is None:
        load = os.getloadavg()[0]
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(MOST_STRETCH, max(1.0, load / max(cpus, 1)))


def patient(seconds: float) -> float:
    """`seconds`, a budget measured on an idle machine, stretched by the machine's load now."""
    return seconds * stretch()
