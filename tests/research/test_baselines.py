"""The baselines run the same core as FedSRCVaR and implement their own server rules exactly.

Small synthetic federations are used only to test math (trajectory equalities and
one-round formulas, which hold for any data); behaviour is checked on real Adult rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.optimize import linprog, minimize

from fedfair.core import server
from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.data import client_batch_sizes
from fedfair.core.errors import ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.update import Update
from fedfair.core.models import flat_parameters
from fedfair.core.objective import cvar
from fedfair.datasets import load_dataset, partition
from fedfair.core.models import per_sample_loss
from fedfair.simulation.rounds import make_learners
from fedfair.privacy.config import PrivacyConfig
from fedfair.research.baselines import (
    AFLResult,
    AFLSettings,
    FedAvgSettings,
    LossRows,
    QFedAvgSettings,
    project_onto_simplex,
    rebuilt,
    run_afl,
    run_central_cvar,
    run_central_erm,
    run_fedavg,
    run_qfedavg,
)
from fedfair.research.dro import (
    ChiSquareDROLearner,
    chi_square_constant,
    chi_square_dual,
    chi_square_eta,
    run_dro,
)
from fedfair.research.methods import METHODS
from fedfair.research.minimax import (
    BPFResult,
    BPFSettings,
    FedMinMaxResult,
    FedMinMaxSettings,
    GroupedFederation,
    bpf_adversary_step,
    bpf_ratio_bounds,
    project_onto_capped_simplex,
    run_bpf,
    run_fedminmax,
    with_groups,
)
from fedfair.research.task import NoSettings, Task
from fedfair.simulation.federation import Federation, federation_from_arrays
from fedfair.simulation.rounds import SimulationOptions, run_fedsrcvar


def synthetic_federation(sizes: Sequence[int], num_classes: int = 3, seed: int = 0) -> Federation:
    """Gaussian features and random labels: only for checking that two computations agree."""
    rng = np.random.default_rng(seed)
    parts = [(rng.normal(size=(n, 4)), rng.integers(0, num_classes, size=n)) for n in sizes]
    return federation_from_arrays([f"client{k}" for k in range(len(sizes))], parts, parts, num_classes)


F64 = SimulationOptions(model="logreg", dtype="float64")
"""Every run here: logistic regression in float64, so two computations agree to rounding."""


def training(rounds: int = 20, batch_size: int = 12, local_steps: int = 1, **changes: object) -> TrainingConfig:
    return TrainingConfig(
        rounds=rounds,
        batch_size=batch_size,
        local=LocalConfig(local_steps=local_steps, lr=0.3),
        average_from=0.0,
        **changes,
    )


def task_on(
    federation: Federation, config: TrainingConfig, objective: ObjectiveConfig = ObjectiveConfig(), **options: object
) -> Task:
    """The Task of a method's run on `federation` with `config` and `objective`: no DP, float64 (`options`
    replaces F64's)."""
    return Task(federation, objective, config, PrivacyConfig(), options=replace(F64, **options))


def trajectory(run, task: Task, *settings: object) -> tuple[list[torch.Tensor], server.ServerState]:
    """Every round's theta (via on_round) and the final state of a method's run on `task`."""
    thetas: list[torch.Tensor] = []
    result = run(replace(task, on_round=lambda state: thetas.append(state.theta.clone())), *settings)
    return thetas, result.state


def one_round(federation: Federation, config: TrainingConfig, steps: Sequence[int]) -> list[Update]:
    """Each collaborator's first-round update from the initial model, with `steps[k]` local steps."""
    _, learners = make_learners(federation, config, None, options=F64)
    theta = flat_parameters(learners[0].model).double()
    updates = []
    for learner, count in zip(learners, steps, strict=True):
        learner.begin(theta, 0.0)
        for _ in range(count):
            learner.step()
        updates.append(learner.finish())
    return updates


# FedAvg


@pytest.mark.slow
@pytest.mark.parametrize("local_steps", [1, 3])
def test_fedavg_follows_fedsrcvar_with_epsilon_one_exactly(local_steps: int) -> None:
    # epsilon = 1 zeroes the CVaR term's gradient (0 * x + 1 * l), so theta sees the same
    # gradients and batches; c never moves. Equal, not merely close.
    federation = synthetic_federation((30, 20, 11))
    config = training(local_steps=local_steps)
    fedavg, fedavg_state = trajectory(run_fedavg, task_on(federation, config), FedAvgSettings())
    objective = ObjectiveConfig(epsilon=1.0, rho=0.3, bound=2.0)
    rcvar, rcvar_state = trajectory(METHODS["fedsrcvar"].run, task_on(federation, config, objective), NoSettings())
    assert len(fedavg) == len(rcvar) == 20
    for ours, theirs in zip(fedavg, rcvar, strict=True):
        assert float((ours - theirs).abs().max()) <= 1e-12
    assert float((fedavg_state.theta_average - rcvar_state.theta_average).abs().max()) <= 1e-12
    assert float((fedavg[-1] - fedavg[0]).abs().max()) > 1e-3, "the model must move for the test to mean anything"


