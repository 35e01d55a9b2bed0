"""What a kind of training round checks of a plan at the model's size, and the registry each kind plugs into.

A round kind that cannot run every plan at every model size (the bounded sum's proof field holds a site's bound only
up to some dimension) registers its check by name (:func:`register_plan_check`), as it registers its round
(:func:`~fedfair.secagg.round.register_round_kind`), its collaborator steps and its auditor's. Every party that holds
the plan runs the plan's training kind's check through :func:`check_plan_at_size` and names no kind: the aggregator
as its plan loads (no model yet) and again before round 1, ``fedfair plan pin`` and ``plan show`` once they build the
model, and a site as the plan arrives and again once its model is built. A kind without a check runs every plan.

The built-in bounded sum's check is :mod:`fedfair.runtime.plan.bounded_check`, which
:mod:`fedfair.runtime.plan.aggregator_plan` imports, so it is registered wherever a plan is read.
"""

from __future__ import annotations

from collections.abc import Callable

from fedfair.core.errors import ConfigError
from fedfair.runtime.plan.learning_settings import LearningSettings

PlanCheck = Callable[[LearningSettings, int, str, "int | None"], None]
"""A kind's check of a plan: check(the plan's learning settings, its number of collaborators, where the plan comes
from (for messages), the model's numbers or None where no model is built yet) -> None.

Raises ConfigError naming the cause and the fix where the kind's rounds cannot run the plan at that size."""

PLAN_CHECKS: dict[str, PlanCheck] = {}
"""Each kind of round (:attr:`~fedfair.secagg.round.SecureRound.name`) -> its check of a plan, as the kinds register."""


def register_plan_check(kind: str, check: PlanCheck) -> None:
    """Plug a kind's check of a plan in: every party runs it on a plan whose training kind is `kind`.

    Raises:
        ConfigError: `kind` registered its check already.
    """
    if kind in PLAN_CHECKS:
        raise ConfigError(f"the round kind {kind!r} registered its plan check already")
    PLAN_CHECKS[kind] = check


def checks_plan_at_size(settings: LearningSettings) -> bool:
    """Whether the plan's training kind registered a check, so a caller builds the model only where one runs."""
    return settings.secure_aggregation.training_kind in PLAN_CHECKS


def check_plan_at_size(
    settings: LearningSettings, collaborators: int, where: str, parameters: int | None = None
) -> None:
    """Run the plan's training kind's check at `parameters` numbers (None: before any model is built).

    `collaborators`: the plan's number of collaborators; `where`: the plan's source, for messages.

    Raises:
        ConfigError: the kind's rounds cannot run the plan at that size (its check says why and the fix).
    """
    check = PLAN_CHECKS.get(settings.secure_aggregation.training_kind)
    if check is not None:
        check(settings, collaborators, where, parameters)
