"""Models: logistic regression, a one-hidden-layer MLP (512 units), a small CNN, or the user's own.

The built-in models use only layers DP-SGD can compute per-sample gradients for
(Linear, Conv2d, ReLU, pooling), so the same models serve the private path. `ResNetGN`
(ResNet-18 with GroupNorm, in-place operations as torchvision writes them) is no built-in
name; a plan reaches it as a factory, and the privacy tests and benchmarks build it.
Binary tasks use one logit (true logistic regression, a unique optimum for the
convex reference solver); multi-class tasks use one logit per class.

Why: docs/design.md, "Inside the learning core".
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn import functional as F

from fedfair.core.config import FACTORY_PATH, MODEL_NAMES
from fedfair.core.errors import ConfigError, FactoryNotAllowedError

MLP_HIDDEN_UNITS = 512


Built = TypeVar("Built")


def output_units(num_classes: int) -> int:
    """Logits a model emits for `num_classes` classes: 1 for a binary task (logistic loss), else one per class."""
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
        """Logits [N, outputs] for a batch `x` of N flattened images (reshaped to `image_shape` here)."""
        x = x.view(x.shape[0], *self.image_shape)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        logits: torch.Tensor = self.out(F.relu(self.hidden(x.flatten(1))))
        return logits


class ResidualBlock(nn.Module):
    """Two 3x3 convolutions with GroupNorm and a shortcut, written as torchvision's BasicBlock is.

    In place on purpose, as in torchvision: `out += identity` adds the shortcut into the second
    norm's output and `ReLU(inplace=True)` rectifies outputs where they lie, which is what a
    private learner must train without the model being edited.
    """

    def __init__(self, inputs: int, outputs: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, outputs)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(groups, outputs)
        self.downsample: nn.Module | None = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), nn.GroupNorm(groups, outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output: relu(norm2(conv2(relu(norm1(conv1(x))))) + shortcut(x))."""
        identity = x if self.downsample is None else self.downsample(x)
        out: torch.Tensor = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        out += identity
        out = self.relu(out)
        return out


