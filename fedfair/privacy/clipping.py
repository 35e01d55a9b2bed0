"""Norm-only clipping for DP-SGD: each sample's gradient norm without its gradient, and the mode choice.

DP-SGD needs sum_i min(1, C / (||g_i|| + 1e-6)) * g_i over a Poisson sample, where
g_i is sample i's gradient of (theta, c). The per-sample path materialises every
g_i (for Adult's 107 x 512 layer, 55k numbers per sample) only to scale and sum
them. Norm-only clipping (Opacus' ghost clipping; Li et al. 2022, Bu et al. 2023)
gets the norms from what the backward pass already holds: for a dense layer
||g_i||^2 = ||backprop_i||^2 * ||activation_i||^2, for c it is |d f_i / d c|. The
clipped sum is then one more backward pass, of sum_i factor_i * f_i.

Same semantics as the per-sample path: the same joint norm over every parameter of
the model and of the threshold, the same clip factor (Opacus' formula, 1e-6
included), the same noise and the same accountant, which sees only the noise, the
sample rate and the steps. The two differ by float rounding only.

The mode is chosen per model (`choose_clipping`): norm-only when every trainable
layer has a registered norm sampler (Linear, Conv, Embedding, LayerNorm and the
threshold, see `fedfair.privacy.hooks`) and no parameter is shared between layers;
otherwise the per-sample path, which handles any layer Opacus does.
"""

from __future__ import annotations

from typing import Literal

import torch
from opacus.grad_sample import GradSampleHooksFastGradientClipping
from opacus.optimizers import DPOptimizerFastGradientClipping
from opacus.utils.module_utils import trainable_modules
from torch import nn

from fedfair.core.errors import ConfigError

ClippingMode = Literal["norm", "per_sample"]
"""How a private step clips: per-sample norms only ("norm"), or per-sample gradients ("per_sample")."""

CLIPPING_CHOICES = ("auto", "norm", "per_sample")
"""What a PrivateLearner may be asked for; "auto" picks norm-only wherever the model allows it."""


def norm_clipping_blockers(module: nn.Module) -> list[str]:
    """Why norm-only clipping cannot train `module`: one line per offending layer (empty when it can).

    A layer needs a registered norm sampler; a parameter shared by two layers would
    need its per-sample gradients summed before the norm is taken, which only the
    per-sample path does. (A layer called twice in one forward pass is only seen
    then; Opacus refuses it, and `PrivateLearner` names the fix.)
    """
    blockers: list[str] = []
    owners: dict[int, str] = {}
    for name, layer in trainable_modules(module):
        where = f"layer '{name}' ({type(layer).__name__})"
        if type(layer) not in GradSampleHooksFastGradientClipping.NORM_SAMPLERS:
            blockers.append(f"{where} has no per-sample gradient norm")
        for parameter in layer.parameters(recurse=False):
            if id(parameter) in owners:
                blockers.append(f"{where} shares a parameter with {owners[id(parameter)]}")
            owners.setdefault(id(parameter), where)
    return blockers


def choose_clipping(module: nn.Module, requested: str = "auto") -> ClippingMode:
    """The clipping mode for `module`: the one requested, or with "auto" norm-only wherever it applies.

    Asking for "norm" on a model that does not allow it is an error naming the layers.
    """
    if requested not in CLIPPING_CHOICES:
        raise ConfigError(f"unknown clipping mode '{requested}'; choose one of: {', '.join(CLIPPING_CHOICES)}")
    if requested == "per_sample":
        return "per_sample"
    blockers = norm_clipping_blockers(module)
    if not blockers:
        return "norm"
    if requested == "norm":
        raise ConfigError(
            f"norm-only clipping cannot train this model: {'; '.join(blockers)}; use clipping 'auto' or 'per_sample'"
        )
    return "per_sample"


class NormClipping:
    """Hooks on the model (and threshold) that turn a batch's per-sample objective into clipped, summed gradients.

    `backward(per_sample)` leaves in each parameter's `.grad` the sum over the batch
    of its share of min(1, C / (||g_i|| + 1e-6)) * g_i, the joint norm ||g_i|| taken
    over all parameters; Opacus' `DPOptimizerFastGradientClipping` then adds the
    noise and divides by the expected batch size, exactly as the per-sample path does.
    """

    def __init__(self, module: nn.Module, max_grad_norm: float) -> None:
        blockers = norm_clipping_blockers(module)
        if blockers:
            raise ConfigError(f"norm-only clipping cannot train this model: {'; '.join(blockers)}")
        # "sum": each captured backprop is exactly one sample's, whatever the Poisson batch size.
        self._hooks = GradSampleHooksFastGradientClipping(
            module, loss_reduction="sum", strict=True, max_grad_norm=max_grad_norm, use_ghost_clipping=True
        )
        self._parameters = [parameter for parameter in module.parameters() if parameter.requires_grad]
        # The first pass needs every layer's backprop, not its weight gradient: differentiating
        # only each layer's smallest parameter (a bias, c) makes autograd skip the weight
        # gradients, so that pass costs little more than the backprops themselves.
        self._probes = [
            min((p for p in layer.parameters(recurse=False) if p.requires_grad), key=lambda p: p.numel())
            for _, layer in trainable_modules(module)
        ]

    def backward(self, per_sample: torch.Tensor) -> None:
        """Accumulate the clipped sum of the per-sample gradients of `per_sample` (one objective per sample)."""
        for parameter in self._parameters:
            parameter._norm_sample = None  # type: ignore[attr-defined]  # a stale norm would clip the wrong sample
        torch.autograd.grad(per_sample.sum(), self._probes, retain_graph=True, allow_unused=True)
        if any(getattr(parameter, "_norm_sample", None) is None for parameter in self._parameters):
            raise ConfigError(
                "a trainable layer took no part in this step's forward pass, so its per-sample gradient norm is "
                "unknown; freeze it (requires_grad = False) or train with clipping 'per_sample'"
            )
        factors = self._hooks.get_clipping_coef()
        self._hooks.disable_hooks()
        try:
            torch.autograd.backward((factors.to(per_sample.dtype) * per_sample).sum())
        finally:
            self._hooks.enable_hooks()


class NormClippingOptimizer(DPOptimizerFastGradientClipping):  # type: ignore[misc]  # Opacus ships no types
    """Opacus' optimizer for norm-only clipping, without its copy of every gradient per step.

    Opacus copies `.grad` into `summed_grad` to support accumulating several backward
    passes per step; a private step here is exactly one pass, so the gradient itself
    is the sum (noise is then added out of place, leaving it untouched).
    """

    def accumulate(self) -> None:
        for parameter in self.params:
            parameter.summed_grad = parameter.grad
