"""The bounded sum's check of a plan at the model's size: its plug-in to the kinds' plan checks.

Under ``input_bound = "two_verifiers"`` every site proves its update within its bound in the proof's field, whose
range tests need 4 d T < p: a bound that fits alone may not fit a large model
(:func:`~fedfair.runtime.plan.input_bound.check_bounded_round`). Registered by the bounded sum's name
(:func:`~fedfair.runtime.plan.kind_checks.register_plan_check`), so the aggregator, ``fedfair plan pin`` / ``plan
show`` and every site run it without naming the kind.

Why: docs/security.md, "Bounded inputs (two verifiers)", "Why not 2x".
"""

from __future__ import annotations

from fedfair.core.update import update_dimension
from fedfair.runtime.plan.bounded_noise import bounded_fractional_bits
from fedfair.runtime.plan.input_bound import check_bounded_round, soundness_line
from fedfair.runtime.plan.kind_checks import register_plan_check
from fedfair.runtime.plan.learning_settings import LearningSettings
from fedfair.secagg.bounded.stages import BOUNDED_ROUND


def check_bounded_plan(settings: LearningSettings, collaborators: int, where: str, parameters: int | None) -> None:
    """Refuse a plan in the two-verifier mode whose bounds the proof's field cannot hold (:func:`check_bounded_round`).

    `parameters`: the model's numbers where the caller has built it, so the round's dimension is held to the field
    too; None (a plan loading or arriving, before any model is built) holds the bounds alone. Nothing is checked
    outside the mode.

    Raises:
        ConfigError: naming the bound, the dimension where it is the cause, and the fixes.
    """
    weight, bits, dimension = _bounded_shape(settings, collaborators, parameters)
    check_bounded_round(
        settings.secure_aggregation,
        settings.influence.update_norm,
        [weight],
        bits,
        where,
        noised=settings.privacy.distributed,
        dimension=dimension,
    )


def bounded_soundness_line(settings: LearningSettings, collaborators: int, parameters: int) -> str:
    """What ``fedfair plan show`` says of the soundness of the plan's largest site's proof at `parameters` numbers.

    Raises:
        ConfigError: the plan's bounds do not fit the field at that size (:func:`check_bounded_plan` says why).
    """
    weight, bits, dimension = _bounded_shape(settings, collaborators, parameters)
    return soundness_line(settings.influence.update_norm, weight, bits, dimension)


def _bounded_shape(settings: LearningSettings, collaborators: int, parameters: int | None) -> tuple[float, int, int]:
    """The largest site's weight (it has the largest bound), the bounded round's fractional bits, its dimension."""
    weight = settings.influence.largest_weight(settings.batch_fraction)
    bits = bounded_fractional_bits(settings, collaborators, 1)  # they do not depend on the model's size
    corrects_drift = settings.training.local.corrects_drift
    dimension = 1 if parameters is None else update_dimension(parameters, corrects_drift)
    return weight, bits, dimension


register_plan_check(BOUNDED_ROUND.name, check_bounded_plan)
