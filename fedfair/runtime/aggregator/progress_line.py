"""The aggregator's progress line for a stage still waiting: what its uploads are called, and who it waits for."""

from __future__ import annotations

import logging

from fedfair.runtime.aggregator.stages import StageProgress
from fedfair.runtime.contract import AGGREGATIONS, EVALUATION, TRAINING
from fedfair.runtime.transport import pb

logger = logging.getLogger("fedfair.aggregator")

PLAIN_NOUNS: dict[pb.Stage, str] = {TRAINING.masked: "updates", EVALUATION.masked: "evaluation sums"}
"""What the uploads of a sum are with secure aggregation off (nothing is masked), for the operator's progress line."""


def log_progress(secure: bool, progress: StageProgress) -> None:
    """The operator's periodic line for a stage still waiting.

    'round 4: 2 of 3 masked inputs, waiting for hospital-c, 40 s left'.
    """
    stage = progress.binding.stage
    noun = (None if secure else PLAIN_NOUNS.get(stage)) or secure_noun(stage) or pb.Stage.Name(stage)
    logger.info(
        "round %d: %d of %d %s, waiting for %s, %.0f s left",
        progress.binding.round,
        progress.answered,
        progress.expected,
        noun,
        ", ".join(progress.waiting_for),
        progress.seconds_left,
    )


def secure_noun(stage: pb.Stage) -> str | None:
    """What the uploads of the secure stage `stage` are, in whichever aggregation it belongs to."""
    for stages in AGGREGATIONS:
        spec = stages.specs.get(stage)
        if spec is not None:
            return stages.noun(spec)
    return None
