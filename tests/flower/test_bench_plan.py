"""benchmarks/flower_bench.py's fedfair side runs Algorithm 1, as the Flower strategy does: no update is bounded."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples" / "flower-fedsrcvar"))
from flower_bench import Settings, fedfair_workspace  # noqa: E402
from fedsrcvar_app.task import adult_by_race, model  # noqa: E402

from fedfair.core.update import bounded  # noqa: E402
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan  # noqa: E402
from fedfair.runtime.plan.training import default_update_norm  # noqa: E402
from fedfair.simulation.federation import federation_from_clients  # noqa: E402
from fedfair.simulation.rounds import make_learners, run_fedsrcvar  # noqa: E402

pytestmark = pytest.mark.slow

ROUND = 100
"""Where c reaches the losses in the bench's federation and the smallest site's update first outgrows 2 lr tau."""


def test_the_bench_plan_bounds_no_update_of_the_round_where_the_default_bound_parted_the_two_systems(
    tmp_path: Path,
) -> None:
    plan = load_aggregator_plan(fedfair_workspace(Settings(rounds=200, batch_fraction=0.03), tmp_path, False).plan)
    assert plan.training.server_momentum == 0.0 and plan.influence.weights == "declared"
    federation = federation_from_clients([train for train, _ in adult_by_race()])
    # Each site's agreed weight is the b_k it trains on, as the Flower strategy weights it.
    _, learners = make_learners(federation, plan.training, plan.objective, model_factory=model)
    assert [plan.influence.weight_of(name, 0.03) for name in plan.collaborators] == [
        learner.batch_size for learner in learners
    ]
    before = run_fedsrcvar(
        federation, plan.objective, dataclasses.replace(plan.training, rounds=ROUND - 1), model_factory=model
    ).state
    for learner in learners:  # to round ROUND's batch, as the federation's own learners stand there
        for _ in range(ROUND - 1):
            learner.sampler.next_batch()
    updates = [learner.train_round(before.theta, before.c) for learner in learners]
    longest = max(
        float(torch.cat([update.delta.double(), torch.tensor([update.delta_c], dtype=torch.double)]).norm())
        for update in updates
    )
    # The plan's default bound would scale this round's longest update (0.29 against C = 0.2), the bench's does not.
    assert longest > default_update_norm(plan.training)
    for update in updates:
        kept = bounded(update, update.weight, plan.influence.update_norm)
        assert torch.equal(kept.delta, update.delta) and kept.delta_c == update.delta_c
