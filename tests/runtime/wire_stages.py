"""The wire stages the runtime tests name, by what logs and fault points call them ('STAGE_MASKED_INPUT').

On the wire a stage is its aggregation and its step in its round kind's declaration
(:class:`~fedfair.runtime.transport.WireStage`); a test names it as an operator reads it.
"""

from __future__ import annotations

from fedfair.runtime.contract import EVALUATION, TRAINING, training_of
from fedfair.runtime.transport import EVALUATE, JOIN, TRAIN, WireStage
from fedfair.secagg.bounded.stages import BOUNDED_ROUND

BOUNDED_TRAINING = training_of(BOUNDED_ROUND)
"""A training round under [secure_aggregation] input_bound = "two_verifiers": the bounded sum's stages."""


def _named() -> dict[str, WireStage]:
    named = {"STAGE_JOIN": JOIN, "STAGE_TRAIN": TRAIN, "STAGE_EVALUATE": EVALUATE}
    for stages in (TRAINING, BOUNDED_TRAINING, EVALUATION):
        named.update({stages.name(stage): stage for stage in stages.uploads})
    return named


WIRE: dict[str, WireStage] = _named()
"""Every stage of the masked training round, the bounded one and the evaluation, by its name."""
