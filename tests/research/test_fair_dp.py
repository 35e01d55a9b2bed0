"""PropFair and Delta-FL under distributed DP (`fedfair.research.fair_dp`): each round is the method's exact step at
the clipped losses without noise, one record moves a site's released loss by at most L / n_k, and each site's
accountant spends what the exact composition of its two releases gives."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.errors import ConfigError
from fedfair.core.models import flat_parameters, load_flat_parameters
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.distributed import (
    ORDERS,
    epsilon,
    epsilon_from_rdp,
    padded_dimension,
    skellam_rdp,
    subsampled_rdp,
)
from fedfair.privacy.rounding import expected_rounding_rdp
from fedfair.research import fair_dp
from fedfair.research.experiment import ExperimentConfig
from fedfair.research.fairness_baselines import DeltaFLSettings, superquantile_weights
from fedfair.research.methods import secure_sum
from fedfair.research.task import Task
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import SimulationOptions, make_learners

DELTA = 1e-5


def dp_task(
    federation: Federation, *, lr: float, clip: float, rounds: int, batch_size: int = 0, model: str = "logreg"
) -> Task:
    """A task under distributed DP at epsilon 1 on `federation`: one local step, plain server step, float64."""
    training = TrainingConfig(
        rounds=rounds, batch_size=batch_size, local=LocalConfig(local_steps=1, lr=lr), server_momentum=0.0
    )
    privacy = PrivacyConfig(enabled=True, target_epsilon=1.0, delta=DELTA, max_grad_norm=clip, mode="distributed")
    options = SimulationOptions(model=model, dtype="float64")
    return Task(federation, ObjectiveConfig(rho=0.1), training, privacy, options=options, secure_aggregation=True)


Weigh = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""The method's exact site weights q_k from the clipped mean losses and the shares p_k: its step is -lr sum q_k g_k."""


def exact_steps(
    federation: Federation, factors: Weigh, weigh: Weigh, slope: float, lr: float = 1.0, rounds: int = 4
) -> tuple[int, list[float]]:
    """Runs `factors` without noise, full batches and no clipping, and checks each round against -lr sum_k q_k
    grad F_k(theta_t), q = `weigh` at the mean clipped losses; returns how many records' losses were clipped and
    the sites' mean clipped losses, every round.

    Full batches make every site's step its exact mean gradient, and the ratios r_k times the max factor give back
    p_k factor_k: float64 rounding only, but for the grid. Each record's clipped loss is released on the grid of
    step L / U, so a released mean is within L / (2U) of the exact one and a weight q_k within `slope` p_k times
    that (`slope` bounds |dq_k / dF_k| / p_k): each coordinate within lr (L / 2U) slope sum_k p_k |grad F_k|.
    The MLP's seeded start gives the sites distinct losses from the first round (logistic regression starts at 0,
    where they tie at ln 2 and the superquantile's order is any)."""
    states: list[torch.Tensor] = []
    task = dataclasses.replace(
        dp_task(federation, lr=lr, clip=1e6, rounds=rounds, model="mlp"),
        on_round=lambda state: states.append(state.theta.clone()),
    )
    template, learners = make_learners(federation, task.training, None, options=task.options)
    theta = flat_parameters(template).detach().clone()  # the seeded start the run's template takes too
    fair_dp.run_fair_dp(task, factors, fair_dp.fair_plan(task), None)
    sizes = np.array([client.size for client in federation.train], dtype=np.float64)
    clipped, seen = 0, []
    for after in states:
        load_flat_parameters(template, theta)
        means, gradients = [], []
        for client in federation.train:
            template.zero_grad()
            losses = learners[0].loss(template(client.features.double()), client.labels)
            clipped += int((losses > fair_dp.LOSS_CLIP).sum())
            means.append(float(losses.detach().clamp(max=fair_dp.LOSS_CLIP).mean()))
            losses.mean().backward()
            gradients.append(torch.cat([parameter.grad.flatten() for parameter in template.parameters()]))
        seen += means
        shares = sizes / sizes.sum()
        weights = weigh(np.array(means), shares)
        expected = -lr * sum(float(weight) * gradient for weight, gradient in zip(weights, gradients, strict=True))
        grid = lr * fair_dp.LOSS_CLIP / (2 * fair_dp.LOSS_UNITS) * slope
        bound = grid * sum(float(share) * gradient.abs() for share, gradient in zip(shares, gradients, strict=True))
        assert ((after - theta - expected).abs() <= bound + 1e-9 * expected.abs() + 1e-12).all()
        theta = after
    assert len(states) == rounds
    return clipped, seen


def test_without_noise_each_round_is_delta_fls_exact_superquantile_step(small_adult_federation: Federation) -> None:
    """-lr sum_k pi_k grad F_k, pi the superquantile weights at level 0.3 of the clipped mean losses over the shares
    n_k / n; the rounds reach losses above L."""
    level = 0.3
    clipped, _ = exact_steps(
        small_adult_federation,
        fair_dp.deltafl_factors(level),
        lambda losses, shares: superquantile_weights(losses, shares, level),
        slope=0.0,  # the weights are constant in the losses while their order holds
    )
    assert clipped > 0


