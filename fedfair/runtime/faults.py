"""Test-only fault injection: make a runtime process die like ``kill -9`` at a precise point.

The fault tests need a collaborator to die exactly before (or right after) it uploads a
given stage of a given round, and the aggregator to die in the middle of any stage of a round or
right after a round's checkpoint. Killing from outside cannot hit those points
reliably, so the processes read one environment variable, ``FEDFAIR_TEST_FAULT``,
which only the runtime tests set. The points::

    FEDFAIR_TEST_FAULT=before-upload:2:STAGE_MASKED_INPUT     # collaborator, before it uploads that stage
    FEDFAIR_TEST_FAULT=after-upload:4:STAGE_CONSISTENCY       # collaborator, once that upload was accepted
    FEDFAIR_TEST_FAULT=aggregator-stage:2:STAGE_MASKED_INPUT  # aggregator, mid-stage
    FEDFAIR_TEST_FAULT=after-checkpoint:3                     # aggregator, after round 3's checkpoint

``aggregator-stage`` fires once the first upload to the stage has been absorbed,
before its sender is answered; for the start stages (STAGE_TRAIN, STAGE_EVALUATE),
which take no uploads, it fires as the first upload of the next stage arrives,
before it is absorbed: the model went out, at least one collaborator computed its
contribution, nothing is summed yet (`fedfair.runtime.aggregator.driver`).

``after-upload`` is the reliable way to die between two stages: a later stage may
close before a slow party is even handed its task (UNMASK ends as soon as every
secret can be rebuilt), so ``before-upload`` of such a stage need never fire.

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
