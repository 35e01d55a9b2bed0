"""Vectorised clients: the loop's batches, the loop's updates up to float reduction order, the loop's rounds.

The federations are Adult cut into many collaborators: 51 by Dirichlet label skew (uneven
sizes, so the padded batches carry padding) and 42 by native country (one client per
country, from tens of thousands of rows down to one, so some clients take full batches).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest
import torch
from torch import nn

from fedfair.core import server
from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.local import LocalLearner
from fedfair.core.update import Update
from fedfair.core.models import flat_parameters, per_sample_loss
from fedfair.datasets import load_dataset, partition
from fedfair.privacy.config import PrivacyConfig
from fedfair.simulation.federation import Federation, federation_from_arrays
from fedfair.simulation.rounds import SimulationOptions, batched_clients, make_learners, run_rounds
from fedfair.simulation.secure import SecureSum
from fedfair.simulation.vectorised import VectorisedClients, size_groups
from fedfair.secagg import EncodingConfig

F64 = SimulationOptions(dtype="float64")

FLOAT32_UNIT_ROUNDOFF = 2.0**-24


@cache
def adult_split(scheme: str, clients: int) -> Federation:
    """Adult split into `clients` collaborators by `scheme` (a column or "dirichlet")."""
    dataset = load_dataset("adult")
    splits = partition(dataset, scheme, clients, seed=0)
    train = [(dataset.x_train[split.train_index], dataset.y_train[split.train_index]) for split in splits]
    test = [(dataset.x_test[split.test_index], dataset.y_test[split.test_index]) for split in splits]
    return federation_from_arrays([split.name for split in splits], train, test, dataset.num_classes)


def states_per_round(
    federation: Federation, training: TrainingConfig, objective: ObjectiveConfig | None, *, vectorise: bool
) -> list[server.ServerState]:
    states: list[server.ServerState] = []
    result = run_rounds(federation, training, objective, options=F64, on_round=states.append, vectorise=vectorise)
    assert result.vectorised is vectorise
    return states


@pytest.mark.parametrize(
    ("scheme", "clients", "local"),
    [
        ("dirichlet", 51, LocalConfig()),
        ("native-country", 42, LocalConfig(local_steps=3, lr=0.2, threshold_lr=0.05)),
        ("dirichlet", 51, LocalConfig(local_steps=2, reuse_batch=True)),
    ],
)
def test_vectorised_rounds_equal_the_loop_to_float64_precision(scheme: str, clients: int, local: LocalConfig) -> None:
    """Every round's (theta, c) agrees with the loop's to 1e-12 (float64, same seed, 51 or 42 clients).

    Only the order of summation differs: one client's gradient sums b_k <= 1,100 terms of size
    at most ~10, so a step differs by at most ~b_k * 2^-53 * 10 * lr ~ 1e-13 per round, and the
    convex, contracting iteration does not amplify it over a few rounds.
    """
    federation = adult_split(scheme, clients)
    training = TrainingConfig(rounds=4, batch_size=2048, local=local, seed=3, average_from=0.0)
    objective = ObjectiveConfig(epsilon=0.2, rho=0.1, bound=2.0)
    vectorised = states_per_round(federation, training, objective, vectorise=True)
    looped = states_per_round(federation, training, objective, vectorise=False)
    for fast, slow in zip(vectorised, looped, strict=True):
        assert float((fast.theta - slow.theta).abs().max()) <= 1e-12
        assert float((fast.theta_average - slow.theta_average).abs().max()) <= 1e-12
        assert abs(fast.c - slow.c) <= 1e-12
    assert vectorised[-1].c < 2.0, "c must have moved off its bound for the test to exercise it"


@pytest.mark.slow
def test_vectorised_clients_follow_the_loops_projection_rule_where_it_binds() -> None:
    """B = 0.3 lies below every loss at the start, so local steps push c above B: each rule of
    projecting c (the server only, Algorithm 1's; or after every local step too) gives the loop's
    rounds to 1e-12, and the two rules give different models, so the rule is exercised."""
    federation = adult_split("dirichlet", 51)
    objective = ObjectiveConfig(epsilon=0.2, rho=0.1, bound=0.3)
    runs = []
    for project_locally in (False, True):
        local = LocalConfig(local_steps=2, lr=0.2, threshold_lr=0.5, project_locally=project_locally)
        training = TrainingConfig(rounds=2, batch_size=2048, local=local, seed=3, average_from=0.0)
        vectorised = states_per_round(federation, training, objective, vectorise=True)
        looped = states_per_round(federation, training, objective, vectorise=False)
        for fast, slow in zip(vectorised, looped, strict=True):
            assert float((fast.theta - slow.theta).abs().max()) <= 1e-12
            assert abs(fast.c - slow.c) <= 1e-12
        runs.append(vectorised)
    assert runs[0][0].c == 0.3, "the server projection must bind for the test to exercise it"
    assert float((runs[0][-1].theta - runs[1][-1].theta).abs().max()) > 1e-3


@pytest.mark.slow
def test_drift_corrected_vectorised_rounds_equal_the_loop_control_variates_included() -> None:
    """SCAFFOLD's correction is the algorithm's, so the batched clients gain it: every round's (theta, c)
    and the server's control variate sigma agree with the loop's to 1e-12 (float64; only the order of
    summation differs, as above), and sigma is far from zero, so the correction is exercised."""
    federation = adult_split("dirichlet", 51)
    local = LocalConfig(local_steps=3, lr=0.05, threshold_lr=0.05, drift_correction="scaffold")
    training = TrainingConfig(rounds=4, batch_size=2048, local=local, seed=3, average_from=0.0)
    objective = ObjectiveConfig(epsilon=0.2, rho=0.1, bound=2.0)
    vectorised = states_per_round(federation, training, objective, vectorise=True)
    looped = states_per_round(federation, training, objective, vectorise=False)
    for fast, slow in zip(vectorised, looped, strict=True):
        assert fast.control is not None and slow.control is not None
        assert float((fast.theta - slow.theta).abs().max()) <= 1e-12
        assert float((fast.control - slow.control).abs().max()) <= 1e-12
        assert abs(fast.c - slow.c) <= 1e-12
    assert float(looped[-1].control.abs().max()) > 1e-3


def test_fedavg_without_a_threshold_vectorises_too() -> None:
    federation = adult_split("dirichlet", 51)
    training = TrainingConfig(rounds=3, batch_size=1024)
    vectorised = states_per_round(federation, training, None, vectorise=True)[-1]
    looped = states_per_round(federation, training, None, vectorise=False)[-1]
    assert float((vectorised.theta - looped.theta).abs().max()) <= 1e-12
    assert vectorised.c == looped.c == 0.0


def test_each_client_draws_the_loops_batches_and_makes_the_loops_update() -> None:
    """One float32 round from theta = 0, client by client, against the loop's learners.

    At theta = 0 every logit is exactly 0, so the forward pass is exact in both and the
    updates differ only in how the backward pass sums client k's b_k per-sample gradients
    g_i: by at most lr * gamma(b_k) * mean_i |g_i| per coordinate, gamma(n) = n u / (1 - n u)
    (the classical bound for a reordered sum; the 1/b_k scaling and the step add two more u).
    Afterwards both sets of samplers hand out the same next batch: the same generator, drawn
    in the same order.
    """
    federation = adult_split("dirichlet", 51)
    training = TrainingConfig(rounds=1, batch_size=1024)
    objective = ObjectiveConfig(epsilon=0.3, rho=0.2)
    template, vectorised_learners = make_learners(federation, training, objective)
    _, loop_learners = make_learners(federation, training, objective)
    clients, reason = batched_clients(vectorised_learners, private=False, vectorise=True)
    assert clients is not None and reason == ""
    theta = flat_parameters(template).double()
    stacked = clients.train_round(theta, objective.bound)
    batches = [learner.sampler.next_batch() for learner in loop_learners]
    for learner, update, batch in zip(loop_learners, stacked.updates(), batches, strict=True):
        expected = loop_round_on(learner, theta, objective.bound, batch)
        bound = per_sample_gradient_bound(learner, theta, objective.bound, batch)
        terms = (learner.batch_size + 2) * FLOAT32_UNIT_ROUNDOFF
        gamma = terms / (1 - terms)
        assert ((update.delta - expected.delta).abs() <= learner.config.lr * gamma * bound[:-1]).all()
        assert abs(update.delta_c - expected.delta_c) <= learner.config.threshold_lr * gamma * float(bound[-1]) + 1e-12
        assert update.weight == expected.weight
    _, fresh = make_learners(federation, training, objective)
    for used, unused in zip(vectorised_learners, fresh, strict=True):
        unused.sampler.next_batch()
        assert torch.equal(as_indices(used.sampler.next_batch(), used), as_indices(unused.sampler.next_batch(), unused))


def as_indices(batch: torch.Tensor | None, learner: LocalLearner) -> torch.Tensor:
    return torch.arange(learner.num_samples) if batch is None else batch


class FixedBatch:
    """A sampler that hands out one given batch: the loop's learner on the batch the test drew for it."""

    def __init__(self, batch: torch.Tensor | None) -> None:
        self.batch = batch

    def next_batch(self) -> torch.Tensor | None:
        return self.batch


def loop_round_on(learner: LocalLearner, theta: torch.Tensor, c: float, batch: torch.Tensor | None) -> Update:
    """The loop's round for this learner, on the given batch."""
    learner.sampler = FixedBatch(batch)  # type: ignore[assignment]
    return learner.train_round(theta, c)


def per_sample_gradient_bound(
    learner: LocalLearner, theta: torch.Tensor, c: float, batch: torch.Tensor | None
) -> torch.Tensor:
    """mean_i |grad f_i| per coordinate of (theta, c), in float64, over the client's batch."""
    index = as_indices(batch, learner)
    features, labels = learner.features[index].double(), learner.labels[index]
    weight = theta[:-1].view(1, -1).clone().requires_grad_(True)
    bias = theta[-1:].clone().requires_grad_(True)
    threshold = torch.tensor(c, dtype=torch.float64, requires_grad=True)
    assert learner.threshold is not None
    gradients = []
    for row, label in zip(features, labels, strict=True):
        loss = per_sample_loss(torch.nn.functional.linear(row.unsqueeze(0), weight, bias), label.unsqueeze(0))
        value = torch.func.functional_call(learner.threshold, {"c": threshold}, (loss,)).sum()
        grads = torch.autograd.grad(value, [weight, bias, threshold])
        gradients.append(torch.cat([grads[0].reshape(-1), grads[1], grads[2].reshape(1)]).abs())
    return torch.stack(gradients).mean(dim=0).float()


def test_the_direct_plain_sum_is_the_loops_aggregate_bit_for_bit() -> None:
    federation = adult_split("dirichlet", 51)
    training = TrainingConfig(rounds=1, batch_size=1024)
    template, learners = make_learners(federation, training, ObjectiveConfig())
    clients, _ = batched_clients(learners, private=False, vectorise=True)
    assert clients is not None
    stacked = clients.train_round(flat_parameters(template).double() + 0.01, 1.5)
    direct, of_updates = stacked.plain_sum(), server.Aggregate.of(stacked.updates())
    assert torch.equal(direct.weighted_delta, of_updates.weighted_delta)
    assert direct.weighted_delta_c == of_updates.weighted_delta_c and direct.total_weight == of_updates.total_weight


class BatchStatistics(nn.Module):
    """Centres each feature on its batch mean: samples interact, so padding would change the losses."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x - x.mean(dim=0, keepdim=True))
        return out


@pytest.mark.parametrize(
    ("factory", "reason"),
    [
        (lambda features: nn.Sequential(nn.Linear(features, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)), "buffers"),
        (lambda features: nn.Sequential(nn.Linear(features, 4), nn.Dropout(0.5), nn.Linear(4, 1)), "vmap"),
        (BatchStatistics, "joins its batch"),
    ],
)
def test_models_that_do_not_vectorise_keep_the_loop_and_say_why(
    factory: Callable[[int], nn.Module], reason: str
) -> None:
    federation = adult_split("iid", 8)
    features = federation.num_features
    result = run_rounds(
        federation,
        TrainingConfig(rounds=2, batch_size=256),
        ObjectiveConfig(),
        model_factory=lambda: factory(features),
        loss=per_sample_loss,
    )
    assert not result.vectorised and reason in result.loop_reason


def test_private_federations_keep_the_loop(small_adult_federation: Federation) -> None:
    result = run_rounds(
        small_adult_federation,
        TrainingConfig(rounds=1, batch_size=64),
        ObjectiveConfig(),
        privacy=PrivacyConfig(enabled=True, noise_multiplier=1.0),
    )
    assert not result.vectorised and "DP-SGD" in result.loop_reason


def test_three_uneven_clients_keep_the_faster_loop(small_adult_federation: Federation) -> None:
    result = run_rounds(small_adult_federation, TrainingConfig(rounds=1, batch_size=64), ObjectiveConfig())
    assert not result.vectorised and "too few" in result.loop_reason


def test_secure_sums_of_vectorised_updates_match_the_plain_sum() -> None:
    """The masked sum of the vectorised clients' updates moves theta by at most the encoding's error.

    The bound is test_rounds': each round's decoded sum errs by e_r per coordinate, the
    mean update by at most e_r (1 + clip) / (W - e_r), summed over the rounds.
    """
    federation = adult_split("iid", 6)
    objective = ObjectiveConfig(epsilon=0.1, rho=0.3)
    training = TrainingConfig(rounds=4, batch_size=240)
    secure = SecureSum(EncodingConfig(clip=10.0, max_weight=600.0, fractional_bits=24, modulus_bits=64))
    masked = run_rounds(federation, training, objective, options=F64, aggregate=secure)
    plain = run_rounds(federation, training, objective, options=F64)
    assert masked.vectorised and plain.vectorised
    bound = sum(error * (1 + 10.0) / (240.0 - error) for error in secure.error_bounds)
    assert len(secure.error_bounds) == 4 and 0 < bound < 1e-4
    assert float((masked.state.theta - plain.state.theta).abs().max()) <= bound
    assert abs(masked.state.c - plain.state.c) <= bound


def test_a_custom_model_and_loss_vectorise_and_match_the_loop() -> None:
    federation = adult_split("native-country", 42)
    features = federation.num_features

    def network() -> nn.Module:
        return nn.Sequential(nn.Linear(features, 8), nn.Tanh(), nn.Linear(8, 2))

    def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(outputs, labels, reduction="none")

    training = TrainingConfig(rounds=2, batch_size=512)
    runs = [
        run_rounds(
            federation, training, ObjectiveConfig(), options=F64, model_factory=network, loss=loss, vectorise=vectorise
        )
        for vectorise in (True, False)
    ]
    assert runs[0].vectorised and not runs[1].vectorised
    assert float((runs[0].state.theta - runs[1].state.theta).abs().max()) <= 1e-12


def test_an_empty_federation_cannot_be_vectorised() -> None:
    with pytest.raises(ValueError, match="at least one collaborator"):
        VectorisedClients([])


def test_size_groups_bound_the_padding() -> None:
    """Near-equal batches make one group; a huge client does not pad a crowd of tiny ones to its size."""
    assert size_groups([20] * 51) == [list(range(51))]
    sizes = [1800, 100, 50, 20, 3, 1, 1, 1, 1, 2, 5, 8, 30]
    groups = size_groups(sizes)
    assert sorted(client for group in groups for client in group) == list(range(len(sizes)))
    for group in groups:
        real = sum(sizes[client] for client in group)
        padded = max(sizes[client] for client in group) * len(group)
        assert padded - real <= real + 64 * len(group)
    assert len(groups) == 2
