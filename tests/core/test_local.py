"""A collaborator's local steps: sampling, weights, projection, reuse of one batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedfair.core import server
from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.core.local import BatchSampler, LocalLearner, contributing_updates
from fedfair.core.update import Update
from fedfair.core.models import build_model, flat_parameters, per_sample_loss
from fedfair.core.objective import RCVaRThreshold
from fedfair.simulation.federation import Federation


def test_sampler_visits_every_sample_once_per_pass() -> None:
    sampler = BatchSampler(num_samples=10, batch_size=5, seed=3)
    first_pass = torch.cat([sampler.next_batch(), sampler.next_batch()])
    assert sorted(first_pass.tolist()) == list(range(10))


def test_sampler_is_deterministic_per_seed() -> None:
    a, b = BatchSampler(100, 7, seed=1), BatchSampler(100, 7, seed=1)
    assert all(torch.equal(a.next_batch(), b.next_batch()) for _ in range(40))


def test_sampler_full_batch_means_whole_set() -> None:
    assert BatchSampler(10, 10, seed=0).next_batch() is None


@pytest.mark.parametrize("batch_size", [0, 11])
def test_sampler_refuses_impossible_batch_sizes(batch_size: int) -> None:
    with pytest.raises(ConfigError, match="batch size"):
        BatchSampler(10, batch_size, seed=0)


@pytest.mark.parametrize(("kwargs", "fragment"), [({"local_steps": 0}, "local steps"), ({"lr": 0.0}, "lr must be")])
def test_local_config_validation(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        LocalConfig(**kwargs)


def _learner(federation: Federation, config: LocalConfig, batch_size: int, objective: ObjectiveConfig) -> LocalLearner:
    client = federation.train[1]
    model = build_model("logreg", federation.num_features, 2, dtype=torch.float64)
    threshold = RCVaRThreshold(objective, dtype=torch.float64)
    return LocalLearner(model, client.features, client.labels, batch_size, config, threshold=threshold, seed=5)


def test_update_is_the_change_from_the_global_pair_with_weight_b(small_adult_federation: Federation) -> None:
    objective = ObjectiveConfig(epsilon=0.3, rho=0.2, bound=3.0)
    learner = _learner(small_adult_federation, LocalConfig(local_steps=3, lr=0.2, threshold_lr=0.2), 32, objective)
    theta = torch.full((small_adult_federation.num_features + 1,), 0.01, dtype=torch.float64)
    update = learner.train_round(theta, 1.5)
    assert update.weight == 32.0
    # theta_k - theta_t is one float64 subtraction: adding theta_t back is exact to an ulp.
    torch.testing.assert_close(theta + update.delta, flat_parameters(learner.model), rtol=0, atol=1e-15)
    assert 0.0 <= 1.5 + update.delta_c <= 3.0
    assert update.delta.abs().sum() > 0


def test_reused_batch_equals_manual_steps_on_that_batch(small_adult_federation: Federation) -> None:
    """With reuse_batch the tau steps all see the first drawn batch, as the algorithm box reads."""
    objective = ObjectiveConfig(epsilon=0.1, rho=0.3, bound=2.0)
    config = LocalConfig(local_steps=4, lr=0.5, threshold_lr=0.3, reuse_batch=True)
    learner = _learner(small_adult_federation, config, 40, objective)
    theta = torch.zeros(small_adult_federation.num_features + 1, dtype=torch.float64)
    batch = BatchSampler(learner.num_samples, 40, seed=5).next_batch()
    update = learner.train_round(theta, 1.0)

    features, labels = learner.features[batch], learner.labels[batch]
    model = build_model("logreg", small_adult_federation.num_features, 2, dtype=torch.float64)
    head = RCVaRThreshold(objective, c=1.0, dtype=torch.float64)
    for _ in range(4):
        value = head(per_sample_loss(model(features), labels)).mean()
        grads = torch.autograd.grad(value, [*model.parameters(), head.c])
        with torch.no_grad():
            for parameter, grad in zip(model.parameters(), grads[:-1]):
                parameter -= 0.5 * grad
            head.c -= 0.3 * grads[-1]  # unprojected within the round, as Algorithm 1 leaves it
    torch.testing.assert_close(update.delta, flat_parameters(model), rtol=1e-12, atol=1e-14)
    assert update.delta_c == pytest.approx(float(head.c.detach()) - 1.0, abs=1e-13)


def test_c_leaves_the_box_within_a_round_unless_projected_locally(small_adult_federation: Federation) -> None:
    objective = ObjectiveConfig(epsilon=0.0, rho=0.1, bound=2.0)
    theta = torch.zeros(small_adult_federation.num_features + 1, dtype=torch.float64)
    ends = []
    for project_locally in (False, True):
        config = LocalConfig(local_steps=5, lr=0.1, threshold_lr=100.0, project_locally=project_locally)
        ends.append(1.0 + _learner(small_adult_federation, config, 16, objective).train_round(theta, 1.0).delta_c)
    assert ends[0] > 2.0, "Algorithm 1 leaves c unconstrained within a round (the server projects)"
    assert 0.0 <= ends[1] <= 2.0


# ------------------------------------------------- Algorithm 1's projection, where it binds

TINY_CLIENTS = (
    (torch.tensor([[1.0], [2.0], [-1.0]], dtype=torch.float64), torch.tensor([1, 0, 1])),
    (torch.tensor([[0.5], [-2.0]], dtype=torch.float64), torch.tensor([0, 0])),
)
TINY_OBJECTIVE = ObjectiveConfig(epsilon=0.2, rho=0.5, gamma=0.05, bound=0.3)
TINY_LOCAL = LocalConfig(local_steps=3, lr=0.5, threshold_lr=0.25)
TINY_ROUNDS = 3


def independent_algorithm_1(
    *, project_locally: bool, project_at_server: bool
) -> tuple[list[torch.Tensor], list[float]]:
    """(theta^1..theta^{T+1}, c^1..c^{T+1}) of full-batch Algorithm 1 on TINY_CLIENTS, from the formulas alone.

    theta = (w, b) of a logistic model, l = log(1 + exp(-(2y - 1)(w x + b))), s(u) = gamma log(1 + e^{u / gamma}),
    f = (1 - eps)(c + s(l - c) / rho) + eps l; client weights b_k = n_k; c^1 = B.
    """
    eps, rho, gamma, bound = TINY_OBJECTIVE.epsilon, TINY_OBJECTIVE.rho, TINY_OBJECTIVE.gamma, TINY_OBJECTIVE.bound
    lr, threshold_lr = TINY_LOCAL.lr, TINY_LOCAL.threshold_lr
    thetas, cs = [torch.zeros(2, dtype=torch.float64)], [bound]
    for _ in range(TINY_ROUNDS):
        ends = []
        for features, labels in TINY_CLIENTS:
            theta, c = thetas[-1].clone(), torch.tensor(cs[-1], dtype=torch.float64)
            for _ in range(TINY_LOCAL.local_steps):
                theta.requires_grad_(True)
                c.requires_grad_(True)
                margin = (2.0 * labels - 1.0) * (features[:, 0] * theta[0] + theta[1])
                loss = torch.log1p(torch.exp(-margin))
                smooth = gamma * torch.log1p(torch.exp((loss - c) / gamma))
                value = ((1 - eps) * (c + smooth / rho) + eps * loss).mean()
                grad_theta, grad_c = torch.autograd.grad(value, [theta, c])
                theta, c = (theta - lr * grad_theta).detach(), (c - threshold_lr * grad_c).detach()
                if project_locally:
                    c = c.clamp(0.0, bound)
            ends.append((theta, float(c), float(len(labels))))
        total = sum(weight for _, _, weight in ends)
        thetas.append(torch.stack([weight * end_theta for end_theta, _, weight in ends]).sum(0) / total)
        mean_c = sum(weight * end_c for _, end_c, weight in ends) / total
        cs.append(min(max(mean_c, 0.0), bound) if project_at_server else mean_c)
    return thetas, cs


def tiny_learners(config: LocalConfig, clients: tuple[tuple[torch.Tensor, torch.Tensor], ...]) -> list[LocalLearner]:
    """A full-batch float64 logistic-regression learner with an RCVaR head per client."""
    return [
        LocalLearner(
            build_model("logreg", 1, 2, dtype=torch.float64),
            features,
            labels,
            len(labels),
            config,
            threshold=RCVaRThreshold(TINY_OBJECTIVE, dtype=torch.float64),
        )
        for features, labels in clients
    ]


def federated_rounds(config: LocalConfig) -> server.ServerState:
    learners = tiny_learners(config, TINY_CLIENTS)
    state = server.init(torch.zeros(2, dtype=torch.float64), bound=TINY_OBJECTIVE.bound)
    for _ in range(TINY_ROUNDS):
        updates = [learner.train_round(state.theta, state.c) for learner in learners]
        state = server.apply(state, server.Aggregate.of(updates), bound=TINY_OBJECTIVE.bound, average_from=0)
    return state


@pytest.mark.parametrize("project_locally", [False, True])
def test_algorithm_1_projects_c_where_it_binds_as_written(project_locally: bool) -> None:
    """B = 0.3 lies below every loss (ln 2 at theta = 0), so each round's local steps push c above B.

    By default the federation is the paper's Algorithm 1 (only the server projects), with
    `project_locally` the per-step variant; each equals its independent computation to float64
    precision, including the output theta_bar = (1/T) sum_{t=1..T} theta^t, and differs from
    the others (no projection at all, and the other rule) by far more, so dropping or adding
    either projection fails the test.
    """
    state = federated_rounds(dataclasses.replace(TINY_LOCAL, project_locally=project_locally))
    rules = {
        "server only": independent_algorithm_1(project_locally=False, project_at_server=True),
        "local and server": independent_algorithm_1(project_locally=True, project_at_server=True),
        "none": independent_algorithm_1(project_locally=False, project_at_server=False),
    }
    thetas, cs = rules.pop("local and server" if project_locally else "server only")
    torch.testing.assert_close(state.theta, thetas[-1], rtol=0, atol=1e-12)
    assert state.c == pytest.approx(cs[-1], abs=1e-12)
    torch.testing.assert_close(state.theta_average, torch.stack(thetas[:-1]).mean(0), rtol=0, atol=1e-12)
    assert state.c_average == pytest.approx(sum(cs[:-1]) / TINY_ROUNDS, abs=1e-12)
    # The projection binds: unprojected, c ends far above B; projected, it sits on B.
    assert rules["none"][1][-1] > TINY_OBJECTIVE.bound + 0.2 and state.c == TINY_OBJECTIVE.bound
    for name, (other_thetas, _) in rules.items():
        assert float((other_thetas[-1] - state.theta).abs().max()) > 0.04, f"indistinguishable from {name}"


# ------------------------------------------------- drift correction: SCAFFOLD's control variates for theta and c

SCAFFOLD_LOCAL = dataclasses.replace(TINY_LOCAL, drift_correction="scaffold")


def test_drift_correction_choices_are_checked() -> None:
    with pytest.raises(ConfigError, match="unknown drift correction 'fedprox'; choose one of: none, scaffold"):
        LocalConfig(drift_correction="fedprox")


def drift_corrected_rounds(
    config: LocalConfig, clients: tuple[tuple[torch.Tensor, torch.Tensor], ...], rounds: int
) -> tuple[server.ServerState, list[LocalLearner], list[list[Update]]]:
    """`rounds` rounds of the core's learners and server on full local batches: (final state, learners, updates)."""
    learners = tiny_learners(config, clients)
    state = server.init(
        torch.zeros(2, dtype=torch.float64), bound=TINY_OBJECTIVE.bound, drift_correction=config.corrects_drift
    )
    history = []
    for _ in range(rounds):
        updates, _ = contributing_updates(learners, state.theta, state.c, control=state.control)
        history.append(updates)
        state = server.apply(state, server.Aggregate.of(updates), bound=TINY_OBJECTIVE.bound, average_from=0)
    return state, learners, history


