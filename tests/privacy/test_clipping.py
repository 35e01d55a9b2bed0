"""Clipping in every mode (one-pass, two-pass, per-sample): the same clipped sum as torch.func's, and which models get it."""

from __future__ import annotations

import pytest
import torch
from opacus.layers import DPLSTM
from torch import nn
from torch.func import functional_call, grad, vmap

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner
from fedfair.core.models import build_model, per_sample_loss
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.clipping import (
    LayerClipping,
    NormClipping,
    OnePassClipping,
    PerSampleClipping,
    clipping_candidates,
    choose_clipping,
    norm_clipping_blockers,
    one_pass_blockers,
)
from tests.privacy.helpers import random_samples, threshold_learner

ClippingType = type[OnePassClipping] | type[NormClipping] | type[PerSampleClipping]

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


def clipped_backward(clipping: LayerClipping, learner: LocalLearner) -> None:
    """One step's forward and clipping backward pass over the learner's whole data, as PrivateLearner runs them."""
    with clipping.capturing():
        per_sample = learner.objective(learner.features, learner.labels)
    clipping.backward(per_sample)


@pytest.mark.parametrize("clipping_type", [OnePassClipping, NormClipping, PerSampleClipping])
@pytest.mark.parametrize("model", ["mlp", "logreg"])
@pytest.mark.parametrize("clipped", [True, False])
def test_norm_clipping_sums_the_same_clipped_gradients_as_per_sample_gradients(
    clipping_type: ClippingType, model: str, clipped: bool
) -> None:
    """(theta, c) jointly: sum_i min(1, C / (||g_i|| + 1e-6)) g_i from norms alone equals it from the g_i."""
    assert_same_clipped_sum(
        clipping_type, threshold_learner(n=120, model=model), clipped, width=512 if model == "mlp" else 1
    )


def sequence_learner(positions: tuple[int, ...]) -> LocalLearner:
    """A float64 learner whose first dense layer sees each sample as positions x 2 features (a 3-D or 4-D input)."""
    features, labels = random_samples(90, 8, seed=4)
    network = nn.Sequential(
        nn.Unflatten(1, (*positions, 2)), nn.Linear(2, 3), nn.Tanh(), nn.Flatten(), nn.Linear(12, 1)
    )
    head = RCVaRThreshold(ObjectiveConfig(epsilon=0.2, rho=0.3, bound=3.0), dtype=torch.float64)
    return LocalLearner(network.double(), features, labels, 10, LocalConfig(), threshold=head)


@pytest.mark.parametrize("positions", [(4,), (2, 2)])
def test_one_pass_clipping_of_dense_layers_on_sequences_sums_the_same_clipped_gradients(
    positions: tuple[int, ...],
) -> None:
    """A dense layer applied at every position: its norm from Gram matrices, its sum over samples and positions."""
    assert_same_clipped_sum(OnePassClipping, sequence_learner(positions), clipped=True, width=12)


def assert_same_clipped_sum(clipping_type: ClippingType, learner: LocalLearner, clipped: bool, width: int) -> None:
    """The clipped sum of `clipping_type` over the learner's data equals torch.func's to the float64 rounding bound."""
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
    clipped_backward(clipping_type(heads, clip), learner)
    actual = torch.cat([parameter.grad.flatten() for parameter in heads.parameters() if parameter.grad is not None])

    # Both sides are float64 sums of the same terms in another order. Each g_i (dot products of
    # at most K terms), each norm (over the P parameters, which moves the factor by at most
    # P * u relatively) and the sum over the B samples each add at most (count) * u of
    # sum_i f_i |g_ij| to a coordinate: the tolerance is their sum, far below 1e-10.
    # `width`: the longest dot product inside one g_i (a hidden layer's width, or its positions times outputs).
    batch, width, size = per_sample.shape[0], max(features.shape[1], width), per_sample.shape[1]
    scale = (factors[:, None] * per_sample.abs()).sum(0).max()
    tolerance = float((batch + width + size) * FLOAT64_UNIT_ROUNDOFF * scale)
    assert tolerance < 1e-10
    assert actual.shape == expected.shape
    assert float((actual - expected).abs().max()) <= tolerance