def test_fedavg_epochs_take_ceil_n_over_b_steps_per_client() -> None:
    federation = synthetic_federation((30, 20, 11))
    config = training(rounds=1)
    # b = (6, 4, 2) by client_batch_sizes: one epoch is ceil(n_k / b_k) = (5, 5, 6) steps.
    assert client_batch_sizes([30, 20, 11], 12) == [6, 4, 2]
    expected = server.apply(
        server.init(torch.zeros(15, dtype=torch.float64), bound=0.0),
        server.Aggregate.of(one_round(federation, config, [10, 10, 12])),
        bound=0.0,
    )
    state = run_fedavg(task_on(federation, config), FedAvgSettings(local_epochs=2)).state
    assert float((state.theta - expected.theta).abs().max()) <= 1e-12


@pytest.mark.slow
def test_fedavg_epochs_with_full_batches_equal_tau_local_steps() -> None:
    # With b_k = n_k one epoch is one step, so E epochs must reproduce run_rounds with tau = E.
    federation = synthetic_federation((30, 20, 11))
    epochs, _ = trajectory(run_fedavg, task_on(federation, training(batch_size=0)), FedAvgSettings(local_epochs=3))
    steps, _ = trajectory(run_fedavg, task_on(federation, training(batch_size=0, local_steps=3)), FedAvgSettings())
    for ours, theirs in zip(epochs, steps, strict=True):
        assert float((ours - theirs).abs().max()) <= 1e-12


# The simplex projection behind AFL

vectors = st.lists(st.floats(-10.0, 10.0, allow_nan=False), min_size=1, max_size=12).map(np.array)


@given(vectors)
def test_projection_lands_on_the_simplex_and_satisfies_kkt(vector: np.ndarray) -> None:
    point = project_onto_simplex(vector)
    assert (point >= 0.0).all()
    assert point.sum() == pytest.approx(1.0, abs=1e-12)
    # Optimality of min ||x - v||^2 on the simplex: x = max(v - tau, 0) for one tau.
    tau = float(np.mean((vector - point)[point > 0.0]))
    assert np.allclose((vector - point)[point > 0.0], tau, atol=1e-9)
    assert (vector[point == 0.0] <= tau + 1e-9).all()


@given(vectors, st.integers(0, 2**32 - 1))
def test_projection_is_the_nearest_simplex_point(vector: np.ndarray, seed: int) -> None:
    point = project_onto_simplex(vector)
    others = np.random.default_rng(seed).dirichlet(np.ones(vector.size), size=50)
    assert (np.linalg.norm(others - vector, axis=1) >= np.linalg.norm(point - vector) - 1e-9).all()


@given(vectors, st.floats(-5.0, 5.0))
def test_projection_fixes_simplex_points_and_ignores_shifts(vector: np.ndarray, shift: float) -> None:
    point = project_onto_simplex(vector)
    assert np.allclose(project_onto_simplex(point), point, atol=1e-12)
    # Adding a constant to every coordinate moves all of them along the simplex normal.
    assert np.allclose(project_onto_simplex(vector + shift), point, atol=1e-9)


def test_projection_examples() -> None:
    assert np.allclose(project_onto_simplex(np.array([0.2, 0.3, 0.5])), [0.2, 0.3, 0.5])
    assert np.allclose(project_onto_simplex(np.array([2.0, 0.0])), [1.0, 0.0])
    assert np.allclose(project_onto_simplex(np.array([1.0, 1.0])), [0.5, 0.5])
    # A diverging adversary's weights (FedMinMax at 51 groups): 1e17 - (1e17 - 1) rounds to 0,
    # so an unshifted rule kept no coordinate and failed with an IndexError.
    assert np.allclose(project_onto_simplex(np.array([1e17, 3.0, 2e16])), [1.0, 0.0, 0.0])


# AFL


def client_losses(model: torch.nn.Module, theta: torch.Tensor, federation: Federation) -> np.ndarray:
    return np.array([evaluate(model, theta, client).losses.mean() for client in federation.train])


