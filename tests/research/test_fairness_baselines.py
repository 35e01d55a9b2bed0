"""PropFair, TERM, Delta-FL and FedAvgM hold their papers' defining properties.

Each is checked against an independent computation: autograd of the published objective over the pooled
rows, the FedAvg run it must reduce to, or a linear program. Float64 logistic regression on small synthetic
federations, so that the tolerances are rounding's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from fedfair.core.errors import ConfigError
from fedfair.core.models import flat_parameters, load_flat_parameters
from fedfair.research.baselines import FedAvgSettings, rebuilt, run_fedavg
from fedfair.research.experiment import run_method
from fedfair.research.fairness_baselines import (
    PROPFAIR_MARGIN,
    DeltaFLSettings,
    PropFairLearner,
    PropFairSettings,
    TERMSettings,
    propfair_surrogate,
    run_deltafl,
    run_propfair,
    run_term,
    superquantile_weights,
)
from fedfair.research.flags import config_from_flags
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import make_learners
from tests.research.test_baselines import F64, synthetic_federation, task_on, training, trajectory

LR = 0.3
"""`training()`'s step size."""


def pooled_gradient(federation: Federation, theta: torch.Tensor, objective) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Autograd of objective(per-client per-sample losses) at theta, on a fresh float64 model."""
    _, learners = make_learners(federation, training(batch_size=0), None, options=F64)
    model = learners[0].model
    load_flat_parameters(model, theta)
    losses = [learners[0].loss(model(client.features.double()), client.labels) for client in federation.train]
    value = objective(losses)
    gradients = torch.autograd.grad(value, list(model.parameters()))
    return torch.cat([gradient.reshape(-1) for gradient in gradients])


def second_move(run, federation: Federation, settings: object) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    """(theta_2, theta_3 - theta_2) of full-batch rounds of one local step.

    The second round's: at the uniform start every loss is ln K, where no reweighting shows.
    """
    thetas, _ = trajectory(run, task_on(federation, training(rounds=2, batch_size=0)), settings)
    return thetas[0], thetas[1] - thetas[0]


# ---------------------------------------------------------------- PropFair


@pytest.mark.parametrize("ceiling", [5.0, 1.3])
def test_propfair_step_is_autograd_of_its_surrogate(ceiling: float) -> None:
    # ceiling 5 keeps M - f on the logarithm; 1.3 puts a batch whose loss is above 1.1 on the tangent.
    federation = synthetic_federation((40, 25), num_classes=3, seed=3)
    _, plain = make_learners(federation, training(batch_size=0), None, options=F64)
    (learner, _) = rebuilt(plain, training(batch_size=0), PropFairLearner)
    learner.ceiling = ceiling
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a model far from the uniform start, so that the mean loss is far above ln 3
        for parameter in learner.model.parameters():
            parameter.copy_(2.0 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    features, labels = learner.features, learner.labels
    learner.zero_grad()
    torch.autograd.backward(learner.objective(features, labels).mean())
    ours = torch.cat([p.grad.reshape(-1) for p in learner.model.parameters()])  # type: ignore[union-attr]
    learner.zero_grad()
    mean_loss = learner.loss(learner.model(features), labels).mean()
    torch.autograd.backward(propfair_surrogate(mean_loss, ceiling))
    theirs = torch.cat([p.grad.reshape(-1) for p in learner.model.parameters()])  # type: ignore[union-attr]
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-14)
    on_tangent = ceiling - float(mean_loss.detach()) < PROPFAIR_MARGIN
    assert on_tangent == (ceiling == 1.3), f"mean loss {float(mean_loss.detach())} is not where the case means it to be"


def test_propfair_surrogate_is_the_logarithm_continued_by_its_tangent() -> None:
    ceiling = 2.0
    losses = torch.tensor(
        [0.0, 1.0, ceiling - PROPFAIR_MARGIN, ceiling - PROPFAIR_MARGIN + 1e-9, 3.0], dtype=torch.float64
    )
    values = propfair_surrogate(losses, ceiling)
    assert values[:3].tolist() == pytest.approx([-math.log(2.0), 0.0, -math.log(PROPFAIR_MARGIN)], rel=1e-12)
    assert float(values[3] - values[2]) == pytest.approx(1e-9 / PROPFAIR_MARGIN, rel=1e-5)  # the slope carries on
    assert float(values[4]) == pytest.approx(
        -math.log(PROPFAIR_MARGIN) + (3.0 - ceiling + PROPFAIR_MARGIN) / PROPFAIR_MARGIN
    )


def test_propfair_round_descends_the_clients_weighted_surrogates() -> None:
    # Full batches and one step: the server moves by -lr * sum_k p_k grad S(F_k), p_k = n_k / n.
    federation = synthetic_federation((40, 25, 15), num_classes=3, seed=1)
    ceiling = 1.5
    start, move = second_move(run_propfair, federation, PropFairSettings(ceiling=ceiling))
    sizes = torch.tensor([client.size for client in federation.train], dtype=torch.float64)

    def objective(losses: list[torch.Tensor]) -> torch.Tensor:
        surrogates = torch.stack([propfair_surrogate(loss.mean(), ceiling) for loss in losses])
        return (sizes / sizes.sum() * surrogates).sum()

    expected = -LR * pooled_gradient(federation, start, objective)
    assert torch.allclose(move, expected, rtol=1e-10, atol=1e-13)


# ---------------------------------------------------------------- TERM


def test_term_round_is_the_tilted_risks_gradient_step_across_clients() -> None:
    # The normaliser sum_i exp(t l_i) spans every client's rows; one full-batch step must be
    # -lr * grad (1/t) log mean_i exp(t l_i) over the pooled rows, not each client's own tilted step.
    federation = synthetic_federation((40, 25, 15), num_classes=3, seed=2)
    tilt = 2.0
    start, move = second_move(run_term, federation, TERMSettings(tilt=tilt))

    def tilted(losses: list[torch.Tensor]) -> torch.Tensor:
        pooled = torch.cat(losses)
        return (torch.logsumexp(tilt * pooled, 0) - math.log(pooled.numel())) / tilt

    expected = -LR * pooled_gradient(federation, start, tilted)
    assert torch.allclose(move, expected, rtol=1e-10, atol=1e-13)
    fedavg = -LR * pooled_gradient(federation, start, lambda losses: torch.cat(losses).mean())
    assert float((expected - fedavg).abs().max()) > 1e-3, "the tilt must change the step for the test to mean anything"


def test_term_with_vanishing_tilt_is_fedavg() -> None:
    # exp(t l) = 1 + O(t): every weight is 1 to rounding at t = 1e-12, with mini-batches and local steps.
    federation = synthetic_federation((30, 20, 11))
    config = training(rounds=6, local_steps=3)
    term, _ = trajectory(run_term, task_on(federation, config), TERMSettings(tilt=1e-12))
    fedavg, _ = trajectory(run_fedavg, task_on(federation, config), FedAvgSettings())
    assert len(term) == len(fedavg) == 6
    for ours, theirs in zip(term, fedavg, strict=True):
        assert float((ours - theirs).abs().max()) <= 1e-10
    assert float((fedavg[-1] - fedavg[0]).abs().max()) > 1e-3, "the model must move for the test to mean anything"


# ---------------------------------------------------------------- Delta-FL


def test_deltafl_with_every_client_in_its_tail_is_fedavg() -> None:
    federation = synthetic_federation((30, 20, 11))
    config = training(rounds=6, local_steps=2)
    deltafl, _ = trajectory(run_deltafl, task_on(federation, config), DeltaFLSettings(client_level=1.0))
    fedavg, _ = trajectory(run_fedavg, task_on(federation, config), FedAvgSettings())
    for ours, theirs in zip(deltafl, fedavg, strict=True):
        assert float((ours - theirs).abs().max()) <= 1e-12


def test_deltafl_at_the_smallest_share_follows_the_worst_client_alone() -> None:
    # With a level below every client's share p_k the worst client's cap p_k / level exceeds 1: it is the tail.
    federation = synthetic_federation((40, 25, 15), num_classes=3, seed=4)
    start, move = second_move(run_deltafl, federation, DeltaFLSettings(client_level=0.05))
    means = [float(pooled_gradient_value(federation, start, index)) for index in range(3)]
    worst = int(np.argmax(means))
    expected = -LR * pooled_gradient(federation, start, lambda losses: losses[worst].mean())
    assert torch.allclose(move, expected, rtol=1e-10, atol=1e-13)
    everyone = -LR * pooled_gradient(federation, start, lambda losses: torch.cat(losses).mean())
    assert float((expected - everyone).abs().max()) > 1e-3, (
        "the tail must differ from everyone for the test to mean anything"
    )


def pooled_gradient_value(federation: Federation, theta: torch.Tensor, index: int) -> float:
    """Client `index`'s mean loss at theta."""
    _, learners = make_learners(federation, training(batch_size=0), None, options=F64)
    model = learners[0].model
    load_flat_parameters(model, theta)
    client = federation.train[index]
    with torch.no_grad():
        return float(learners[0].loss(model(client.features.double()), client.labels).mean())


