"""The baselines run the same core as FedSRCVaR and implement their own server rules exactly.

Small synthetic federations are used only to test math (trajectory equalities and
one-round formulas, which hold for any data); behaviour is checked on real Adult rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fedfair.core import server
from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.data import client_batch_sizes
from fedfair.core.errors import ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.local import Update
from fedfair.core.models import flat_parameters
from fedfair.research import simulation
from fedfair.research.baselines import (
    AFLResult,
    project_onto_simplex,
    run_afl,
    run_central_cvar,
    run_central_erm,
    run_fedavg,
    run_qfedavg,
)
from fedfair.research.simulation import (
    Federation,
    TrainingConfig,
    federation_from_arrays,
    run_fedsrcvar,
)


def synthetic_federation(sizes: Sequence[int], num_classes: int = 3, seed: int = 0) -> Federation:
    """Gaussian features and random labels: only for checking that two computations agree."""
    rng = np.random.default_rng(seed)
    parts = [(rng.normal(size=(n, 4)), rng.integers(0, num_classes, size=n)) for n in sizes]
    return federation_from_arrays([f"client{k}" for k in range(len(sizes))], parts, parts, num_classes)


def training(rounds: int = 20, batch_size: int = 12, local_steps: int = 1, **changes: object) -> TrainingConfig:
    return TrainingConfig(
        model="logreg",
        rounds=rounds,
        batch_size=batch_size,
        local=LocalConfig(local_steps=local_steps, lr=0.3),
        dtype="float64",
        average_from=0.0,
        **changes,
    )


def trajectory(run, *args: object, **kwargs: object) -> tuple[list[torch.Tensor], server.ServerState]:
    """Every round's theta (via on_round) and the final state of a run."""
    thetas: list[torch.Tensor] = []
    result = run(*args, on_round=lambda state: thetas.append(state.theta.clone()), **kwargs)
    return thetas, result.state


def one_round(federation: Federation, config: TrainingConfig, steps: Sequence[int]) -> list[Update]:
    """Each collaborator's first-round update from the initial model, with `steps[k]` local steps."""
    _, learners = simulation.make_learners(federation, config, None)
    theta = flat_parameters(learners[0].model).double()
    updates = []
    for learner, count in zip(learners, steps, strict=True):
        learner.begin(theta, 0.0)
        for _ in range(count):
            learner.step()
        updates.append(learner.finish())
    return updates


# FedAvg


@pytest.mark.parametrize("local_steps", [1, 3])
def test_fedavg_follows_fedsrcvar_with_epsilon_one_exactly(local_steps: int) -> None:
    # epsilon = 1 zeroes the CVaR term's gradient (0 * x + 1 * l), so theta sees the same
    # gradients and batches; c never moves. Equal, not merely close.
    federation = synthetic_federation((30, 20, 11))
    config = training(local_steps=local_steps)
    fedavg, fedavg_state = trajectory(run_fedavg, federation, config)
    rcvar, rcvar_state = trajectory(run_fedsrcvar, federation, ObjectiveConfig(epsilon=1.0, rho=0.3, bound=2.0), config)
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
    state = run_fedavg(federation, config, local_epochs=2).state
    assert float((state.theta - expected.theta).abs().max()) <= 1e-12


def test_fedavg_epochs_with_full_batches_equal_tau_local_steps() -> None:
    # With b_k = n_k one epoch is one step, so E epochs must reproduce run_rounds with tau = E.
    federation = synthetic_federation((30, 20, 11))
    epochs, _ = trajectory(run_fedavg, federation, training(batch_size=0), local_epochs=3)
    steps, _ = trajectory(run_fedavg, federation, training(batch_size=0, local_steps=3))
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


# AFL


def client_losses(model: torch.nn.Module, theta: torch.Tensor, federation: Federation) -> np.ndarray:
    return np.array([evaluate(model, theta, client).losses.mean() for client in federation.train])


