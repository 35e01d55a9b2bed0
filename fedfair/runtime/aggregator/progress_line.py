"""The aggregator's progress for a stage still waiting: its line, and its ``waiting`` event, naming who it waits for.

The event is what ``fedfair status``, the status page and the metrics read, so they name whoever holds a round
up at any stage, not only before it (:mod:`fedfair.runtime.observe.status`); a ``waited`` event ends it.
"""

from __future__ import annotations

import logging

from fedfair.runtime.aggregator.stages import StageProgress
from fedfair.runtime.contract import AGGREGATIONS, EVALUATION, TRAINING
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.transport import pb

logger = logging.getLogger("fedfair.aggregator")

PLAIN_NOUNS: dict[pb.Stage, str] = {TRAINING.masked: "updates", EVALUATION.masked: "evaluation sums"}
"""What the uploads of a sum are with secure aggregation off (nothing is masked), for the operator's progress line."""


def report_progress(secure: bool, events: EventLog | None, progress: StageProgress) -> None:
    """The operator's periodic line for a stage still waiting, and its ``waiting`` event in `events`.

    'round 4: 2 of 3 masked inputs, waiting for hospital-c, 40 s left'. A `progress` that awaits nobody ends the
    wait: no line, a ``waited`` event.
    """
    stage = progress.binding.stage
    noun = (None if secure else PLAIN_NOUNS.get(stage)) or secure_noun(stage) or pb.Stage.Name(stage)
    if not progress.waiting_for:
        if events is not None:
            events.emit("waited", round=progress.binding.round, goal=noun)
        return
    logger.info(
        "round %d: %d of %d %s, waiting for %s, %.0f s left",
        progress.binding.round,
        progress.answered,
        progress.expected,
        noun,
        ", ".join(progress.waiting_for),
        progress.seconds_left,
    )
    if events is not None:
        events.emit(
            "waiting",
            round=progress.binding.round,
            goal=noun,
            stage=pb.Stage.Name(stage),
            connected=progress.answered,
            eligible=progress.expected,
            missing=list(progress.waiting_for),
            seconds_left=round(progress.seconds_left, 1),
        )


def secure_noun(stage: pb.Stage) -> str | None:
    """What the uploads of the secure stage `stage` are, in whichever aggregation it belongs to."""
    for stages in AGGREGATIONS:
        spec = stages.specs.get(stage)
        if spec is not None:
            return stages.noun(spec)
    return None
