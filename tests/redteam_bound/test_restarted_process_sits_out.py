"""Issue 94's resumption is unreachable from a restarted process: its task stream sits DECIDE out before the plug-in.

docs/security.md ("A framed site that restarts before DECIDE") says a restarted process is not yet sent the round's
DECIDE because the aggregator's board counts it gone. The collaborator side refuses it too: ``TaskStream.step``
answers any upload stage of a round this process did not start (``self._work`` is made only by a TRAIN or EVALUATE
task) with an empty upload (a withdrawal), so ``kinds/bounded.py resumed`` is never called from a process even once
the board sends DECIDE, and the kept settlement is never read (nor removed: the file stays, see
test_settlement_outlives_round.py). Only the plug-in test, which builds a Work by hand, reaches it.
"""

from __future__ import annotations

import types

from fedfair.runtime.collaborator.stream import TaskStream
from fedfair.runtime.transport import pb
from fedfair.runtime.transport.stage_gate import make_binding
from fedfair.secagg.bounded.stages import DECIDE_STAGE
from tests.runtime.wire_stages import BOUNDED_TRAINING


def test_a_restarted_process_sent_decide_hands_it_to_the_plug_in_rather_than_sitting_it_out() -> None:
    decide = BOUNDED_TRAINING.wire(DECIDE_STAGE)
    task = pb.Task(binding=make_binding("federation", 1, decide))
    sent: list[bytes] = []
    restarted = types.SimpleNamespace(  # a process started afresh since SHARE: no round in memory
        _work=None,
        submit=lambda stub, binding, payload: sent.append(bytes(payload)),
    )
    TaskStream.step(restarted, None, task)  # type: ignore[arg-type]
    assert sent != [b""], "a restarted process withdraws from DECIDE before its kept settlement is read"
