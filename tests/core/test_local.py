"""A collaborator's local steps: sampling, weights, projection, reuse of one batch."""

from __future__ import annotations

import pytest
import torch

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.core.local import BatchSampler, LocalLearner
from fedfair.core.models import build_model, flat_parameters, per_sample_loss
from fedfair.core.objective import RCVaRThreshold
from fedfair.research.simulation import Federation


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
            head.c -= 0.3 * grads[-1]
            head.c.clamp_(0.0, 2.0)
    torch.testing.assert_close(update.delta, flat_parameters(model), rtol=1e-12, atol=1e-14)
    assert update.delta_c == pytest.approx(float(head.c.detach()) - 1.0, abs=1e-13)


def test_large_threshold_step_is_projected(small_adult_federation: Federation) -> None:
    objective = ObjectiveConfig(epsilon=0.0, rho=0.1, bound=2.0)
    learner = _learner(small_adult_federation, LocalConfig(local_steps=5, lr=0.1, threshold_lr=100.0), 16, objective)
    update = learner.train_round(torch.zeros(small_adult_federation.num_features + 1, dtype=torch.float64), 1.0)
    assert 0.0 <= 1.0 + update.delta_c <= 2.0