def test_mode_is_one_pass_for_dense_models_and_norm_only_where_every_layer_allows_it() -> None:
    head = threshold_learner().threshold
    assert head is not None
    for model in ("logreg", "mlp"):
        dense = nn.ModuleList([build_model(model, 8, 2), head])
        assert choose_clipping(dense) == choose_clipping(dense, "one_pass") == "one_pass"
        assert choose_clipping(dense, "norm") == "norm"
    convolution = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.LayerNorm(16), nn.Linear(16, 1))
    embedding = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(8, 1))
    assert choose_clipping(convolution) == choose_clipping(embedding) == "norm"
    assert choose_clipping(convolution, "per_sample") == "per_sample"
    assert one_pass_blockers(convolution) == [
        "layer '0' (Conv2d) is neither a dense layer (nn.Linear) nor the threshold",
        "layer '2' (LayerNorm) is neither a dense layer (nn.Linear) nor the threshold",
    ]
    with pytest.raises(ConfigError, match=r"one-pass.*layer '0' \(Embedding\).*'norm'"):
        choose_clipping(embedding, "one_pass")
    with pytest.raises(ConfigError, match=r"layer '0' \(Conv2d\)"):
        OnePassClipping(convolution, 1.0)

    group_norm = nn.Sequential(nn.Linear(8, 4), nn.GroupNorm(2, 4), nn.Linear(4, 1))
    assert norm_clipping_blockers(group_norm) == []
    assert clipping_candidates(group_norm) == ["norm", "per_sample"]  # "auto" times the two (test_residual)
    prelu = nn.Sequential(nn.Linear(8, 4), nn.PReLU(4), nn.Linear(4, 1))
    assert norm_clipping_blockers(prelu) == ["layer '1' (PReLU) has no per-sample gradient norm"]
    assert choose_clipping(prelu) == "per_sample"
    with pytest.raises(ConfigError, match=r"layer '1' \(PReLU\).*'per_sample'"):
        choose_clipping(prelu, "norm")

    tied = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    tied[1].weight = tied[0].weight
    assert choose_clipping(tied) == "per_sample"
    assert "shares a parameter with layer '0'" in norm_clipping_blockers(tied)[0]
    assert "shares a parameter with layer '0'" in one_pass_blockers(tied)[0]
    with pytest.raises(ConfigError, match="unknown clipping mode 'ghost'"):
        choose_clipping(tied, "ghost")


def test_one_pass_clipping_records_only_the_step_forward_and_refuses_what_it_cannot_read() -> None:
    """Forward passes outside `capturing()` leave nothing behind; an output changed in place is read as it was
    made; a layer run twice, an input changed in place, a layer outside the objective and a second set of hooks
    are refused, each naming the way out."""
    learner = threshold_learner(n=40, model="mlp")
    assert learner.threshold is not None
    heads = nn.ModuleList([learner.model, learner.threshold])
    clipping = OnePassClipping(heads, 1.0)
    learner.objective(learner.features, learner.labels).sum().backward()  # e.g. someone's evaluation with gradients
    for parameter in heads.parameters():
        parameter.grad = None
    clipped_backward(clipping, learner)
    assert all(parameter.grad is not None for parameter in heads.parameters())
    with pytest.raises(ConfigError, match="already has clipping hooks"):
        OnePassClipping(heads, 1.0)

    twice = nn.Linear(8, 8).double()
    with (
        pytest.raises(NotImplementedError, match=r"layer '' \(Linear\) ran twice"),
        OnePassClipping(twice, 1.0).capturing(),
    ):
        twice(twice(learner.features))

    # An output changed in place is read where it entered the graph: the same sum as out of place.
    sums = []
    for inplace in (True, False):
        torch.manual_seed(2)
        changed = nn.Sequential(nn.Linear(8, 4), nn.ReLU(inplace=inplace), nn.Linear(4, 1)).double()
        clipping = OnePassClipping(changed, 1.0)
        with clipping.capturing():
            outputs = changed(learner.features).squeeze(1)
        clipping.backward(outputs)
        sums.append(torch.cat([p.grad.flatten() for p in changed.parameters() if p.grad is not None]))
    assert torch.equal(sums[0], sums[1]) and float(sums[0].abs().max()) > 0
    # A layer run without gradients leaves no backprop to read: refused, naming it.
    with (
        pytest.raises(ConfigError, match=r"layer '0' \(Linear\) returned no tensor in the autograd graph"),
        torch.no_grad(),
        clipping.capturing(),
    ):
        changed(learner.features)
    # An input changed in place after its layer ran is not what the layer saw: refused.
    dense = nn.Linear(8, 1).double()
    clipping = OnePassClipping(dense, 1.0)
    inputs = learner.features.clone()
    with clipping.capturing():
        outputs = dense(inputs).squeeze(1)
    inputs.mul_(2.0)
    with pytest.raises(ConfigError, match=r"input of layer\(s\) '' was modified in place"):
        clipping.backward(outputs)

    unused = nn.ModuleList([nn.Linear(8, 1), nn.Linear(8, 1)]).double()
    clipping = OnePassClipping(unused, 1.0)
    with clipping.capturing():
        outputs = unused[0](learner.features).squeeze(1)
        unused[1](learner.features)
    with pytest.raises(ConfigError, match=r"layer\(s\) '1' took no part.*requires_grad = False"):
        clipping.backward(outputs)


