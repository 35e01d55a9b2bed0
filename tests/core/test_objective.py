"""Properties of the RCVaR objective that the paper's analysis relies on.

Random loss vectors here test mathematics only (no dataset is claimed).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.config import ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.core.models import per_sample_loss
from fedfair.core.objective import (
    SMOOTH_PLUS_FUNCTIONS,
    RCVaRLoss,
    RCVaRThreshold,
    cvar,
    cvar_threshold,
    make_smooth_plus,
    rcvar,
    rcvar_per_sample,
    smoothed_rcvar_per_sample,
)

finite = st.floats(min_value=-50.0, max_value=50.0, allow_nan=False)
gammas = st.floats(min_value=1e-3, max_value=2.0)
names = st.sampled_from(sorted(SMOOTH_PLUS_FUNCTIONS))
loss_vectors = st.lists(st.floats(min_value=0.0, max_value=20.0), min_size=1, max_size=60)
rhos = st.floats(min_value=0.01, max_value=1.0)


@given(name=names, gamma=gammas, x=finite)
def test_gap_between_smooth_and_exact_plus_is_within_gamma(name: str, gamma: float, x: float) -> None:
    s = make_smooth_plus(name, gamma)
    value = torch.tensor(x, dtype=torch.float64)
    gap = float(s(value)) - max(x, 0.0)
    assert -1e-12 <= gap <= s.max_gap + 1e-12
    assert s.max_gap <= gamma


@given(name=names, gamma=gammas)
def test_max_gap_is_attained(name: str, gamma: float) -> None:
    s = make_smooth_plus(name, gamma)
    grid = torch.linspace(-5 * gamma, 5 * gamma, 20001, dtype=torch.float64)
    gaps = s(grid) - grid.clamp(min=0.0)
    assert float(gaps.max()) == pytest.approx(s.max_gap, rel=1e-6)


@given(name=names, gamma=gammas, x=finite, y=finite, t=st.floats(min_value=0.0, max_value=1.0))
def test_convexity(name: str, gamma: float, x: float, y: float, t: float) -> None:
    s = make_smooth_plus(name, gamma)
    a, b = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    mixed = float(s(t * a + (1 - t) * b))
    assert mixed <= t * float(s(a)) + (1 - t) * float(s(b)) + 1e-9 * (1 + abs(x) + abs(y))


@given(name=names, gamma=gammas, x=finite, y=finite)
def test_derivative_is_in_unit_interval_and_two_over_gamma_lipschitz(
    name: str, gamma: float, x: float, y: float
) -> None:
    s = make_smooth_plus(name, gamma)
    a, b = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    da, db = float(s.derivative(a)), float(s.derivative(b))
    assert 0.0 <= da <= 1.0 and 0.0 <= db <= 1.0
    assert abs(da - db) <= 2.0 / gamma * abs(x - y) + 1e-12


@pytest.mark.parametrize("name", sorted(SMOOTH_PLUS_FUNCTIONS))
def test_derivative_matches_autograd(name: str) -> None:
    s = make_smooth_plus(name, 0.1)
    x = torch.linspace(-1, 1, 401, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(s(x).sum(), x)
    torch.testing.assert_close(grad, s.derivative(x.detach()), rtol=0, atol=1e-12)


def brute_force_cvar(losses: list[float], rho: float) -> float:
    """min over candidate c of c + mean((l - c)+) / rho; the minimum is at a sample value (piecewise linear)."""
    values = np.asarray(losses)
    return min(c + np.maximum(values - c, 0.0).mean() / rho for c in values)


@given(losses=loss_vectors, rho=rhos)
def test_cvar_equals_minimum_over_threshold(losses: list[float], rho: float) -> None:
    expected = brute_force_cvar(losses, rho)
    assert cvar(losses, rho) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    c = cvar_threshold(losses, rho)
    at_c = c + np.maximum(np.asarray(losses) - c, 0.0).mean() / rho
    assert at_c == pytest.approx(expected, rel=1e-12, abs=1e-12)


@given(losses=loss_vectors, epsilon=st.floats(min_value=0.0, max_value=1.0))
def test_rho_one_and_epsilon_one_reduce_to_the_mean(losses: list[float], epsilon: float) -> None:
    mean = float(np.mean(losses))
    assert cvar(losses, 1.0) == pytest.approx(mean, rel=1e-12, abs=1e-12)
    assert rcvar(losses, epsilon, 1.0) == pytest.approx(mean, rel=1e-12, abs=1e-12)
    assert rcvar(losses, 1.0, 0.1) == pytest.approx(mean, rel=1e-12, abs=1e-12)


def test_cvar_fractional_boundary_weight() -> None:
    # Worst 30% of five samples is 1.5 samples: all of 5 and half of 4.
    assert cvar([1, 2, 3, 4, 5], 0.3) == pytest.approx((5 + 0.5 * 4) / 1.5)
    assert cvar_threshold([1, 2, 3, 4, 5], 0.3) == 4.0


@settings(deadline=None)  # a pure property; a loaded CI machine must not fail it on time
@given(losses=loss_vectors, rho=rhos, epsilon=st.floats(min_value=0.0, max_value=1.0), c=st.floats(0.0, 20.0))
def test_smoothed_objective_sandwich(losses: list[float], rho: float, epsilon: float, c: float) -> None:
    """f <= f_smooth <= f + (1 - eps) * gap / rho, per sample (the paper's Lemma)."""
    s = make_smooth_plus("softrelu", 0.05)
    values = torch.tensor(losses, dtype=torch.float64)
    exact = rcvar_per_sample(values, c, epsilon, rho)
    smooth = smoothed_rcvar_per_sample(values, c, epsilon, rho, s)
    assert bool((smooth >= exact - 1e-12).all())
    assert bool((smooth <= exact + (1 - epsilon) * s.max_gap / rho + 1e-12).all())


@given(losses=loss_vectors, rho=rhos, epsilon=st.floats(min_value=0.0, max_value=1.0))
def test_mean_exact_objective_at_optimal_c_is_rcvar(losses: list[float], rho: float, epsilon: float) -> None:
    c = cvar_threshold(losses, rho)
    values = torch.tensor(losses, dtype=torch.float64)
    assert float(rcvar_per_sample(values, c, epsilon, rho).mean()) == pytest.approx(
        rcvar(losses, epsilon, rho), rel=1e-12, abs=1e-12
    )


def test_threshold_module_gradient_of_c_matches_formula() -> None:
    config = ObjectiveConfig(epsilon=0.2, rho=0.25, bound=5.0)
    head = RCVaRThreshold(config, c=0.7, dtype=torch.float64)
    losses = torch.linspace(0.0, 2.0, 41, dtype=torch.float64)
    (grad,) = torch.autograd.grad(head(losses).sum(), head.c)
    assert float(grad) == pytest.approx(float(head.grad_c_per_sample(losses).detach().sum()), rel=1e-12)


def test_threshold_projection_keeps_c_in_bounds() -> None:
    head = RCVaRThreshold(ObjectiveConfig(bound=2.0), c=3.5)
    head.project()
    assert float(head.c.detach()) == 2.0
    with torch.no_grad():
        head.c.fill_(-1.0)
    head.project()
    assert float(head.c.detach()) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"rho": 0.0}, "rho must be in (0, 1]"),
        ({"rho": 1.5}, "rho must be in (0, 1]"),
        ({"epsilon": -0.1}, "epsilon must be in [0, 1]"),
        ({"epsilon": 1.1}, "epsilon must be in [0, 1]"),
        ({"gamma": 0.0}, "gamma must be a positive number"),
        ({"gamma": math.nan}, "gamma must be a positive number"),
        ({"bound": 0.0}, "bound must be a positive number"),
        ({"smooth": "relu"}, "unknown smooth plus function"),
    ],
)
def test_invalid_objective_settings_are_refused(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        ObjectiveConfig(**kwargs)


@settings(max_examples=25)
@given(losses=loss_vectors)
def test_cvar_is_monotone_in_rho(losses: list[float]) -> None:
    values = [cvar(losses, rho) for rho in (0.1, 0.3, 0.6, 1.0)]
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(values))