class ResNetGN(nn.Module):
    """ResNet-18 with GroupNorm in place of BatchNorm (the shape of torchvision's `resnet18` with a GroupNorm norm layer).

    A 7x7 stride-2 stem, 3x3 max-pooling, four stages of two `ResidualBlock`s at `width`,
    2 `width`, 4 `width` and 8 `width` channels (strides 1, 2, 2, 2), global average pooling
    and a dense head. `width` 64 and `groups` 32 give ResNet-18's 11.2M parameters (with 1,000
    classes); smaller widths keep the shape for tests. It takes flattened images, as `SmallCNN`.
    """

    def __init__(self, image_shape: Sequence[int], outputs: int, width: int = 64, groups: int = 32) -> None:
        super().__init__()
        if width % groups:
            raise ConfigError(f"ResNet width {width} is not a multiple of its {groups} GroupNorm groups")
        self.image_shape = tuple(image_shape)
        self.conv1 = nn.Conv2d(self.image_shape[0], width, 7, stride=2, padding=3, bias=False)
        self.norm1 = nn.GroupNorm(groups, width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages: list[nn.Module] = []
        channels = width
        for stage in range(4):
            wide = width << stage
            stride = 1 if stage == 0 else 2
            stages.append(
                nn.Sequential(ResidualBlock(channels, wide, stride, groups), ResidualBlock(wide, wide, 1, groups))
            )
            channels = wide
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [N, outputs] for a batch `x` of N flattened images (reshaped to `image_shape` here)."""
        x = x.view(x.shape[0], *self.image_shape)
        x = self.maxpool(self.relu(self.norm1(self.conv1(x))))
        logits: torch.Tensor = self.fc(self.avgpool(self.layers(x)).flatten(1))
        return logits


def seeded(build: Callable[[], Built], seed: int) -> Built:
    """Call `build` with torch's generator seeded by `seed`, leaving the caller's generator as it was.

    Every party builds its initial model this way, so all start from the same theta_0
    without anyone's other random draws shifting.
    """
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return build()
    finally:
        torch.random.set_rng_state(generator_state)


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

    def build() -> nn.Module:
        if name == "logreg":
            linear = nn.Linear(num_features, outputs)
            nn.init.zeros_(linear.weight)
            nn.init.zeros_(linear.bias)
            return linear
        if name == "mlp":
            return nn.Sequential(
                nn.Linear(num_features, MLP_HIDDEN_UNITS), nn.ReLU(), nn.Linear(MLP_HIDDEN_UNITS, outputs)
            )
        if name == "cnn":
            if image_shape is None or len(image_shape) != 3 or math.prod(image_shape) != num_features:
                raise ConfigError(
                    "the cnn model needs image data (e.g. --dataset mnist); use --model logreg or mlp for tables"
                )
            return SmallCNN(image_shape, outputs)
        raise ConfigError(f"unknown model '{name}'; choose one of: {', '.join(MODEL_NAMES)}")

    return seeded(build, seed).to(dtype)


ALLOW_FACTORY_FIX = (
    "a factory is code that runs with this process's rights, so only this party's own configuration may allow "
    "it: a collaborator lists it in its config's [model] factories, `fedfair predict` / `evaluate` take "
    "--allow-factory NAME"
)
"""How a party consents to a model factory: the tail of every :class:`~fedfair.core.errors.FactoryNotAllowedError` message."""


def load_factory(path: str, allowed: Collection[str]) -> Callable[..., nn.Module]:
    """The model factory named "package.module:function", imported from this Python environment.

    The factory is trusted code: it runs with this process's rights, which is why a plan or a
    bundle can only name a function that each party has installed and allowed itself.

    Args:
        path: "package.module:function" (the function may be dotted, e.g. "pkg.mod:Class.build").
        allowed: this party's own list of factories, never one that arrived over the wire.

    Raises:
        FactoryNotAllowedError: `allowed` does not name `path`; nothing is imported.
        ConfigError: `path` is malformed, its module is not installed, or it names no callable.
    """
    if path not in allowed:
        raise FactoryNotAllowedError(
            f"model factory '{path}' is not allowed here; it was not imported. If you trust it, {ALLOW_FACTORY_FIX}"
        )
    if not FACTORY_PATH.fullmatch(path):
        raise ConfigError(
            f"model factory '{path}' is not of the form 'package.module:function'; "
            "write the module's import name, a colon and the function, e.g. 'mymodels.tabular:build'"
        )
    module_name, attribute = path.split(":")
    try:
        found: object = importlib.import_module(module_name)
    except ModuleNotFoundError as missing:
        needed = missing.name or module_name
        inside = "" if module_name.startswith(needed) else f" (it imports '{needed}')"
        raise ConfigError(
            f"model factory '{path}': module '{needed}' is not installed in this Python environment{inside}; "
            "every party of the federation (the aggregator and each collaborator) must install the package "
            "that provides the model, e.g. `pip install <your-model-package>`"
        ) from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigError(
                f"model factory '{path}': module '{module_name}' has no '{attribute}'; "
                "check the function's name, or install the package version that defines it on every party"
            )
        found = getattr(found, part)
    if not callable(found):
        raise ConfigError(
            f"model factory '{path}' names an object of type {type(found).__name__}, not a function; name a callable"
        )
    factory: Callable[..., nn.Module] = found
    return factory


def build_from_factory(
    path: str, arguments: Mapping[str, Any], *, allowed: Collection[str], seed: int = 0
) -> nn.Module:
    """`path`'s factory called with `arguments` under `seed` (the plan's): the same theta_0 on every party.

    `allowed` is this party's own list of factories (:func:`load_factory`).
    """
    factory = load_factory(path, allowed)
    return trainable_module(seeded(lambda: factory(**arguments), seed), f"model factory '{path}'")


def trainable_module(model: object, origin: str) -> nn.Module:
    """`model` itself, once it is an nn.Module with parameters.

    Raises:
        ConfigError: naming `origin`, when `model` is not an nn.Module or has no parameters.
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"{origin} returned a {type(model).__name__}, not a torch.nn.Module; "
            "make it return the model (an nn.Module instance)"
        )
    if not any(True for _ in model.parameters()):
        raise ConfigError(f"{origin} returned a model without parameters; there is nothing to train")
    return model


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