@pytest.mark.parametrize("seed", range(5))
def test_superquantile_weights_solve_the_dual_linear_program(seed: int) -> None:
    rng = np.random.default_rng(seed)
    clients = 6
    losses, shares = rng.exponential(size=clients), rng.uniform(1.0, 5.0, size=clients)
    level = float(rng.uniform(0.05, 1.0))
    weights = superquantile_weights(losses, shares, level)
    caps = shares / shares.sum() / level
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(weights >= 0.0) and np.all(weights <= caps + 1e-15)
    best = linprog(-losses, A_eq=np.ones((1, clients)), b_eq=[1.0], bounds=list(zip(np.zeros(clients), caps)))
    assert float(weights @ losses) == pytest.approx(-best.fun, rel=1e-9)


def test_superquantile_level_one_is_the_client_shares_and_a_bad_level_is_refused() -> None:
    shares = np.array([3.0, 1.0, 4.0])
    assert superquantile_weights(np.array([0.2, 0.9, 0.5]), shares, 1.0) == pytest.approx(shares / 8.0, abs=1e-15)
    with pytest.raises(ConfigError, match="in \\(0, 1\\]"):
        superquantile_weights(np.ones(3), shares, 0.0)


# ---------------------------------------------------------------- FedAvgM and the command line


def test_fedavgm_with_momentum_zero_is_fedavg_exactly() -> None:
    federation = synthetic_federation((30, 20, 11))
    flags = ["--rounds", "5", "--batch-size", "12", "--dtype", "float64", "--lr", "0.3", "--local-steps", "2"]
    fedavg = run_method(config_from_flags([*flags, "--method", "fedavg"]), federation)
    plain = run_method(config_from_flags([*flags, "--method", "fedavgm", "--server-momentum", "0"]), federation)
    assert torch.equal(plain.theta, fedavg.theta)