def independent_scaffold(rounds: int) -> tuple[torch.Tensor, float, torch.Tensor]:
    """(theta^{T+1}, c^{T+1}, s^{T+1}) of full-batch SCAFFOLD (option II) on TINY_CLIENTS, from the formulas alone.

    Each local step is y <- y - lr_y (g_k(y) - s_k + s) with lr_y = lr for theta and threshold_lr for c;
    after tau steps s_k <- s_k - s + (x_t - y) / (tau lr_y); the server averages y and s_k with weights n_k
    and projects c onto [0, B].
    """
    eps, rho, gamma, bound = TINY_OBJECTIVE.epsilon, TINY_OBJECTIVE.rho, TINY_OBJECTIVE.gamma, TINY_OBJECTIVE.bound
    tau = SCAFFOLD_LOCAL.local_steps
    rates = torch.tensor([SCAFFOLD_LOCAL.lr, SCAFFOLD_LOCAL.lr, SCAFFOLD_LOCAL.threshold_lr], dtype=torch.float64)
    point = torch.tensor([0.0, 0.0, bound], dtype=torch.float64)  # (w, b, c)
    own = [torch.zeros(3, dtype=torch.float64) for _ in TINY_CLIENTS]
    shared = torch.zeros(3, dtype=torch.float64)
    weights = [float(len(labels)) for _, labels in TINY_CLIENTS]
    for _ in range(rounds):
        ends, new_own = [], []
        for (features, labels), control in zip(TINY_CLIENTS, own, strict=True):
            local = point.clone()
            for _ in range(tau):
                local.requires_grad_(True)
                margin = (2.0 * labels - 1.0) * (features[:, 0] * local[0] + local[1])
                loss = torch.log1p(torch.exp(-margin))
                smooth = gamma * torch.log1p(torch.exp((loss - local[2]) / gamma))
                value = ((1 - eps) * (local[2] + smooth / rho) + eps * loss).mean()
                (gradient,) = torch.autograd.grad(value, [local])
                local = (local - rates * (gradient - control + shared)).detach()
            ends.append(local)
            new_own.append(control - shared + (point - local) / (tau * rates))
        total = sum(weights)
        mean = sum(weight * end for weight, end in zip(weights, ends, strict=True)) / total
        shared = shared + sum(w * (n - o) for w, n, o in zip(weights, new_own, own, strict=True)) / total
        own = new_own
        point = torch.cat([mean[:2], mean[2:].clamp(0.0, bound)])
    return point[:2], float(point[2]), shared


