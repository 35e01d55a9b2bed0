"""The bounded secure sum's stages travel on the transport: each is (TRAIN, its step), in the round's order.

The aggregator's stage gate admits a read only for a stage already opened, in (aggregation, step) order, so a
training round's stages must come after TRAIN's start, in their declared order, and before EVALUATE.
"""

from __future__ import annotations

from fedfair.runtime.contract import EVALUATION, TRAINING, Aggregations
from tests.runtime.wire_stages import BOUNDED_TRAINING
from fedfair.runtime.transport import EVALUATE, TRAIN, WireStage
from fedfair.secagg.bounded.stages import BOUNDED_ROUND


def test_every_bounded_stage_has_a_training_wire_stage_in_the_rounds_order() -> None:
    bounded = BOUNDED_TRAINING

    assert len(bounded.uploads) == len(BOUNDED_ROUND.stages(True)) == 7
    assert list(bounded.uploads) == [WireStage(TRAIN.aggregation, step) for step in range(1, 8)]
    assert TRAIN < bounded.uploads[0] and bounded.uploads[-1] < EVALUATE
    assert [bounded.name(stage) for stage in bounded.uploads] == [
        f"STAGE_{spec.wire}" for spec in BOUNDED_ROUND.stages(True)
    ]


def test_each_federation_reads_a_training_step_as_its_own_kinds_stage() -> None:
    """The masked and the bounded round both number their stages from TRAIN's step 1: the plan's kind names them."""
    masked, bounded = Aggregations(TRAINING, EVALUATION), Aggregations(BOUNDED_TRAINING, EVALUATION)
    step_one = WireStage(TRAIN.aggregation, 1)

    assert masked.name(step_one) == "STAGE_ADVERTISE_KEYS" and bounded.name(step_one) == "STAGE_BOUNDED_AUDITOR_KEY"
    assert masked.name(WireStage(EVALUATE.aggregation, 1)) == "STAGE_EVAL_ADVERTISE_KEYS"
    assert masked.name(TRAIN) == "STAGE_TRAIN" and masked.spec(TRAIN) is None
    assert list(EVALUATION.uploads) == sorted(EVALUATION.uploads) and TRAINING.uploads[-1] < EVALUATE
    assert masked.name(WireStage(TRAIN.aggregation, 99)) == "STAGE_TRAIN step 99"  # no such stage: said as it came