def test_fedavgm_takes_the_heavy_ball_step_on_fedavgs_mean_update() -> None:
    # Full batches and one local step: FedAvg's mean update from theta is -lr grad F(theta) over the pooled
    # rows, so FedAvgM must move theta_{t+1} - theta_t = beta (theta_t - theta_{t-1}) - lr grad F(theta_t).
    federation = synthetic_federation((30, 20, 11))
    beta = 0.7
    flags = ["--rounds", "4", "--batch-size", "0", "--dtype", "float64", "--lr", "0.3", "--method", "fedavgm"]
    config = config_from_flags([*flags, "--server-momentum", str(beta)])
    thetas: list[torch.Tensor] = []
    run_method(config, federation, lambda state: thetas.append(state.theta.clone()))
    _, learners = make_learners(federation, training(batch_size=0), None, options=F64)
    thetas.insert(0, flat_parameters(learners[0].model).double())
    for t in range(1, 4):
        gradient = pooled_gradient(federation, thetas[t], lambda losses: torch.cat(losses).mean())
        expected = beta * (thetas[t] - thetas[t - 1]) - LR * gradient
        assert torch.allclose(thetas[t + 1] - thetas[t], expected, rtol=1e-10, atol=1e-13)
    assert float((thetas[2] - thetas[1]).norm()) > 1e-3


def test_the_baselines_step_defaults_keep_the_effective_step_under_momentum() -> None:
    fedavgm = config_from_flags(["--method", "fedavgm"])
    assert fedavgm.training.server_momentum == 0.9
    assert fedavgm.training.local.lr == pytest.approx(0.5 * 0.25)
    term = config_from_flags(["--method", "term", "--tilt", "3", "--server-momentum", "0.9"])
    assert term.training.local.lr == pytest.approx(0.125)
    assert term.settings == TERMSettings(tilt=3.0)
    assert config_from_flags(["--method", "propfair"]).training.local.lr == 0.5
    with pytest.raises(ConfigError, match="--server-momentum sets the server step of fedsrcvar, fedavgm"):
        config_from_flags(["--method", "afl", "--server-momentum", "0.9"])
    with pytest.raises(ConfigError, match="--tilt sets TERM's tilt; drop it for --method propfair"):
        config_from_flags(["--method", "propfair", "--tilt", "1"])
    with pytest.raises(ConfigError, match="ceiling M must be a number above"):
        config_from_flags(["--method", "propfair", "--ceiling", "0.1"])
