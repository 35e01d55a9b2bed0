"""Test-only fault injection: make a runtime process die like ``kill -9`` at a precise point.

The fault tests need a collaborator to die exactly before (or right after) it uploads a
given stage of a given round, and the aggregator to die in the middle of any stage of a round or
right after a round's checkpoint. Killing from outside cannot hit those points
reliably, so the processes read one environment variable, ``FEDFAIR_TEST_FAULT``,
which only the runtime tests set. The points::

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import os
import signal

VARIABLE = "FEDFAIR_TEST_FAULT"


def maybe_die(point: str, round_number: int, stage: str = "") -> None:
    """Die with SIGKILL if FEDFAIR_TEST_FAULT names this point, round (and stage)."""
    wanted = os.environ.get(VARIABLE)
    if not wanted:
        return
    here = f"{point}:{round_number}" + (f":{stage}" if stage else "")
    if wanted == here:
        os.kill(os.getpid(), signal.SIGKILL)