@pytest.mark.parametrize("name", sorted(SMOOTH_PLUS_FUNCTIONS))
def test_rcvar_loss_has_the_core_objectives_gradient_in_theta_and_c(name: str) -> None:
    """The loss module is the per-sample objective FedSRCVaR trains, averaged: same value, same gradient."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(64, 5, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 3, (64,), generator=generator)
    model = torch.nn.Linear(5, 3).double()
    criterion = RCVaRLoss(rho=0.2, epsilon=0.3, gamma=0.1, smooth=name, bound=4.0, c=0.9, dtype=torch.float64)
    assert [parameter is criterion.head.c for parameter in criterion.parameters()] == [True]

    value = criterion(per_sample_loss(model(features), labels))
    grads = torch.autograd.grad(value, [*model.parameters(), criterion.head.c])

    c = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
    smooth = make_smooth_plus(name, 0.1)
    expected = smoothed_rcvar_per_sample(per_sample_loss(model(features), labels), c, 0.3, 0.2, smooth).mean()
    expected_grads = torch.autograd.grad(expected, [*model.parameters(), c])

    assert abs(float(value.detach()) - float(expected.detach())) <= 1e-12
    for got, want in zip(grads, expected_grads, strict=True):
        assert torch.allclose(got, want, rtol=0.0, atol=1e-12)
    assert float(expected_grads[-1]) != 0.0, "the test needs c off its optimum"


def test_minimising_the_rcvar_loss_over_c_alone_reaches_the_exact_rcvar_within_the_smoothing_bound() -> None:
    """With theta fixed, min over c of the smoothed objective lies in [RCVaR, RCVaR + (1 - eps) * gap / rho]."""
    losses = torch.from_numpy(np.random.default_rng(1).exponential(1.0, size=500))
    epsilon, rho, gamma = 0.1, 0.2, 0.05
    criterion = RCVaRLoss(rho=rho, epsilon=epsilon, gamma=gamma, bound=10.0, dtype=torch.float64)
    assert criterion.threshold == 10.0, "c starts at the bound B"
    # 1 / L in the c-direction: softrelu's curvature is 1 / (4 gamma), so f is ((1 - eps) / (4 rho gamma))-smooth.
    optimizer = torch.optim.SGD(criterion.parameters(), lr=4.0 * rho * gamma / (1.0 - epsilon))
    for _ in range(500):
        optimizer.zero_grad()
        criterion(losses).backward()
        optimizer.step()
        criterion.project()
    with torch.no_grad():
        reached = float(criterion(losses))
    exact = rcvar(losses, epsilon, rho)
    smoothing_bound = (1.0 - epsilon) * make_smooth_plus("softrelu", gamma).max_gap / rho
    assert exact <= reached <= exact + smoothing_bound
    # It is the minimum, not just within the bound: no better than at the exact problem's minimiser.
    at_exact_minimiser = RCVaRLoss(
        rho=rho, epsilon=epsilon, gamma=gamma, c=cvar_threshold(losses, rho), dtype=torch.float64
    )(losses)
    assert reached <= float(at_exact_minimiser.detach()) + 1e-9
    assert 0.0 < criterion.threshold < 10.0


def test_rcvar_loss_projects_c_and_refuses_averaged_losses() -> None:
    criterion = RCVaRLoss(bound=2.0, c=-1.0)
    criterion.project()
    assert criterion.threshold == 0.0
    with torch.no_grad():
        criterion.head.c.fill_(5.0)
    criterion.project()
    assert criterion.threshold == 2.0
    with pytest.raises(ConfigError, match="reduction='none'"):
        criterion(torch.tensor(0.5))
    with pytest.raises(ConfigError, match="rho must be in"):
        RCVaRLoss(rho=0.0)
