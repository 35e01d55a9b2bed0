"""Test-only fault injection: make a runtime process die like ``kill -9`` at a precise point.

The fault tests need a collaborator to die exactly before it uploads a given stage
of a given round, and the aggregator to die exactly after a given round's
checkpoint. Killing from outside cannot hit those points reliably, so the processes
read one environment variable, ``FEDFAIR_TEST_FAULT``, which only the runtime tests
set, for example::

    FEDFAIR_TEST_FAULT=before-upload:2:STAGE_MASKED_INPUT   # collaborator
    FEDFAIR_TEST_FAULT=after-checkpoint:3                   # aggregator

At the named point the process sends itself SIGKILL: no clean-up, no goodbye, exactly
what a crash or ``kill -9`` does to its peers. Unset (always, outside tests), every
check is one dictionary lookup.
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