def test_afl_mixture_ascends_on_client_losses_within_the_simplex(small_adult_federation: Federation) -> None:
    federation = small_adult_federation
    thetas: list[torch.Tensor] = []
    result = run_afl(
        federation,
        training(rounds=8, batch_size=64, record_every=1),
        mixture_lr=0.5,
        on_round=lambda state: thetas.append(state.theta.clone()),
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
    state = run_afl(federation, config, mixture_lr=1.0).state
    assert float((state.theta - expected).abs().max()) <= 1e-12


# q-FedAvg


@pytest.mark.parametrize("q", [0.0, 0.5, 2.0])
def test_qfedavg_round_follows_the_q_ffl_step(q: float) -> None:
    federation = synthetic_federation((30, 20, 11))
    config = training(rounds=1, local_steps=2)
    updates = one_round(federation, config, [2, 2, 2])
    template = simulation.make_learners(federation, config, None)[0]
    losses = client_losses(template, torch.zeros(15, dtype=torch.float64), federation)
    lipschitz = 1.0 / config.local.lr
    # Li et al.: Delta_k = L (theta_t - theta_k), h_k = q F^(q-1) ||Delta_k||^2 + L F^q,
    # theta_{t+1} = theta_t - sum F^q Delta_k / sum h_k.
    deltas = [-lipschitz * update.delta.double() for update in updates]
    h = [q * f ** (q - 1) * float(d.square().sum()) + lipschitz * f**q for f, d in zip(losses, deltas, strict=True)]
    expected = -sum(f**q * d for f, d in zip(losses, deltas, strict=True)) / sum(h)
    state = run_qfedavg(federation, config, q=q).state
    assert float((state.theta - expected).abs().max()) <= 1e-12


def test_qfedavg_with_q_zero_is_fedavg_for_equal_clients() -> None:
    # q = 0: h_k = L, so theta_{t+1} = theta_t + mean_k (theta_k - theta_t), FedAvg with equal
    # weights, which is the core's b_k-weighted FedAvg when every b_k is the same.
    federation = synthetic_federation((16, 16, 16))
    config = training(batch_size=12)
    q_zero, _ = trajectory(run_qfedavg, federation, config, q=0.0)
    fedavg, _ = trajectory(run_fedavg, federation, config)
    for ours, theirs in zip(q_zero, fedavg, strict=True):
        assert float((ours - theirs).abs().max()) <= 1e-12


# Centralized yardsticks: with full batches, federated GD is centralized GD


def test_central_erm_equals_federated_gradient_descent(small_adult_federation: Federation) -> None:
    config = training(rounds=30, batch_size=0)
    central = run_central_erm(small_adult_federation, config).state
    federated = run_fedavg(small_adult_federation, config).state
    assert float((central.theta - federated.theta).norm() / central.theta.norm()) <= 1e-10
    assert float(central.theta.norm()) > 1e-2, "the model must move for the test to mean anything"


def test_central_cvar_is_rcvar_at_epsilon_zero(small_adult_federation: Federation) -> None:
    config = replace(training(rounds=30, batch_size=0), local=LocalConfig(lr=0.3, threshold_lr=0.2))
    objective = ObjectiveConfig(epsilon=0.4, rho=0.3, bound=2.0)
    central = run_central_cvar(small_adult_federation, objective, config).state
    federated = run_fedsrcvar(small_adult_federation, replace(objective, epsilon=0.0), config).state
    assert float((central.theta - federated.theta).norm() / central.theta.norm()) <= 1e-10
    assert central.c == pytest.approx(federated.c, rel=1e-10)
    assert 0.0 <= central.c < 2.0, "c must have moved off the bound"


# Arguments


@pytest.mark.parametrize(
    "call",
    [
        lambda f, t: run_fedavg(f, t, local_epochs=0),
        lambda f, t: run_fedavg(f, replace(t, local=LocalConfig(local_steps=2)), local_epochs=1),
        lambda f, t: run_afl(f, t, mixture_lr=0.0),
        lambda f, t: run_afl(f, t, mixture_lr=float("inf")),
        lambda f, t: run_qfedavg(f, t, q=-1.0),
        lambda f, t: run_qfedavg(f, t, q=float("nan")),
    ],
)
def test_bad_arguments_are_refused(call) -> None:
    with pytest.raises(ConfigError):
        call(synthetic_federation((10, 10)), training(rounds=1, batch_size=4))
