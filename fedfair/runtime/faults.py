"""Test-only fault injection: make a runtime process die like ``kill -9`` (or freeze) at a precise point, or a site lie.

The fault tests need a collaborator to die exactly before (or right after) it uploads a
given stage of a given round, and the aggregator to die in the middle of any stage of a round or
right after a round's checkpoint. Killing from outside cannot hit those points
reliably, so the processes read one environment variable, ``FEDFAIR_TEST_FAULT``,
which only the runtime tests set (a kind of round may read its own: a liar of the bounded sum,
:data:`fedfair.runtime.collaborator.kinds.bounded.LIAR_VARIABLE`). The points::

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import os
import signal
import threading

VARIABLE = "FEDFAIR_TEST_FAULT"


FREEZE = "freeze:"
"""A FEDFAIR_TEST_FAULT of this prefix and a point stops the process there (SIGSTOP, as ``kill -STOP`` does) rather
than killing it: a frozen party whose connections stay open, until a SIGCONT lets it go on from that point. It
freezes once: a point that many threads reach (each upload of a stage) would stop it again after the SIGCONT."""

_FREEZING = threading.Lock()


def maybe_die(point: str, round_number: int, stage: str = "") -> None:
    """Die with SIGKILL if FEDFAIR_TEST_FAULT names this point, round (and stage); freeze if it names it after FREEZE."""
    wanted = os.environ.get(VARIABLE)
    if not wanted:
        return
    here = f"{point}:{round_number}" + (f":{stage}" if stage else "")
    if wanted == here:
        os.kill(os.getpid(), signal.SIGKILL)
    elif wanted == FREEZE + here:
        with _FREEZING:
            first = os.environ.pop(VARIABLE, None) is not None
        if first:
            os.kill(os.getpid(), signal.SIGSTOP)
