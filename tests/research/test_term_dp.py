"""TERM under distributed DP (`fedfair.research.term_dp`): its step is TERM's tilted step, one record moves the
released vector by at most the calibrated bound, and its accountant spends what FedSRCVaR's exact computation
says for that bound."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.errors import ConfigError
from fedfair.core.models import build_model, flat_parameters, load_flat_parameters
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.calibration import record_sensitivity
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.distributed import padded_dimension, training_noise
from fedfair.privacy.learner import PrivateLearner
from fedfair.research import term_dp
from fedfair.research.experiment import ExperimentConfig
from fedfair.research.methods import secure_sum, settings_for
from fedfair.research.task import Task
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import SimulationOptions, make_learners

DELTA = 1e-5


def dp_task(federation: Federation, *, lr: float, clip: float, rounds: int, batch_size: int = 0) -> Task:
    """TERM's task under distributed DP at epsilon 1 on `federation`: one local step, plain server step."""
    training = TrainingConfig(
        rounds=rounds, batch_size=batch_size, local=LocalConfig(local_steps=1, lr=lr), server_momentum=0.0
    )
    privacy = PrivacyConfig(enabled=True, target_epsilon=1.0, delta=DELTA, max_grad_norm=clip, mode="distributed")
    options = SimulationOptions(model="logreg", dtype="float64")
    return Task(federation, ObjectiveConfig(), training, privacy, options=options, secure_aggregation=True)


def test_without_noise_and_with_a_large_clip_each_round_is_terms_exact_tilted_step(
    small_adult_federation: Federation,
) -> None:
    """Every record sampled (full batches: rate 1), nothing clipped (C 1e6) and the sum in the clear: each round
    the server moves by -lr sum_i w_i grad l_i / sum_i w_i over every record, w_i = exp(t min(l_i, L)).

    To float64 rounding but for the clip's guard: a record's weight w <= 1 is scaled by 1 / (w + 1e-6) clamped at
    1, so the normaliser, and so the step, is off by a relative 1e-6 at most. The rounds reach losses above L,
    where the clipped weights differ from TERM's exp(t l_i)."""
    lr, tilt, rounds = 3.0, 3.0, 4
    states: list[torch.Tensor] = []
    task = dataclasses.replace(
        dp_task(small_adult_federation, lr=lr, clip=1e6, rounds=rounds),
        on_round=lambda state: states.append(state.theta.detach().clone()),
    )
    template, learners = make_learners(small_adult_federation, task.training, None, options=task.options)
    theta = flat_parameters(template).detach().clone()  # the seeded start the run's template takes too
    term_dp.run_term_dp(task, tilt, term_dp.term_plan(task), None)

    pooled = small_adult_federation.pooled("train")
    clipped = 0
    for after in states:
        load_flat_parameters(template, theta)
        template.zero_grad()
        losses = learners[0].loss(template(pooled.features.double()), pooled.labels)
        clipped += int((losses > term_dp.LOSS_CLIP).sum())
        weights = torch.exp(tilt * losses.detach().clamp(max=term_dp.LOSS_CLIP))
        (weights * losses).sum().div(weights.sum()).backward()
        gradient = torch.cat([parameter.grad.flatten() for parameter in template.parameters()])
        torch.testing.assert_close(after - theta, -lr * gradient, rtol=2e-6, atol=1e-12)
        theta = after
    assert len(states) == rounds and clipped > 0