def test_drift_corrected_rounds_equal_scaffold_written_from_its_formulas() -> None:
    """theta, c and the server's control variate after 4 rounds of tau = 3 match an independent SCAFFOLD,
    and differ clearly from the uncorrected rounds, so a correction left out or misplaced fails."""
    state, _, _ = drift_corrected_rounds(SCAFFOLD_LOCAL, TINY_CLIENTS, 4)
    theta, c, control = independent_scaffold(4)
    torch.testing.assert_close(state.theta, theta, rtol=0, atol=1e-12)
    assert state.c == pytest.approx(c, abs=1e-12)
    assert state.control is not None
    rates = torch.tensor([SCAFFOLD_LOCAL.lr, SCAFFOLD_LOCAL.lr, SCAFFOLD_LOCAL.threshold_lr], dtype=torch.float64)
    torch.testing.assert_close(state.control, rates * control, rtol=0, atol=1e-12)  # fedfair keeps it in step units
    plain, _, _ = drift_corrected_rounds(TINY_LOCAL, TINY_CLIENTS, 4)
    assert plain.control is None
    assert float((plain.theta - state.theta).abs().max()) > 1e-3


def test_the_servers_control_variate_is_the_weighted_mean_of_the_collaborators() -> None:
    state, learners, history = drift_corrected_rounds(SCAFFOLD_LOCAL, TINY_CLIENTS, 3)
    weights = [float(len(labels)) for _, labels in TINY_CLIENTS]
    controls = [learner.control for learner in learners]
    assert all(control is not None for control in controls)
    mean = sum(w * control for w, control in zip(weights, controls, strict=True) if control is not None) / sum(weights)
    assert state.control is not None
    torch.testing.assert_close(state.control, mean, rtol=0, atol=1e-12)
    assert all(update.control is not None and update.control.shape == (3,) for update in history[-1])


