"""A new user's first federation: the `fedfair init` plan's defaults on three patient tables with a rare category.

The plan `fedfair init` writes (the committed template's text, read by the plan reader) trains FedSRCVaR
with its objective, steps, server momentum, rounds and batches, here in process. Its output model must
not leave the worst-off 30% of held-out patients worse off than a coin flip (the uniform classifier's
ln 2), and must have improved on them between round 5 and round 50.

That held-out property is one of the table's draw as much as of the optimiser: on these tables (seed 0)
Algorithm 1's step passes it too (0.691 at round 5, 0.674 at round 50), and on another draw (seed 2) the
objective's exact optimum is itself above ln 2 on the held-out rows (0.699; the defaults reach 0.716,
and the report's warning is what the user gets). What the defaults changed is how fast the objective is
fitted, so the second test holds that: within 50 rounds the training RCVaR is within 2% of the
centralised optimum on three draws, where Algorithm 1's step is 2.7% to 3.9% above it.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib

import numpy as np
import pytest
import torch

from fedfair.core.config import ObjectiveConfig, TrainingConfig
from fedfair.core.evaluation import evaluate
from fedfair.core.models import build_model
from fedfair.core.objective import rcvar
from fedfair.core.server import ServerState
from fedfair.fairness import pooled
from fedfair.research.reference import solve_reference
from fedfair.runtime.plan.learning_settings import read_learning
from fedfair.runtime.plan.template_base import DEMO
from fedfair.runtime.plan.templates import render_plan
from fedfair.simulation.federation import Federation, federation_from_arrays
from fedfair.simulation.rounds import run_fedsrcvar

SITES = ((30_000, 0.0), (3_000, 8.0), (1_600, -8.0))
"""Rows and age shift of each site: one large hospital and two small ones (the template's size example)."""
RARE = 0.03
"""The share of patients in the rare category, whose outcome runs against age."""


def _patients(generator: np.random.Generator, rows: int, shift: float) -> tuple[np.ndarray, ...]:
    age = generator.normal(50.0 + shift, 15.0, rows)
    bmi = generator.normal(27.0 - shift / 5.0, 5.0, rows)
    category = generator.choice(3, rows, p=[0.62, 0.35, RARE])
    logit = 3.0 * (age - 50.0) / 15.0 + 1.5 * (bmi - 27.0) / 5.0 - np.where(category == 1, 1.0, 0.0)
    logit += np.where(category == 2, 2.5 - 6.0 * (age - 50.0) / 15.0, 0.0)
    labels = (generator.random(rows) < 1.0 / (1.0 + np.exp(-2.5 * logit))).astype(np.int64)
    return age, bmi, category, labels


def patient_tables(seed: int) -> Federation:
    """Three sites' tables, encoded as the plan's [schema] would: numbers standardised over all sites, the
    category one-hot; a third of each site's size again held out."""
    generator = np.random.default_rng(seed)
    train = [_patients(generator, rows, shift) for rows, shift in SITES]
    test = [_patients(generator, rows // 3, shift) for rows, shift in SITES]
    ages, bmis = np.concatenate([part[0] for part in train]), np.concatenate([part[1] for part in train])

    def encoded(part: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
        age, bmi, category, labels = part
        columns = [(age - ages.mean()) / ages.std(), (bmi - bmis.mean()) / bmis.std(), np.eye(3)[category]]
        return np.column_stack(columns).astype(np.float32), labels

    names = [f"hospital-{letter}" for letter in "abc"]
    return federation_from_arrays(names, [encoded(part) for part in train], [encoded(part) for part in test], 2)


def _init_plan(server_momentum: float | None = None) -> tuple[ObjectiveConfig, TrainingConfig]:
    """`fedfair init`'s objective and training (`server_momentum`: the plan's unless given)."""
    settings = read_learning("plan.toml", tomllib.loads(render_plan(DEMO)), len(DEMO.sites))
    plan = settings.training
    assert plan.rounds == 50, "the acceptance is stated for the template's 50 rounds"
    momentum = plan.server_momentum if server_momentum is None else server_momentum
    return settings.objective, dataclasses.replace(plan, server_momentum=momentum)


@pytest.mark.slow
def test_init_defaults_leave_the_worst_off_better_served_than_guessing() -> None:
    objective, plan = _init_plan()
    federation = patient_tables(seed=0)
    model = build_model("logreg", federation.num_features, 2, seed=plan.seed)
    held_out = federation.pooled("test")
    worst: dict[int, float] = {}

    def judge(state: ServerState) -> None:
        if state.round in (5, plan.rounds):
            losses = evaluate(model, state.theta_average, held_out).losses
            worst[state.round] = pooled.group_risk_report(losses, np.ones_like(losses), objective.rho).worst_risk

    torch.manual_seed(0)
    run_fedsrcvar(federation, objective, plan, on_round=judge)
    assert worst[plan.rounds] < math.log(2), worst
    assert worst[plan.rounds] < worst[5], worst


FITTED = 0.02
"""How far above the centralised optimum of the training RCVaR the 50-round output may end, relatively. The
defaults end 0.55%, 1.1% and 0.71% above it on the three draws, Algorithm 1's step 3.9%, 2.7% and 2.9%."""


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_init_defaults_fit_the_objective_in_50_rounds_where_algorithm_ones_step_does_not(seed: int) -> None:
    """Logistic regression makes the smoothed RCVaR convex, so L-BFGS-B on the pooled rows gives its optimum
    (`solve_reference`); the exact RCVaR of the plan's output is compared with the exact RCVaR there."""
    federation = patient_tables(seed=seed)
    objective, _ = _init_plan()
    optimum = solve_reference(federation, objective).objective_exact
    train = federation.pooled("train")
    model = build_model("logreg", federation.num_features, 2, seed=0)
    gaps = {}
    for momentum in (None, 0.0):
        _, training = _init_plan(momentum)
        torch.manual_seed(0)
        output = run_fedsrcvar(federation, objective, training).state.theta_average
        gaps[momentum] = rcvar(evaluate(model, output, train).losses, objective.epsilon, objective.rho) / optimum - 1
    assert 0.0 <= gaps[None] < FITTED, gaps
    assert gaps[0.0] > FITTED, f"the bar no longer tells the defaults from Algorithm 1's step: {gaps}"
