"""Norm-only clipping: the same clipped sum as per-sample gradients, and which models get it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner
from fedfair.core.models import build_model, per_sample_loss
from fedfair.privacy.clipping import (
    NormClipping,
    choose_clipping,
    norm_clipping_blockers,
)
from tests.privacy.helpers import threshold_learner

FLOAT64_UNIT_ROUNDOFF = torch.finfo(torch.float64).eps / 2


def per_sample_gradients(learner: LocalLearner, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torch.func's gradient of each sample's objective in (theta, c), one row per sample."""
    model, head = learner.model, learner.threshold
    assert head is not None

    def one_sample(params: dict[str, torch.Tensor], c: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = per_sample_loss(functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0))
        objective: torch.Tensor = functional_call(head, {"c": c}, (loss,))
        return objective.sum()

    params = {name: parameter.detach() for name, parameter in model.named_parameters()}
    theta_grads, c_grads = vmap(grad(one_sample, argnums=(0, 1)), in_dims=(None, None, 0, 0))(
        params, head.c.detach(), features, labels
    )
    return torch.cat([theta_grads[name].flatten(1) for name in params] + [c_grads[:, None]], dim=1)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("model", ["mlp", "logreg"])
@pytest.mark.parametrize("clipped", [True, False])
def test_norm_clipping_sums_the_same_clipped_gradients_as_per_sample_gradients(model: str, clipped: bool) -> None:
    """(theta, c) jointly: sum_i min(1, C / (||g_i|| + 1e-6)) g_i from norms alone equals it from the g_i."""
    learner = threshold_learner(n=120, model=model)
    features, labels = learner.features, learner.labels
    assert learner.threshold is not None
    with torch.no_grad():
        learner.threshold.c.fill_(float(per_sample_loss(learner.model(features), labels).median()))
    per_sample = per_sample_gradients(learner, features, labels)
    norms = per_sample.norm(dim=1)
    # The median norm clips half the samples; twice the largest clips none.
    clip = float(norms.median()) if clipped else 2 * float(norms.max())
    factors = (clip / (norms + 1e-6)).clamp(max=1.0)
    assert bool((factors < 1.0).any()) == clipped and bool((factors == 1.0).any())
    expected = (factors[:, None] * per_sample).sum(0)

    heads = nn.ModuleList([learner.model, learner.threshold])
    NormClipping(heads, clip).backward(learner.objective(features, labels))
    actual = torch.cat([parameter.grad.flatten() for parameter in heads.parameters() if parameter.grad is not None])

    # Both sides are float64 sums of the same terms in another order. Each g_i (dot products of
    # at most K terms), each norm (over the P parameters, which moves the factor by at most
    # P * u relatively) and the sum over the B samples each add at most (count) * u of
    # sum_i f_i |g_ij| to a coordinate: the tolerance is their sum, far below 1e-10.
    batch, width, size = per_sample.shape[0], max(features.shape[1], 512 if model == "mlp" else 1), per_sample.shape[1]
    scale = (factors[:, None] * per_sample.abs()).sum(0).max()
    tolerance = float((batch + width + size) * FLOAT64_UNIT_ROUNDOFF * scale)
    assert tolerance < 1e-10
    assert actual.shape == expected.shape
    assert float((actual - expected).abs().max()) <= tolerance


def test_mode_is_norm_only_where_every_layer_allows_it() -> None:
    head = threshold_learner().threshold
    assert head is not None
    for model in ("logreg", "mlp"):
        assert choose_clipping(nn.ModuleList([build_model(model, 8, 2), head])) == "norm"
    convolution = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.LayerNorm(16), nn.Linear(16, 1))
    embedding = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(8, 1))
    assert choose_clipping(convolution) == choose_clipping(embedding) == "norm"
    assert choose_clipping(convolution, "per_sample") == "per_sample"

    group_norm = nn.Sequential(nn.Linear(8, 4), nn.GroupNorm(2, 4), nn.Linear(4, 1))
    assert norm_clipping_blockers(group_norm) == ["layer '1' (GroupNorm) has no per-sample gradient norm"]
    assert choose_clipping(group_norm) == "per_sample"
    with pytest.raises(ConfigError, match=r"layer '1' \(GroupNorm\).*'per_sample'"):
        choose_clipping(group_norm, "norm")

    tied = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    tied[1].weight = tied[0].weight
    assert choose_clipping(tied) == "per_sample"
    assert "shares a parameter with layer '0'" in norm_clipping_blockers(tied)[0]
    with pytest.raises(ConfigError, match="unknown clipping mode 'ghost'"):
        choose_clipping(tied, "ghost")