@settings(max_examples=20, deadline=None)
@given(
    features=st.lists(st.floats(-50.0, 50.0), min_size=6, max_size=6),
    label=st.integers(0, 1),
    scale=st.floats(0.0, 30.0),
    tilt=st.floats(0.1, 1000.0),
    clip=st.floats(0.01, 50.0),
    lr=st.floats(1e-4, 1.0),
)
def test_one_record_moves_the_released_vector_by_at_most_the_calibrated_bound(
    features: list[float], label: int, scale: float, tilt: float, clip: float, lr: float
) -> None:
    """A site holding one record, sampled at rate 1: its weighted vector b [delta, delta_c] is that record's whole
    contribution to the sum, and its L2 norm is at most the sensitivity the noise is calibrated to,
    (lr / b) sqrt(C^2 + (lr C / lr)^2), whatever the record, the model and the tilt."""
    torch.manual_seed(0)
    model = build_model("mlp", 6, 2, dtype=torch.float64)
    load_flat_parameters(model, flat_parameters(model).detach() * scale)
    training = term_dp.dp_training(TrainingConfig(local=LocalConfig(local_steps=1, lr=lr)), clip)
    head = RCVaRThreshold(term_dp.NORMALISER, c=term_dp.NORMALISER_START, dtype=torch.float64)
    learner = term_dp.DPTERMLearner(
        model, torch.tensor([features], dtype=torch.float64), torch.tensor([label]), 1, training.local, threshold=head
    )
    learner.tilt = tilt
    privacy = PrivacyConfig(
        enabled=True,
        target_epsilon=1.0,
        delta=DELTA,
        max_grad_norm=clip,
        mode="distributed",
        sample_rate=1.0,
        threshold_max_grad_norm=1.0,
    )
    private = PrivateLearner(learner, privacy, planned_rounds=1)
    update = private.train_round(flat_parameters(model).detach(), term_dp.NORMALISER_START)
    moved = update.weight * math.hypot(float(update.delta.norm()), update.delta_c)
    bound = private.distributed_noise.sensitivity if private.distributed_noise is not None else math.nan
    assert bound == pytest.approx(lr * math.sqrt(2.0) * clip, rel=1e-12)
    assert moved <= bound * (1.0 + 1e-9)
    assert 0.0 <= update.delta_c <= training.local.threshold_lr  # lr C w, w in [0, 1] (0: exp underflows)


def test_the_accountant_spends_what_fedsrcvars_exact_computation_gives_for_the_bound(
    small_adult_federation: Federation,
) -> None:
    """Through the real secure sum, every site's epsilon is `training_noise`'s for one record's bound
    sqrt((lr C)^2 + (lr C * 1)^2), the plan's rate, the rounds and the rotated dimension: the computation
    FedSRCVaR's distributed accounting is tested against (tests/privacy/test_learner.py), here at epsilon 1."""
    lr, clip, rounds = 0.05, 2.0, 3
    task = dp_task(small_adult_federation, lr=lr, clip=clip, rounds=rounds, batch_size=64)
    plan = term_dp.term_plan(task)
    summed = secure_sum(small_adult_federation, plan)
    result = term_dp.run_term_dp(task, 2.0, plan, summed)
    rate = 64 / sum(client.size for client in small_adult_federation.train)
    dimension = padded_dimension(small_adult_federation.num_features + 1 + 1)  # logreg's weights, bias, then c
    noise = training_noise(1.0, DELTA, record_sensitivity(lr, lr * clip, clip, 1.0), rate, rounds, dimension)
    for report in result.privacy.values():
        assert report["epsilon"] == pytest.approx(noise.epsilon(rounds, DELTA), rel=1e-12)
        assert report["steps"] == rounds
    assert noise.epsilon(rounds, DELTA) == pytest.approx(1.0, abs=2e-3)
    assert result.noise["epsilon"] == pytest.approx(noise.epsilon(rounds, DELTA), rel=1e-12)
    assert result.noise["noise_std"] > 0.0


def test_term_trains_under_distributed_dp_only() -> None:
    """Local DP-SGD is not built for TERM's weights: the flags are refused with the fix."""
    local = PrivacyConfig(enabled=True, target_epsilon=1.0, mode="local")
    with pytest.raises(ConfigError, match="DP-SGD is available for"):
        ExperimentConfig(method="term", settings=settings_for("term", {}), privacy=local)


def test_secure_aggregation_without_dp_is_refused_where_the_secure_sum_is_the_dp_mechanism() -> None:
    """TERM, PropFair and Delta-FL sum securely only under their DP; alone the flag would have run in the clear."""
    for method in ("term", "propfair", "deltafl"):
        with pytest.raises(ConfigError, match="add --dp-mode distributed"):
            ExperimentConfig(method=method, settings=settings_for(method, {}), clients=3, secure_aggregation=True)
    ExperimentConfig(method="fedsrcvar", settings=settings_for("fedsrcvar", {}), clients=3, secure_aggregation=True)
