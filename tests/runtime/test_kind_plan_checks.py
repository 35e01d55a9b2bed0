"""A round kind's check of a plan at the model's size, met through the registry by every party that holds the plan.

A kind registers its check by name (``register_plan_check``) as it registers its round and its steps; the
aggregator (as its plan loads, and before round 1 with the model's size), ``fedfair plan show`` and a site (as the
plan arrives, and once its model is built) run the plan's training kind's check and name no kind. The toy kind of
tests/secagg/test_round_kinds.py plugs a check in from here alone; the bounded sum's own is the built-in one, and a
site whose model its proof's field cannot hold refuses it before round 1, with the aggregator's message.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedfair import cli
from fedfair.core.errors import ConfigError, PermanentFailureError
from fedfair.runtime.aggregator.start import run_aggregator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.preparation import check_plan_fits, prepare
from fedfair.runtime.collaborator.trainer import load_local_data, round_trainer
from fedfair.runtime.failures import PLAN_MISMATCH
from fedfair.runtime.output_folder import CHECKPOINT_NAME
from fedfair.runtime.plan.aggregator_plan import (
    load_aggregator_plan,
    load_shared_settings,
    shared_settings,
)
from fedfair.runtime.plan.bounded_check import check_bounded_plan
from fedfair.runtime.plan.input_bound import largest_bound
from fedfair.runtime.plan.kind_checks import PLAN_CHECKS, check_plan_at_size, register_plan_check
from fedfair.runtime.plan.learning_settings import LearningSettings
from fedfair.secagg.bounded.layout import largest_dimension
from fedfair.secagg.bounded.stages import BOUNDED_ROUND
from fedfair.secagg.round import ROUND_KINDS, register_round_kind
from tests.runtime.harness import new_workspace
from tests.runtime.test_input_bound import declared
from tests.runtime.test_plan import FACTORY, aggregator_plan
from tests.secagg.test_round_kinds import toy_kind

NAMES = ("site-a", "site-b", "site-c")
KIND = "toy-sized"
MOST = 100
"""The most numbers the toy kind's rounds hold: the template's model (logistic regression on Adult, 107 + 1) has more."""
ADULT_LOGREG = 108


def refuse_large_models(settings: LearningSettings, collaborators: int, where: str, parameters: int | None) -> None:
    """The toy kind's check: at most MOST numbers; the plan's bounds alone (no model yet) always pass."""
    CALLS.append((collaborators, where, parameters))
    if parameters is not None and parameters > MOST:
        raise ConfigError(
            f"{where}: the toy kind holds at most {MOST} numbers, not {parameters}; train a smaller model"
        )


CALLS: list[tuple[int, str, int | None]] = []


@pytest.fixture
def toy_checked() -> Iterator[None]:
    """The toy kind with its plan check, registered for the test and taken out after."""
    register_round_kind(toy_kind(KIND))
    register_plan_check(KIND, refuse_large_models)
    CALLS.clear()
    yield
    ROUND_KINDS.pop(KIND, None)
    PLAN_CHECKS.pop(KIND, None)


def test_a_kinds_plan_check_is_met_by_the_plan_the_aggregator_plan_show_and_a_site(
    tmp_path: Path, toy_checked: None, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = new_workspace(tmp_path, NAMES, secure_aggregation={"round_kind": KIND})
    plan = load_aggregator_plan(workspace.plan)
    assert CALLS == [(3, str(workspace.plan), None)]  # as the plan loads: no model is built yet
    refused = f"the toy kind holds at most {MOST} numbers, not {ADULT_LOGREG}; train a smaller model"

    # plan show builds the model and refuses it, naming the plan.
    assert cli.main(["plan", "show", "--plan", str(workspace.plan)]) != 0
    assert f"{workspace.plan}: {refused}" in capsys.readouterr().err

    # The aggregator, over its real TLS server, before round 1: no round runs, nothing is checkpointed.
    with pytest.raises(ConfigError, match=f"{workspace.plan}: {refused}"):
        run_aggregator(plan)
    assert CALLS[-1] == (3, str(workspace.plan), ADULT_LOGREG)
    assert not (plan.aggregator.output / CHECKPOINT_NAME).exists()

    # A site, as the plan arrives (no model: passes) and once its model is built (refuses, plan-mismatch).
    shared = load_shared_settings(shared_settings(plan))
    check_plan_fits(shared, None)
    with pytest.raises(PermanentFailureError) as caught:
        check_plan_fits(shared, ADULT_LOGREG)
    assert caught.value.failure is PLAN_MISMATCH
    assert f"the aggregator's plan: {refused}" in str(caught.value)
    assert CALLS[-2:] == [(3, "the aggregator's plan", None), (3, "the aggregator's plan", ADULT_LOGREG)]


def test_a_kind_registers_its_plan_check_once() -> None:
    with pytest.raises(ConfigError, match="registered its plan check already"):
        register_plan_check(BOUNDED_ROUND.name, refuse_large_models)
    assert PLAN_CHECKS[BOUNDED_ROUND.name] is check_bounded_plan


def test_a_kind_without_a_check_runs_every_plan_at_every_size() -> None:
    check_plan_at_size(aggregator_plan(), 3, "plan.toml", 10**9)  # the masked round holds any model


def test_a_site_whose_model_the_bounded_rounds_field_cannot_hold_refuses_before_round_1(tmp_path: Path) -> None:
    """At the largest bound the field holds (B = 3,355,442 in the encoded scale) the range tests fit 33,554,431
    coordinates. A site's own two-layer model of 107 x 307,839 + ... numbers makes the round 33,554,453 long: the
    site refuses it once built (plan-mismatch, the aggregator's words) rather than failing every round's proof;
    as the plan arrives (no model yet) the bound alone fits, and a model one hidden unit smaller fits too."""
    bound = largest_bound()
    most = largest_dimension(bound * bound)
    hidden = 307_839  # 107 h + h + h + 1 numbers, plus c: 109 h + 2 coordinates a round
    assert 109 * (hidden - 1) + 2 <= most < 109 * hidden + 2
    workspace = new_workspace(tmp_path, NAMES)
    config_path = workspace.configs["site-a"]
    config_path.write_text(config_path.read_text() + f'\n[model]\nfactories = ["{FACTORY}"]\n')
    config = load_collaborator_config(config_path)
    plan = declared(
        aggregator_plan(
            model={"name": ..., "factory": FACTORY, "arguments": {"features": 107, "hidden": hidden}},
            influence={"update_norm": bound / 2**20},  # weight 1 at the template's 20 fractional bits
        )
    )
    shared = load_shared_settings(shared_settings(plan))
    check_plan_fits(shared, None)  # as the plan arrives
    check_plan_fits(shared, 109 * (hidden - 1) + 1)  # one hidden unit fewer
    data = load_local_data(config, shared)
    with pytest.raises(PermanentFailureError) as caught:
        prepare(config, data, shared, torch.device("cpu"), round_trainer)
    said = str(caught.value)
    assert caught.value.failure is PLAN_MISMATCH and "\n" not in said
    # The aggregator's message, word for word, where it names its own plan.
    with pytest.raises(ConfigError) as aggregator:
        check_plan_at_size(plan, 3, "the aggregator's plan", 109 * hidden + 1)
    assert str(aggregator.value) in said, said
    assert f"the model's dimension {109 * hidden + 2:,}" in said and f"at most {most:,} coordinates" in said
    assert "train a smaller model" in said