def test_without_noise_each_round_is_propfairs_exact_full_gradient_step(small_adult_federation: Federation) -> None:
    """-lr sum_k p_k grad F_k / (M - F_k) at the clipped mean losses; M 0.85 puts some sites' rounds on the margin's
    linear piece (M - F_k below 0.2), where the factor is 1 / margin, and others on the logarithm's."""
    ceiling = 0.85
    clipped, seen = exact_steps(
        small_adult_federation,
        fair_dp.propfair_factors(ceiling),
        lambda losses, shares: shares / np.maximum(ceiling - losses, fair_dp.PROPFAIR_MARGIN),
        slope=1.0 / fair_dp.PROPFAIR_MARGIN**2,  # d/dF of 1 / max(M - F, margin) is at most 1 / margin^2
    )
    gaps = ceiling - np.array(seen)
    assert clipped > 0 and (gaps < fair_dp.PROPFAIR_MARGIN).any() and (gaps > fair_dp.PROPFAIR_MARGIN).any()


@settings(max_examples=50, deadline=None)
@given(
    losses=st.lists(st.floats(0.0, 50.0), min_size=1, max_size=40),
    removed=st.integers(0, 39),
    size=st.integers(40, 10_000),
)
def test_one_record_moves_a_sites_released_loss_by_at_most_l_over_n(
    losses: list[float], removed: int, size: int
) -> None:
    """Add/remove one record, n_k public (the plan's): the released mean moves by at most L / n_k, whatever the losses
    (above L or not), and the encoded sum, which the noise covers, by at most U."""
    records = np.array(losses)
    without = np.delete(records, removed % records.size)
    moved = abs(fair_dp.released_loss(records, size, 0.0) - fair_dp.released_loss(without, size, 0.0))
    assert moved <= fair_dp.LOSS_CLIP / size * (1.0 + 1e-12)
    assert abs(fair_dp.encoded_loss_sum(records) - fair_dp.encoded_loss_sum(without)) <= fair_dp.LOSS_UNITS


def test_the_accountant_spends_the_exact_composition_of_both_releases_and_the_target(
    small_adult_federation: Federation,
) -> None:
    """Through the real secure sum, every site's epsilon is the RDP of its training steps (subsampled Skellam,
    rounding charged in expectation) plus that of its loss releases (Skellam, every record, sensitivity U), summed
    at each order and converted: computed here from the formulas, not by the accountant's curve; and it is the
    target 1, to the calibration's tolerance. The loss releases alone spend `LOSS_SHARE` of it."""
    lr, clip, rounds = 0.05, 2.0, 3
    task = dp_task(small_adult_federation, lr=lr, clip=clip, rounds=rounds, batch_size=64)
    plan = fair_dp.fair_plan(task)
    summed = secure_sum(small_adult_federation, plan)
    result = fair_dp.run_fair_dp(task, fair_dp.deltafl_factors(0.5), plan, summed)
    noise = summed.training_noise
    assert noise is not None
    training, losses = noise.release, plan.beside[0]
    rate = 64 / sum(client.size for client in small_adult_federation.train)
    assert training.sampling_rate == pytest.approx(rate, rel=1e-12)
    assert training.rounding == padded_dimension(small_adult_federation.num_features + 1 + 1)  # weights, bias, c
    assert (losses.l1, losses.l2, losses.sampling_rate) == (fair_dp.LOSS_UNITS, fair_dp.LOSS_UNITS, 1.0)

    def steps_rdp(order: int) -> float:
        return float(
            expected_rounding_rdp(np.array([order]), training.mu, training.l1, training.l2, training.rounding)[0]
        )

    curve = np.array(
        [
            rounds * subsampled_rdp(steps_rdp, rate, order)
            + rounds * skellam_rdp(order, losses.mu, losses.l1, losses.l2)
            for order in ORDERS
        ]
    )
    exact = epsilon_from_rdp(curve, DELTA - noise.addon)
    for report in result.privacy.values():
        assert report["epsilon"] == pytest.approx(exact, rel=1e-9)
        assert report["steps"] == rounds
    assert result.noise["epsilon"] == pytest.approx(exact, rel=1e-9)
    assert exact == pytest.approx(1.0, abs=2e-3)
    alone = epsilon([losses], DELTA)
    assert alone == pytest.approx(fair_dp.LOSS_SHARE, rel=2e-3)
    # The training's noise is larger than it would be alone: the releases' share of the budget costs it.
    assert epsilon([dataclasses.replace(training, steps=rounds)], DELTA - noise.addon) < exact - 1e-3


def test_delta_fl_under_dp_reads_every_record_and_refuses_loss_rows(small_adult_federation: Federation) -> None:
    from fedfair.research.methods import METHODS

    task = dp_task(small_adult_federation, lr=0.01, clip=1.0, rounds=1)
    with pytest.raises(ConfigError, match="drop --loss-rows"):
        METHODS["deltafl"].run(task, DeltaFLSettings(client_level=0.5, loss_rows=10))


def test_propfair_and_delta_fl_train_under_distributed_dp_only() -> None:
    """Local DP-SGD is not built for their site weights: the flags are refused with the fix."""
    local = PrivacyConfig(enabled=True, target_epsilon=1.0, mode="local")
    for method in ("propfair", "deltafl"):
        from fedfair.research.methods import settings_for

        with pytest.raises(ConfigError, match="DP-SGD is available for"):
            ExperimentConfig(method=method, settings=settings_for(method, {}), privacy=local)