def test_afl_mixture_ascends_on_client_losses_within_the_simplex(small_adult_federation: Federation) -> None:
    federation = small_adult_federation
    thetas: list[torch.Tensor] = []
    result = run_afl(
        replace(
            task_on(federation, training(rounds=8, batch_size=64), record_every=1),
            on_round=lambda state: thetas.append(state.theta.clone()),
        ),
        AFLSettings(mixture_lr=0.5),
    )
    assert isinstance(result, AFLResult)
    mixtures = [np.array([record[f"lambda_{k}"] for k in range(3)]) for record in result.history]
    assert np.allclose(mixtures[-1], result.mixture)
    # Zero-initialised logistic regression gives every client loss ln 2: round 1 keeps lambda uniform.
    assert np.allclose(mixtures[0], 1.0 / 3.0)
    for t in range(1, len(mixtures)):
        assert (mixtures[t] >= 0.0).all() and mixtures[t].sum() == pytest.approx(1.0, abs=1e-12)
        losses = client_losses(result.model, thetas[t - 1], federation)
        assert np.allclose(mixtures[t], project_onto_simplex(mixtures[t - 1] + 0.5 * losses), atol=1e-12)
    # The first informative step moves weight toward the client with the highest loss.
    losses = client_losses(result.model, thetas[0], federation)
    assert np.argmax(mixtures[1] - mixtures[0]) == np.argmax(losses)
    assert mixtures[1][np.argmax(losses)] > 1.0 / 3.0


def test_afl_moves_the_model_by_the_mixture_of_client_updates() -> None:
    federation = synthetic_federation((30, 20, 11), num_classes=2)
    config = training(rounds=1)
    # Round 1 starts from uniform lambda whatever the losses.
    updates = one_round(federation, config, [1, 1, 1])
    expected = sum(update.delta.double() for update in updates) / 3.0
    state = run_afl(task_on(federation, config), AFLSettings(mixture_lr=1.0)).state
    assert float((state.theta - expected).abs().max()) <= 1e-12


def test_loss_rows_draw_fresh_seeded_subsets_and_read_small_clients_whole() -> None:
    assert LossRows([10, 50], 0, seed=1).draw() == [None, None]
    rows = LossRows([10, 50], 20, seed=1)
    first, second = rows.draw(), rows.draw()
    assert first[0] is None and second[0] is None  # 20 rows cover a 10-row client: it reads them all
    for index in (first[1], second[1]):
        assert index is not None and index.size == 20 and len(set(index.tolist())) == 20
        assert index.min() >= 0 and index.max() < 50 and (np.diff(index) > 0).all()
    assert not np.array_equal(first[1], second[1])  # a fresh draw every round
    again = LossRows([10, 50], 20, seed=1).draw()
    assert np.array_equal(again[1], first[1])  # and the same draws for the same seed
    with pytest.raises(ConfigError, match="--loss-rows"):
        LossRows([10], -1, seed=0)


def test_afl_with_loss_rows_covering_every_client_is_exact_afl() -> None:
    federation = synthetic_federation((30, 20, 11), num_classes=2)
    config = training(rounds=5)
    exact = run_afl(task_on(federation, config), AFLSettings(mixture_lr=0.5))
    covered = run_afl(task_on(federation, config), AFLSettings(mixture_lr=0.5, loss_rows=30))
    assert torch.equal(exact.state.theta, covered.state.theta) and np.array_equal(exact.mixture, covered.mixture)


def test_afl_with_loss_rows_ascends_on_the_sampled_mean_losses() -> None:
    federation = synthetic_federation((30, 20, 11), num_classes=2)
    config = training(rounds=2)
    thetas: list[torch.Tensor] = []
    result = run_afl(
        replace(task_on(federation, config), on_round=lambda state: thetas.append(state.theta.clone())),
        AFLSettings(mixture_lr=0.5, loss_rows=8),
    )
    draws = LossRows([30, 20, 11], 8, seed=config.seed)
    mixture = np.full(3, 1.0 / 3.0)
    for theta in (torch.zeros_like(thetas[0]), thetas[0]):  # the pairs rounds 1 and 2 start from
        losses = [
            evaluate(result.model, theta, client).losses[index].mean()
            for client, index in zip(federation.train, draws.draw(), strict=True)
        ]
        mixture = project_onto_simplex(mixture + 0.5 * np.array(losses))
    assert np.allclose(result.mixture, mixture, atol=1e-12)
    assert not np.allclose(
        result.mixture, run_afl(task_on(federation, config), AFLSettings(mixture_lr=0.5)).mixture, atol=1e-6
    )


# q-FedAvg


@pytest.mark.parametrize("q", [0.0, 0.5, 2.0])
def test_qfedavg_round_follows_the_q_ffl_step(q: float) -> None:
    federation = synthetic_federation((30, 20, 11))
    config = training(rounds=1, local_steps=2)
    updates = one_round(federation, config, [2, 2, 2])
    template = make_learners(federation, config, None, options=F64)[0]
    losses = client_losses(template, torch.zeros(15, dtype=torch.float64), federation)
    lipschitz = 1.0 / config.local.lr
    # Li et al.: Delta_k = L (theta_t - theta_k), h_k = q F^(q-1) ||Delta_k||^2 + L F^q,
    # theta_{t+1} = theta_t - sum F^q Delta_k / sum h_k.
    deltas = [-lipschitz * update.delta.double() for update in updates]
    h = [q * f ** (q - 1) * float(d.square().sum()) + lipschitz * f**q for f, d in zip(losses, deltas, strict=True)]
    expected = -sum(f**q * d for f, d in zip(losses, deltas, strict=True)) / sum(h)
    state = run_qfedavg(task_on(federation, config), QFedAvgSettings(q=q)).state
    assert float((state.theta - expected).abs().max()) <= 1e-12


