"""The aggregator's progress for a stage still waiting: its line, and its ``waiting`` event, naming who it waits for.

The event is what ``fedfair status``, the status page and the metrics read, so they name whoever holds a round
up at any stage, not only before it (:mod:`fedfair.runtime.observe.status`); a ``waited`` event ends it.
"""

from __future__ import annotations

import logging

from fedfair.runtime.aggregator.stages import StageProgress
from fedfair.runtime.contract import Stages
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.transport import WireStage

logger = logging.getLogger("fedfair.aggregator")


def report_progress(secure: bool, stages: Stages, events: EventLog | None, progress: StageProgress) -> None:
    """The operator's periodic line for a stage of `stages` still waiting, and its ``waiting`` event in `events`.

    'round 4: 2 of 3 masked inputs, waiting for hospital-c, 40 s left'. A `progress` that awaits nobody ends the
    wait: no line, a ``waited`` event.
    """
    stage = WireStage.of(progress.binding)
    noun = stage_noun(secure, stages, stage)
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
            stage=stages.name(stage),
            connected=progress.answered,
            eligible=progress.expected,
            missing=list(progress.waiting_for),
            seconds_left=round(progress.seconds_left, 1),
        )


def stage_noun(secure: bool, stages: Stages, stage: WireStage) -> str:
    """What the uploads of `stage` of `stages` are, for the operator's progress line.

    Its round kind's noun, or with secure aggregation off (nothing is masked) "updates" or "evaluation sums"; a stage
    of no upload is called by its name.
    """
    spec = stages.specs.get(stage)
    if spec is None:
        return stages.name(stage)
    if not secure and stage == stages.masked:
        return "evaluation sums" if stages.prefix else "updates"
    return stages.noun(spec)
