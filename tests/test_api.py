"""fedfair.api.federate: the caller's model and data in, a trained model and its threshold out."""

from __future__ import annotations

import pytest

import torch
from torch import nn
from torch.nn import functional

from fedfair.api import federate
from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.models import flat_parameters
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import run_fedsrcvar


@pytest.mark.slow
def test_federate_returns_the_algorithms_averaged_model_and_threshold(small_adult_federation: Federation) -> None:
    features = small_adult_federation.num_features

    def network() -> nn.Module:
        return nn.Sequential(nn.Linear(features, 16), nn.ReLU(), nn.Linear(16, 2))

    clients = [(client.features, client.labels) for client in small_adult_federation.train]
    result = federate(network, clients, rho=0.2, epsilon=0.1, rounds=20, local_steps=2, batch_size=64, record_every=10)
    training = TrainingConfig(rounds=20, batch_size=64, local=LocalConfig(local_steps=2))
    reference = run_fedsrcvar(
        small_adult_federation, ObjectiveConfig(epsilon=0.1, rho=0.2), training, model_factory=network
    ).state
    # The model holds theta-bar in its own dtype (float32 by default).
    assert torch.equal(flat_parameters(result.model), reference.theta_average.float())
    assert result.threshold == reference.c_average and result.state.c == reference.c
    assert not result.model.training and [record["round"] for record in result.history] == [10, 20]
    # The model is usable as is, and the smoothed objective it was trained on went down.
    with torch.no_grad():
        assert result.model(small_adult_federation.pooled("test").features).shape[1] == 2
    first, last = result.history
    assert last["train_objective_smooth_average"] < first["train_objective_smooth_average"]


def test_federate_takes_any_per_sample_loss_and_labels() -> None:
    """A regression: squared error on real-valued targets, the worst fifth of residuals protected."""
    generator = torch.Generator().manual_seed(0)
    weights = torch.tensor([1.0, -2.0, 0.5])
    clients = []
    for shift in (0.0, 1.0, 2.0):
        x = torch.randn(200, 3, generator=generator) + shift
        clients.append((x, x @ weights + 0.1 * torch.randn(200, generator=generator)))

    def squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return functional.mse_loss(outputs.squeeze(-1), targets, reduction="none")

    result = federate(
        lambda: nn.Linear(3, 1), clients, rho=0.2, epsilon=0.5, rounds=60, lr=0.05, batch_size=0, loss=squared_error
    )
    first, last = result.history[0], result.history[-1]
    assert last["mean_loss_last"] < 0.1 * first["mean_loss_last"]
    assert last["train_objective_last"] < first["train_objective_last"]
    assert torch.allclose(result.model.weight.detach().squeeze(0), weights, atol=0.2)