@pytest.mark.slow
def test_qfedavg_with_q_zero_is_fedavg_for_equal_clients() -> None:
    # q = 0: h_k = L, so theta_{t+1} = theta_t + mean_k (theta_k - theta_t), FedAvg with equal
    # weights, which is the core's b_k-weighted FedAvg when every b_k is the same.
    federation = synthetic_federation((16, 16, 16))
    config = training(batch_size=12)
    q_zero, _ = trajectory(run_qfedavg, task_on(federation, config), QFedAvgSettings(q=0.0))
    fedavg, _ = trajectory(run_fedavg, task_on(federation, config), FedAvgSettings())
    for ours, theirs in zip(q_zero, fedavg, strict=True):
        assert float((ours - theirs).abs().max()) <= 1e-12


# Centralized yardsticks: with full batches, federated GD is centralized GD


def test_central_erm_equals_federated_gradient_descent(small_adult_federation: Federation) -> None:
    config = training(rounds=30, batch_size=0)
    central = run_central_erm(task_on(small_adult_federation, config)).state
    federated = run_fedavg(task_on(small_adult_federation, config), FedAvgSettings()).state
    assert float((central.theta - federated.theta).norm() / central.theta.norm()) <= 1e-10
    assert float(central.theta.norm()) > 1e-2, "the model must move for the test to mean anything"


@pytest.mark.slow
def test_central_cvar_is_rcvar_at_epsilon_zero(small_adult_federation: Federation) -> None:
    config = replace(training(rounds=30, batch_size=0), local=LocalConfig(lr=0.3, threshold_lr=0.2))
    objective = ObjectiveConfig(epsilon=0.4, rho=0.3, bound=2.0)
    central = run_central_cvar(task_on(small_adult_federation, config, objective)).state
    federated = run_fedsrcvar(small_adult_federation, replace(objective, epsilon=0.0), config, options=F64).state
    assert float((central.theta - federated.theta).norm() / central.theta.norm()) <= 1e-10
    assert central.c == pytest.approx(federated.c, rel=1e-10)
    assert 0.0 <= central.c < 2.0, "c must have moved off the bound"


# Arguments


@pytest.mark.parametrize(
    "call",
    [
        lambda f, t: run_fedavg(task_on(f, t), FedAvgSettings(local_epochs=0)),
        lambda f, t: run_fedavg(
            task_on(f, replace(t, local=LocalConfig(local_steps=2))), FedAvgSettings(local_epochs=1)
        ),
        lambda f, t: run_afl(task_on(f, t), AFLSettings(mixture_lr=0.0)),
        lambda f, t: run_afl(task_on(f, t), AFLSettings(mixture_lr=float("inf"))),
        lambda f, t: run_qfedavg(task_on(f, t), QFedAvgSettings(q=-1.0)),
        lambda f, t: run_qfedavg(task_on(f, t), QFedAvgSettings(q=float("nan"))),
    ],
)
def test_bad_arguments_are_refused(call) -> None:
    with pytest.raises(ConfigError):
        call(synthetic_federation((10, 10)), training(rounds=1, batch_size=4))


# The capped simplex behind BPF's adversary


@st.composite
def capped_problems(draw: st.DrawFn) -> tuple[np.ndarray, float, float, float]:
    """A vector, a box [lower, upper] and a feasible total in [n * lower, n * upper]."""
    vector = draw(vectors)
    lower = draw(st.floats(-1.0, 1.0))
    upper = lower + draw(st.floats(1e-3, 3.0))
    share = draw(st.floats(0.0, 1.0))
    return vector, lower, upper, vector.size * (lower + share * (upper - lower))


@given(capped_problems())
def test_capped_projection_satisfies_kkt(problem: tuple[np.ndarray, float, float, float]) -> None:
    vector, lower, upper, total = problem
    point = project_onto_capped_simplex(vector, lower, upper, total)
    assert (point >= lower).all() and (point <= upper).all()
    assert point.sum() == pytest.approx(total, abs=1e-9)
    # min ||x - v||^2 on the set: x = clip(v - tau, lower, upper) for one tau, so v - x is the
    # same tau on free coordinates, at most tau where x sits at lower and at least tau at upper.
    shift = vector - point
    free = (point > lower + 1e-12) & (point < upper - 1e-12)
    tau = float(np.mean(shift[free])) if free.any() else None
    if tau is not None:
        assert np.allclose(shift[free], tau, atol=1e-9)
        assert (shift[point <= lower + 1e-12] <= tau + 1e-9).all()
        assert (shift[point >= upper - 1e-12] >= tau - 1e-9).all()
    else:
        # No free coordinate: some tau must still separate the lower ones from the upper ones.
        at_lower, at_upper = shift[point <= lower + 1e-12], shift[point >= upper - 1e-12]
        if at_lower.size and at_upper.size:
            assert at_lower.max() <= at_upper.min() + 1e-9