@pytest.mark.parametrize("clipping_type", [OnePassClipping, PerSampleClipping])
@pytest.mark.parametrize("model", ["mlp", "logreg"])
def test_theta_and_c_are_clipped_separately_when_asked(
    clipping_type: type[OnePassClipping] | type[PerSampleClipping], model: str
) -> None:
    """With a threshold bound, theta's per-sample gradient is clipped to C on its own norm and c's to C_c:
    sum_i min(1, C / (||g_i,theta|| + 1e-6)) g_i,theta and sum_i min(1, C_c / (|g_i,c| + 1e-6)) g_i,c."""
    learner = threshold_learner(n=120, model=model)
    gradients = per_sample_gradients(learner, learner.features, learner.labels)
    theta, c = gradients[:, :-1], gradients[:, -1]
    norm, threshold_norm = float(theta.norm(dim=1).median()), float(c.abs().median())
    expected_theta = ((norm / (theta.norm(dim=1) + 1e-6)).clamp(max=1.0)[:, None] * theta).sum(dim=0)
    expected_c = ((threshold_norm / (c.abs() + 1e-6)).clamp(max=1.0) * c).sum()
    heads = nn.ModuleList([learner.model, learner.threshold])
    clipped_backward(clipping_type(heads, norm, threshold_norm=threshold_norm), learner)
    assert learner.threshold is not None and learner.threshold.c.grad is not None
    summed = torch.cat(
        [parameter.grad.flatten() for parameter in learner.model.parameters() if parameter.grad is not None]
    )
    scale = float(gradients.abs().sum())
    assert torch.allclose(summed, expected_theta, rtol=0, atol=64 * FLOAT64_UNIT_ROUNDOFF * scale)
    assert abs(float(learner.threshold.c.grad) - float(expected_c)) <= 64 * FLOAT64_UNIT_ROUNDOFF * scale


class Recurrent(nn.Module):
    """An embedding, Opacus' DPLSTM (whose cells run once per position) and a dense head on sequences of 6 tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 4)
        self.lstm = DPLSTM(4, 5, batch_first=True)
        self.out = nn.Linear(5, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embedding(tokens))
        logits: torch.Tensor = self.out(hidden[:, -1]).squeeze(-1)
        return logits


def test_per_sample_clipping_sums_each_layer_over_its_calls_as_a_recurrent_network_needs() -> None:
    """DPLSTM's cells run at every position (and DPLSTM names their weights again): per-sample clipping sums
    every call's part of g_i, and equals the per-sample autograd reference clipped and summed."""
    torch.manual_seed(0)
    network = Recurrent().double()
    assert clipping_candidates(network) == ["per_sample"]
    tokens = torch.randint(0, 20, (7, 6), generator=torch.Generator().manual_seed(1))
    rows = []
    for i in range(tokens.shape[0]):
        gradients = torch.autograd.grad(network(tokens[i : i + 1]).square().sum(), list(network.parameters()))
        rows.append(torch.cat([gradient.flatten() for gradient in gradients]))
    per_sample = torch.stack(rows)
    norms = per_sample.norm(dim=1)
    clip = float(norms.median())
    factors = (clip / (norms + 1e-6)).clamp(max=1.0)
    expected = (factors[:, None] * per_sample).sum(0)
    clipping = PerSampleClipping(network, clip)
    with clipping.capturing():
        objectives = network(tokens).square()
    clipping.backward(objectives)
    actual = torch.cat([parameter.grad.flatten() for parameter in network.parameters() if parameter.grad is not None])
    # As in assert_same_clipped_sum: float64 sums over at most (positions x width), the P parameters and B samples.
    batch, size = per_sample.shape
    scale = float((factors[:, None] * per_sample.abs()).sum(0).max())
    tolerance = (batch + 6 * 20 + size) * FLOAT64_UNIT_ROUNDOFF * scale
    assert actual.shape == expected.shape
    assert float((actual - expected).abs().max()) <= tolerance