def test_one_local_step_on_identical_clients_is_left_unchanged_by_the_correction() -> None:
    """tau = 1 and equal clients: every s_k equals s, so each round is the uncorrected one."""
    identical = (TINY_CLIENTS[0], TINY_CLIENTS[0])
    one_step = dataclasses.replace(TINY_LOCAL, local_steps=1)
    corrected = drift_corrected_rounds(dataclasses.replace(one_step, drift_correction="scaffold"), identical, 4)
    plain = drift_corrected_rounds(one_step, identical, 4)
    for with_control, without in zip(corrected[2], plain[2], strict=True):
        for update, expected in zip(with_control, without, strict=True):
            torch.testing.assert_close(update.delta, expected.delta, rtol=0, atol=1e-12)
            assert update.delta_c == pytest.approx(expected.delta_c, abs=1e-12)
    assert float(plain[0].theta.abs().max()) > 0.1, "the rounds must have moved theta for the test to mean anything"


def test_a_control_variate_the_learner_cannot_use_is_refused() -> None:
    theta = torch.zeros(2, dtype=torch.float64)
    plain = tiny_learners(TINY_LOCAL, TINY_CLIENTS)[0]
    with pytest.raises(ConfigError, match="does not correct drift"):
        plain.begin(theta, 0.2, torch.zeros(3, dtype=torch.float64))
    corrected = tiny_learners(SCAFFOLD_LOCAL, TINY_CLIENTS)[0]
    with pytest.raises(ConfigError, match="has 5 entries, this model needs 3"):
        corrected.begin(theta, 0.2, torch.zeros(5, dtype=torch.float64))