@given(vectors)
def test_capped_projection_with_a_loose_cap_is_the_simplex_projection(vector: np.ndarray) -> None:
    assert np.allclose(project_onto_capped_simplex(vector, 0.0, 1.0), project_onto_simplex(vector), atol=1e-9)


def test_capped_projection_refuses_an_empty_set() -> None:
    with pytest.raises(ConfigError, match="no 3 values in"):
        project_onto_capped_simplex(np.zeros(3), 0.0, 0.2, total=1.0)


# BPF


def losses_vector(seed: int, size: int = 40) -> np.ndarray:
    """Positive, spread-out losses: a unit-test vector for the adversary's math."""
    return np.random.default_rng(seed).exponential(size=size)


@pytest.mark.parametrize(("rho", "epsilon"), [(0.1, 0.0), (0.3, 0.0), (0.37, 0.0), (0.3, 0.05), (0.5, 0.2)])
def test_bpf_adversary_optimum_is_cvar(rho: float, epsilon: float) -> None:
    """At a fixed model the adversary's best weights give CVaR_rho (epsilon = 0); with a floor epsilon,
    epsilon / rho * mean + (1 - epsilon / rho) * CVaR_rho' with rho' = (rho - epsilon) / (1 - epsilon)."""
    losses = losses_vector(seed=int(rho * 100 + epsilon * 10))
    n = losses.size
    lower, upper = bpf_ratio_bounds(rho, epsilon)
    solved = linprog(-losses / n, A_eq=np.ones((1, n)) / n, b_eq=[1.0], bounds=[(lower, upper)] * n)
    rho_prime = (rho - epsilon) / (1.0 - epsilon)
    closed_form = epsilon / rho * losses.mean() + (1.0 - epsilon / rho) * cvar(losses, rho_prime)
    assert -solved.fun == pytest.approx(closed_form, rel=1e-9)
    if epsilon == 0.0:
        assert -solved.fun == pytest.approx(cvar(losses, rho), rel=1e-12)
    # The adversary's own projected ascent, from uniform weights, climbs to that optimum.
    ratios = np.ones(n)
    for _ in range(1000):
        ratios = bpf_adversary_step(ratios, losses, 10.0, rho, epsilon)
        assert ratios.mean() == pytest.approx(1.0, abs=1e-12)
        assert (ratios >= lower - 1e-12).all() and (ratios <= upper + 1e-12).all()
    assert float(np.mean(ratios * losses)) == pytest.approx(closed_form, rel=1e-9)


def test_bpf_at_rho_one_is_central_erm_exactly() -> None:
    # rho = 1, epsilon = 0: ratios in [0, 1] with mean 1 are all 1, so every step is ERM's.
    federation = synthetic_federation((30, 20, 11))
    config = training(rounds=10)
    objective = ObjectiveConfig(epsilon=0.0, rho=1.0)
    bpf, bpf_state = trajectory(run_bpf, task_on(federation, config, objective), BPFSettings(adversary_lr=1.0))
    erm, erm_state = trajectory(run_central_erm, task_on(federation, config))
    for ours, theirs in zip(bpf, erm, strict=True):
        assert float((ours - theirs).abs().max()) <= 1e-12
    assert float((bpf_state.theta_average - erm_state.theta_average).abs().max()) <= 1e-12


def test_bpf_lowers_the_worst_training_group_risk_below_erm(small_adult_federation: Federation) -> None:
    federation, rho = small_adult_federation, 0.2
    config = replace(training(rounds=150, batch_size=128), local=LocalConfig(lr=0.3))
    bpf = run_bpf(task_on(federation, config, ObjectiveConfig(epsilon=0.0, rho=rho)), BPFSettings(adversary_lr=0.5))
    erm = run_central_erm(task_on(federation, config))
    assert isinstance(bpf, BPFResult)
    assert bpf.ratios.mean() == pytest.approx(1.0, abs=1e-9)
    assert bpf.ratios.min() >= 0.0 and bpf.ratios.max() <= 1.0 / rho + 1e-12
    pooled = federation.pooled("train")
    worst = [cvar(evaluate(result.model, result.state.theta_average, pooled).losses, rho) for result in (bpf, erm)]
    assert worst[0] < worst[1] - 0.01


# Chi-square DRO


