"""Models: logistic regression, a one-hidden-layer MLP (512 units), a small CNN.

All are built only from layers DP-SGD can compute per-sample gradients for
(Linear, Conv2d, ReLU, pooling), so the same models serve the private path.
Binary tasks use one logit (true logistic regression, a unique optimum for the
convex reference solver); multi-class tasks use one logit per class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from fedfair.core.config import MODEL_NAMES
from fedfair.core.errors import ConfigError

MLP_HIDDEN_UNITS = 512


def output_units(num_classes: int) -> int:
    return 1 if num_classes == 2 else num_classes


def per_sample_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each sample; one logit means binary logistic loss."""
    if logits.shape[-1] == 1:
        # log(1 + exp(-z)) for label 1, log(1 + exp(z)) for label 0, written stably.
        signed = logits.squeeze(-1) * (1.0 - 2.0 * labels.to(logits.dtype))
        return F.softplus(signed)
    return F.cross_entropy(logits, labels, reduction="none")


def predict(logits: torch.Tensor) -> torch.Tensor:
    """Predicted class of each sample."""
    if logits.shape[-1] == 1:
        return (logits.squeeze(-1) > 0).long()
    return logits.argmax(dim=-1)


class SmallCNN(nn.Module):
    """Two 5x5 convolutions with max-pooling and one hidden dense layer, for 28x28 images."""

    def __init__(self, image_shape: Sequence[int], outputs: int) -> None:
        super().__init__()
        channels, height, width = image_shape
        self.image_shape = tuple(image_shape)
        self.conv1 = nn.Conv2d(channels, 16, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=5, padding=2)
        flat = 32 * (height // 4) * (width // 4)
        self.hidden = nn.Linear(flat, 128)
        self.out = nn.Linear(128, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(x.shape[0], *self.image_shape)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        logits: torch.Tensor = self.out(F.relu(self.hidden(x.flatten(1))))
        return logits


def build_model(
    name: str,
    num_features: int,
    num_classes: int,
    *,
    image_shape: Sequence[int] | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """Build a model with deterministic initial weights for a seed.

    Logistic regression starts at zero (the convex problem needs no symmetry
    breaking, and a zero start makes runs comparable across methods).
    """
    outputs = output_units(num_classes)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model: nn.Module
        if name == "logreg":
            linear = nn.Linear(num_features, outputs)
            nn.init.zeros_(linear.weight)
            nn.init.zeros_(linear.bias)
            model = linear
        elif name == "mlp":
            model = nn.Sequential(
                nn.Linear(num_features, MLP_HIDDEN_UNITS), nn.ReLU(), nn.Linear(MLP_HIDDEN_UNITS, outputs)
            )
        elif name == "cnn":
            if image_shape is None or len(image_shape) != 3 or math.prod(image_shape) != num_features:
                raise ConfigError(
                    "the cnn model needs image data (e.g. --dataset mnist); use --model logreg or mlp for tables"
                )
            model = SmallCNN(image_shape, outputs)
        else:
            raise ConfigError(f"unknown model '{name}'; choose one of: {', '.join(MODEL_NAMES)}")
    finally:
        torch.random.set_rng_state(generator_state)
    return model.to(dtype)


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """All parameters as one detached vector (a copy), in the model's dtype and device."""
    return torch.cat([parameter.detach().reshape(-1) for parameter in model.parameters()])


@torch.no_grad()
def load_flat_parameters(model: nn.Module, vector: torch.Tensor) -> None:
    """Copy a flat vector into the model's parameters in place.

    Unlike torch's vector_to_parameters this never makes the parameters views of
    the vector, so training cannot silently write into the caller's copy.
    """
    offset = 0
    for parameter in model.parameters():
        count = parameter.numel()
        parameter.copy_(vector[offset : offset + count].view_as(parameter))
        offset += count
    if offset != vector.numel():
        raise ValueError(f"parameter vector has {vector.numel()} entries but the model has {offset}")
