"""The bounded secure sum's stages travel on the transport: each has its wire stage, in the round's order.

The aggregator's stage gate admits a read only for a stage already opened, by number, so a training round's
bounded stages must be numbered after TRAIN, in their declared order, and before EVALUATE.
"""

from __future__ import annotations

from fedfair.runtime.contract import Stages
from fedfair.runtime.transport import fedfair_pb2 as pb
from fedfair.secagg.bounded.stages import BOUNDED_ROUND


def test_every_bounded_stage_has_a_training_wire_stage_in_the_rounds_order() -> None:
    bounded = Stages(start=pb.STAGE_TRAIN, kind="train", prefix="", session_offset=0, protocol=BOUNDED_ROUND)

    assert len(bounded.uploads) == len(BOUNDED_ROUND.stages(True)) == 7
    assert list(bounded.uploads) == sorted(bounded.uploads)
    assert pb.STAGE_TRAIN < bounded.uploads[0] and bounded.uploads[-1] < pb.STAGE_EVALUATE
    assert [pb.Stage.Name(stage) for stage in bounded.uploads] == [
        f"STAGE_{spec.wire}" for spec in BOUNDED_ROUND.stages(True)
    ]


def test_the_bounded_stages_leave_the_masked_rounds_stages_in_order() -> None:
    """Renumbering the evaluation's stages kept the masked round's order and its evaluation's after training."""
    masked = Stages(start=pb.STAGE_TRAIN, kind="train", prefix="", session_offset=0)
    evaluation = Stages(start=pb.STAGE_EVALUATE, kind="evaluate", prefix="EVAL_", session_offset=1)

    assert list(masked.uploads) == sorted(masked.uploads)
    assert list(evaluation.uploads) == sorted(evaluation.uploads)
    assert masked.uploads[-1] < pb.STAGE_BOUNDED_AUDITOR_KEY < pb.STAGE_EVALUATE < evaluation.uploads[0]