def chi_square_robust_risk(losses: np.ndarray, rho: float) -> float:
    """sup E_Q[l] over Q with (1/2) E_P[(dQ/dP - 1)^2] <= r, r = (1/rho - 1)^2 / 2, solved directly (SLSQP)."""
    n, radius = losses.size, (1.0 / rho - 1.0) ** 2 / 2.0
    constraints = [
        {"type": "eq", "fun": lambda ratios: ratios.mean() - 1.0},
        {"type": "ineq", "fun": lambda ratios: 2.0 * radius - np.mean((ratios - 1.0) ** 2)},
    ]
    solved = minimize(
        lambda ratios: -np.mean(ratios * losses),
        np.ones(n),
        method="SLSQP",
        bounds=[(0.0, None)] * n,
        constraints=constraints,
        options={"ftol": 1e-14, "maxiter": 1000},
    )
    assert solved.success
    return float(-solved.fun)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rho", [0.1, 0.3, 0.6])
def test_chi_square_dual_bounds_the_robust_risk_and_its_minimum_equals_it(seed: int, rho: float) -> None:
    losses = losses_vector(seed, size=9)
    direct = chi_square_robust_risk(losses, rho)
    for eta in np.linspace(losses.min() - 3.0, losses.max() + 1.0, 101):
        assert chi_square_dual(losses, float(eta), rho) >= direct - 1e-7
    eta_star = chi_square_eta(losses, rho)
    assert chi_square_dual(losses, eta_star, rho) == pytest.approx(direct, rel=1e-7)
    assert chi_square_constant(rho) == pytest.approx(np.sqrt(2.0 * (1.0 / rho - 1.0) ** 2 / 2.0 + 1.0))


def test_dro_learner_terms_average_to_the_dual_with_its_gradient() -> None:
    """The per-sample terms the core's step averages have the chi-square dual's value and gradient at eta*."""
    federation = synthetic_federation((64,))
    config = training(batch_size=0)
    _, (plain,) = make_learners(federation, config, None, options=F64)
    (learner,) = rebuilt([plain], config, ChiSquareDROLearner)
    learner.rho = 0.2
    with torch.no_grad():
        for parameter in learner.model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(3)))
    terms = learner.objective(learner.features, learner.labels).mean()
    ours = torch.autograd.grad(terms, list(learner.model.parameters()))
    losses = per_sample_loss(learner.model(learner.features), learner.labels)
    eta = learner.last_eta
    assert eta == chi_square_eta(losses, 0.2)
    dual = chi_square_constant(0.2) * torch.nn.functional.relu(losses - eta).square().mean().sqrt() + eta
    expected = torch.autograd.grad(dual, list(learner.model.parameters()))
    assert float(terms.detach()) == pytest.approx(float(dual.detach()), rel=1e-12)
    for mine, theirs in zip(ours, expected, strict=True):
        assert float((mine - theirs).abs().max()) <= 1e-12
    assert float(dual.detach()) == pytest.approx(chi_square_dual(losses.detach().numpy(), eta, 0.2), rel=1e-12)


@pytest.mark.slow
def test_dro_lowers_the_training_robust_risk_below_erm(small_adult_federation: Federation) -> None:
    federation, rho = small_adult_federation, 0.2
    # DRO's weights C (l - eta)_+ / s reach far beyond 1 / rho: it needs a smaller step than ERM.
    config = replace(training(rounds=150, batch_size=128), local=LocalConfig(lr=0.01))
    dro = run_dro(task_on(federation, config, ObjectiveConfig(rho=rho)))
    erm = run_central_erm(task_on(federation, config))
    pooled = federation.pooled("train")
    risks = []
    for result in (dro, erm):
        losses = evaluate(result.model, result.state.theta_average, pooled).losses
        risks.append(chi_square_dual(losses, chi_square_eta(losses, rho), rho))
    assert risks[0] < risks[1] - 0.01
    assert all(np.isfinite(record["eta"]) for record in dro.history)


# FedMinMax


def grouped_synthetic(sizes: Sequence[int], groups: int, seed: int = 0) -> GroupedFederation:
    rng = np.random.default_rng(seed + 1)
    columns = [rng.integers(0, groups, size=n) for n in sizes]
    return with_groups(synthetic_federation(sizes, seed=seed), columns, [f"g{a}" for a in range(groups)])


def small_adult_by_sex(caps: Sequence[int] = (600, 250, 120)) -> GroupedFederation:
    """Adult split by race into three collaborators, with sex as the sensitive column (it cuts across them)."""
    dataset = load_dataset("adult")
    splits = partition(dataset, "race", 3, seed=0)
    rows = [split.train_index[:cap] for split, cap in zip(splits, caps, strict=True)]
    test_rows = [split.test_index[:cap] for split, cap in zip(splits, caps, strict=True)]
    federation = federation_from_arrays(
        [split.name for split in splits],
        [(dataset.x_train[index], dataset.y_train[index]) for index in rows],
        [(dataset.x_test[index], dataset.y_test[index]) for index in test_rows],
        dataset.num_classes,
    )
    names, codes = np.unique(dataset.attributes_train["sex"], return_inverse=True)
    return with_groups(federation, [codes[index] for index in rows], [str(name) for name in names])


@pytest.mark.slow
@pytest.mark.parametrize("local_steps", [1, 3])
def test_fedminmax_with_one_group_is_fedavg_exactly(local_steps: int) -> None:
    federation = grouped_synthetic((30, 20, 11), groups=1)
    config = training(rounds=10, local_steps=local_steps)
    minmax, minmax_state = trajectory(run_fedminmax, task_on(federation, config), FedMinMaxSettings(adversary_lr=0.7))
    fedavg, fedavg_state = trajectory(run_fedavg, task_on(federation, config), FedAvgSettings())
    for ours, theirs in zip(minmax, fedavg, strict=True):
        assert float((ours - theirs).abs().max()) <= 1e-12
    assert float((minmax_state.theta_average - fedavg_state.theta_average).abs().max()) <= 1e-12


def test_fedminmax_weights_ascend_on_group_risks_within_the_simplex() -> None:
    federation = small_adult_by_sex()
    thetas: list[torch.Tensor] = []
    result = run_fedminmax(
        replace(
            task_on(federation, training(rounds=6, batch_size=64), record_every=1),
            on_round=lambda state: thetas.append(state.theta.clone()),
        ),
        FedMinMaxSettings(adversary_lr=0.5),
    )
    assert isinstance(result, FedMinMaxResult)
    counts = sum(np.bincount(column, minlength=2) for column in federation.train_groups)
    shares = counts / counts.sum()

    def group_risks(theta: torch.Tensor) -> np.ndarray:
        sums = np.zeros(2)
        for client, column in zip(federation.train, federation.train_groups, strict=True):
            sums += np.bincount(column, weights=evaluate(result.model, theta, client).losses, minlength=2)
        return sums / counts

    mixtures = [shares] + [np.array([record["mu_0"], record["mu_1"]]) for record in result.history]
    starts = [torch.zeros(thetas[0].numel(), dtype=torch.float64)] + thetas[:-1]
    for t in range(1, len(mixtures)):
        assert (mixtures[t] >= 0.0).all() and mixtures[t].sum() == pytest.approx(1.0, abs=1e-12)
        expected = project_onto_simplex(mixtures[t - 1] + 0.5 * group_risks(starts[t - 1]))
        assert np.allclose(mixtures[t], expected, atol=1e-12)
    # Round 1 (the zero model has equal risks) keeps mu at the shares; after that mu moves to the worse group.
    risks = group_risks(thetas[0])
    assert risks[0] != pytest.approx(risks[1], abs=1e-3)
    worse = int(np.argmax(risks))
    assert mixtures[2][worse] > mixtures[1][worse]
    assert np.allclose(result.group_weights, mixtures[-1])


def test_fedminmax_reaches_the_minimax_point_of_two_groups_with_a_known_saddle() -> None:
    # A constant-feature model: only its logit's bias z moves, p = sigmoid(z), and group a's risk is the
    # cross-entropy -q_a ln p - (1 - q_a) ln(1 - p) of its positive share q_a. With q_0 = 0.9 (80 rows) and
    # q_1 = 0.7 (20 rows), R_0 - R_1 = (q_0 - q_1) z: group 1 is the worse one wherever z > 0, so
    # max_a R_a = R_1 there, minimised at p = q_1. The saddle is mu* = (0, 1), p* = 0.7, value H(0.7); ERM's
    # pooled share 0.86 leaves group 1 at H(0.7) + KL(0.7 || 0.86) = H(0.7) + 0.085.
    positives, sizes = (0.9, 0.7), (80, 20)
    rows = [
        (group, label)
        for group, (q, n) in enumerate(zip(positives, sizes))
        for label in [1] * round(q * n) + [0] * round((1 - q) * n)
    ]
    clients = [rows[0:50] + rows[80:90], rows[50:80] + rows[90:100]]  # both groups at both sites
    parts = [(np.zeros((len(rows_k), 1)), np.array([label for _, label in rows_k])) for rows_k in clients]
    federation = with_groups(
        federation_from_arrays(["a", "b"], parts, parts, 2),
        [np.array([group for group, _ in rows_k]) for rows_k in clients],
        ["q0.9", "q0.7"],
    )
    lr, rounds = 2.0, 30
    config = replace(training(rounds=rounds, batch_size=0), local=LocalConfig(local_steps=1, lr=lr))
    result = run_fedminmax(task_on(federation, config, record_every=1), FedMinMaxSettings(adversary_lr=2.0))
    fedavg = run_fedavg(task_on(federation, config), FedAvgSettings())

    def group_risks(theta: torch.Tensor) -> np.ndarray:
        losses = np.concatenate([evaluate(result.model, theta, client).losses for client in federation.train])
        groups = np.concatenate(federation.train_groups)
        return np.array([losses[groups == group].mean() for group in (0, 1)])

    def entropy(q: float) -> float:
        return -q * math.log(q) - (1 - q) * math.log(1 - q)

    # The worst group's weight stays at its share 0.2 in round 1 (the zero model ties the groups), then rises every
    # round to 1 and stays there.
    weights = [record["mu_1"] for record in result.history]
    saturated = weights.index(1.0)
    assert weights[0] == pytest.approx(0.2, abs=1e-12)
    assert all(later > earlier for earlier, later in zip(weights[:saturated], weights[1 : saturated + 1]))
    assert weights[saturated:] == [1.0] * (rounds - saturated) and result.group_weights.tolist() == [0.0, 1.0]
    # With one full-batch local step the round is a gradient step on sum_a mu_a R_a: z <- z - lr (p - m) with
    # m = sum_a mu_a q_a in [0.7, 0.86], never past its target (lr sigmoid' <= lr / 4 < 1), so z stays in
    # [0, logit 0.86] and |z - z*| <= logit 0.86 - logit 0.7. Once mu = (0, 1) each round contracts z - z* by at
    # least 1 - lr * 0.86 * 0.14 (sigmoid' at logit 0.86, its least on that range); then |p - 0.7| <= |z - z*| / 4
    # and R_1 - H(0.7) = KL(0.7 || p) <= (p - 0.7)^2 / (p (1 - p)), with p (1 - p) >= 0.86 * 0.14.
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    gap = (logit(0.86) - logit(0.7)) * (1 - lr * 0.86 * 0.14) ** (rounds - saturated - 1)
    tolerance = (gap / 4) ** 2 / (0.86 * 0.14)
    assert tolerance < 1e-3  # the run is long enough for the bound to be far inside ERM's 0.085
    worst = group_risks(result.state.theta).max()
    assert abs(worst - entropy(0.7)) <= tolerance
    erm_worst = group_risks(fedavg.state.theta).max()
    assert erm_worst - entropy(0.7) == pytest.approx(0.7 * math.log(0.7 / 0.86) + 0.3 * math.log(0.3 / 0.14), abs=1e-3)


def test_fedminmax_with_loss_rows_ascends_on_reweighted_sampled_group_risks() -> None:
    federation = small_adult_by_sex()
    config = training(rounds=2, batch_size=64)
    thetas: list[torch.Tensor] = []
    result = run_fedminmax(
        replace(task_on(federation, config), on_round=lambda state: thetas.append(state.theta.clone())),
        FedMinMaxSettings(adversary_lr=0.5, loss_rows=100),
    )
    counts = sum(np.bincount(column, minlength=2) for column in federation.train_groups)
    draws = LossRows([client.size for client in federation.train], 100, seed=config.seed)
    mixture = counts / counts.sum()
    for theta in (torch.zeros_like(thetas[0]), thetas[0]):
        sums = np.zeros(2)
        for client, column, index in zip(federation.train, federation.train_groups, draws.draw(), strict=True):
            assert index is not None  # every client of this federation has more than 100 rows
            losses = evaluate(result.model, theta, client).losses[index]
            # Each sampled row stands for n_k / 100 rows of its client: unbiased estimates of the group sums.
            sums += np.bincount(column[index], weights=losses, minlength=2) * client.size / 100
        mixture = project_onto_simplex(mixture + 0.5 * sums / counts)
    assert np.allclose(result.group_weights, mixture, atol=1e-12)


def test_grouped_federation_needs_one_group_per_training_sample() -> None:
    federation = synthetic_federation((5, 4))
    with pytest.raises(ConfigError, match="one group index"):
        with_groups(federation, [np.zeros(5, dtype=np.int64), np.zeros(3, dtype=np.int64)], ["all"])
    with pytest.raises(ConfigError, match="one group index"):
        with_groups(federation, [np.zeros(5, dtype=np.int64), np.full(4, 2)], ["a", "b"])


@pytest.mark.parametrize(
    "call",
    [
        lambda f, t: run_bpf(task_on(f, t, ObjectiveConfig(epsilon=0.4, rho=0.3)), BPFSettings(adversary_lr=0.1)),
        lambda f, t: run_bpf(task_on(f, t, ObjectiveConfig(rho=0.3)), BPFSettings(adversary_lr=0.0)),
        lambda f, t: run_dro(task_on(f, t, ObjectiveConfig(rho=1.0))),
        lambda f, t: run_fedminmax(
            task_on(with_groups(f, [np.zeros(10, dtype=np.int64)] * 2, ["all"]), t),
            FedMinMaxSettings(adversary_lr=-1.0),
        ),
        lambda f, t: run_fedminmax(task_on(f, t), FedMinMaxSettings()),
    ],
)
def test_bad_minimax_arguments_are_refused(call) -> None:
    with pytest.raises(ConfigError):
        call(synthetic_federation((10, 10)), training(rounds=1, batch_size=4))
