"""Opacus hooks: per-sample gradients and gradient norms, and which models DP-SGD can train.

c lives in `RCVaRThreshold`, a module with a registered per-sample gradient (for the
per-sample path) and a registered per-sample gradient norm (for norm-only clipping),
so its gradient is clipped together with theta's (one joint norm) and noised alike.
Opacus 1.6 ships norm samplers for Linear and Embedding only; Conv, LayerNorm and GroupNorm
get theirs here, which is what lets `fedfair.privacy.clipping` clip those models by norms,
and Linear a faster one for (batch, features) inputs (registered globally, as Opacus'
registry is: the same norms for any Opacus user in this process). One-pass clipping
(`fedfair.privacy.clipping.OnePassClipping`) calls the dense layer's and the
threshold's samplers itself, without Opacus' hooks: `linear_norm_sample`,
`threshold_grad_sample`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
from opacus.grad_sample import (
    GradSampleHooks,
    GradSampleHooksFastGradientClipping,
    register_grad_sampler,
    register_norm_sampler,
)
from opacus.utils.module_utils import has_trainable_params
from opacus.validators import ModuleValidator
from torch import nn
from torch.nn import functional as F

from fedfair.core.errors import ConfigError
from fedfair.core.objective import RCVaRThreshold

# ---------------------------------------------------------------- per-sample gradient of c


def threshold_grad_sample(
    module: RCVaRThreshold, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """d(output_i)/dc times the backpropagated gradient of each sample: one scalar per sample.

    Output i depends on c only through sample i's own loss term, so the per-sample
    gradient is exact: backprops_i * (1 - eps) * (1 - s'(l_i - c) / rho).
    """
    losses = activations[0].to(backprops.dtype)
    with torch.no_grad():
        return {module.c: backprops * module.grad_c_per_sample(losses)}


def _threshold_norm_sample(
    module: RCVaRThreshold, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """|d(output_i)/dc|: c is one scalar, so the norm of its per-sample gradient is its absolute value."""
    return {module.c: threshold_grad_sample(module, activations, backprops)[module.c].abs()}


# Registered by a call, not a decorator: Opacus ships no types, so its decorator would erase this signature.
register_grad_sampler(RCVaRThreshold)(threshold_grad_sample)
register_norm_sampler(RCVaRThreshold)(_threshold_norm_sample)

# ---------------------------------------------------------------- per-sample gradient norms of Linear, Conv, LayerNorm, GroupNorm

_OPACUS_LINEAR_NORM_SAMPLE = GradSampleHooksFastGradientClipping.NORM_SAMPLERS[nn.Linear]


def linear_norm_sample(
    layer: nn.Linear, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[torch.Tensor, torch.Tensor]:
    """Per-sample gradient norms of a dense layer on (batch, features) inputs: ||g_i a_i^T|| = ||g_i|| ||a_i||.

    Opacus computes the same products with batched einsums, which on the CPU cost
    more than the rest of the first backward pass; on sequences (3-D inputs) its
    own Gram-matrix form is used.
    """
    if backprops.dim() != 2:
        norms: dict[torch.Tensor, torch.Tensor] = _OPACUS_LINEAR_NORM_SAMPLE(layer, activations, backprops)
        return norms
    backprop_norms = torch.linalg.vector_norm(backprops, dim=1)
    activation_norms = torch.linalg.vector_norm(activations[0].to(backprops.dtype), dim=1)
    result = {layer.weight: backprop_norms * activation_norms}
    if layer.bias is not None:
        result[layer.bias] = backprop_norms
    return {parameter: norms for parameter, norms in result.items() if parameter.requires_grad}


register_norm_sampler(nn.Linear)(linear_norm_sample)

NormSampler = Callable[[nn.Module, list[torch.Tensor], torch.Tensor], dict[nn.Parameter, torch.Tensor]]


def _norm_of_grad_sample(layer: type[nn.Module]) -> NormSampler:
    """A norm sampler that takes the layer's per-sample gradient from Opacus and keeps only its norm.

    For convolutions this beats the ghost norm (inner products of the T x T
    position Gram matrices) whenever T * (k + out) > k * out, which holds for the early
    layers of image models (MNIST's conv2: 196 * 432 against 400 * 32); 2-D convolutions
    take the ghost norm otherwise (`conv2d_norm_sample`). Only one layer's per-sample
    gradient exists at a time and it is dropped at once: no per-sample clipping
    pass, and no per-sample gradients of the dense layers, which dominate memory.
    LayerNorm's and GroupNorm's per-sample gradients are as small as their parameters
    (GroupNorm's weight gradient of sample i is sum over positions of x_hat_i * g_i per channel,
    its bias gradient the sum of g_i), so their norms cost no more than the gradients themselves.
    """
    grad_sampler = GradSampleHooks.GRAD_SAMPLERS[layer]

    def norm_sample(
        module: nn.Module, activations: list[torch.Tensor], backprops: torch.Tensor
    ) -> dict[nn.Parameter, torch.Tensor]:
        samples: dict[nn.Parameter, torch.Tensor] = grad_sampler(module, activations, backprops)
        return {parameter: sample.flatten(1).norm(2, dim=1) for parameter, sample in samples.items()}

    return norm_sample


for _layer in (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.LayerNorm, nn.GroupNorm):
    register_norm_sampler(_layer)(_norm_of_grad_sample(_layer))

_CONV2D_GRAD_SAMPLE_NORM = _norm_of_grad_sample(nn.Conv2d)


def uses_ghost_norm(layer: nn.Conv2d, positions: int) -> bool:
    """Whether `conv2d_norm_sample` takes the ghost norm for `layer` at `positions` output positions.

    Where T (k + out) < k * out (k: the kernel's inputs): the T x T Gram matrices take fewer
    multiplications (T^2 (k + out)) than one sample's weight gradient (T k out), and hold T^2
    numbers instead of k * out. Deep layers of image models qualify (ResNet-18's last stage on
    32 x 32 images: T = 1, k = 4,608, out = 512); early ones do not.
    """
    if layer.groups != 1 or layer.padding_mode != "zeros" or isinstance(layer.padding, str):
        return False  # F.unfold below pads with zeros and knows no groups
    fan_in = layer.in_channels * math.prod(layer.kernel_size)
    return positions * (fan_in + layer.out_channels) < fan_in * layer.out_channels


def conv2d_norm_sample(
    layer: nn.Conv2d, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """Per-sample gradient norms of a 2-D convolution, by whichever of two exact forms costs less.

    Sample i's weight gradient is G_i^T A_i, G_i its backprops (T positions x out) and A_i its
    unfolded input (T x k); ||G_i^T A_i||^2 = sum_{t,s} (A_i A_i^T)_{ts} (G_i G_i^T)_{ts} (the
    ghost norm, T^2 (k + out) multiplications per sample) or the norm of the materialised gradient
    (T k out, Opacus' sampler), as `uses_ghost_norm` decides; the bias's is ||sum_t G_it||.
    """
    positions = backprops.shape[2] * backprops.shape[3]
    if not uses_ghost_norm(layer, positions):
        return _CONV2D_GRAD_SAMPLE_NORM(layer, activations, backprops)
    unfolded = F.unfold(
        activations[0].to(backprops.dtype),
        layer.kernel_size,
        dilation=layer.dilation,
        padding=layer.padding,  # type: ignore[arg-type]  # a tuple here: strings take the other branch
        stride=layer.stride,
    )  # (N, k, T)
    flat = backprops.flatten(2)  # (N, out, T)
    result: dict[nn.Parameter, torch.Tensor] = {}
    if layer.weight.requires_grad:
        grams = (unfolded.transpose(1, 2) @ unfolded) * (flat.transpose(1, 2) @ flat)
        result[cast(nn.Parameter, layer.weight)] = grams.sum(dim=(1, 2)).clamp(min=0).sqrt()  # rounding may leave -0
    if layer.bias is not None and layer.bias.requires_grad:
        result[cast(nn.Parameter, layer.bias)] = flat.sum(dim=2).norm(2, dim=1)
    return result


register_norm_sampler(nn.Conv2d)(conv2d_norm_sample)


def check_private_model(model: nn.Module) -> None:
    """Refuse, naming the layer, a model DP-SGD cannot train sample by sample.

    BatchNorm (and InstanceNorm with running statistics, or plain LSTM / GRU /
    MultiheadAttention) either mixes samples within a batch or has no per-sample
    gradient in Opacus; training it "privately" would silently void the guarantee.
    """
    for name, module in model.named_modules():
        reason = _unsupported_reason(module)
        if reason is not None:
            where = f"layer '{name}'" if name else "the model"
            raise ConfigError(
                f"DP-SGD cannot train {where} ({type(module).__name__}): {reason}; replace it "
                "(GroupNorm or LayerNorm for BatchNorm, opacus.layers.DPLSTM / DPGRU / DPMultiheadAttention) "
                "or turn privacy off"
            )


def _unsupported_reason(module: nn.Module) -> str | None:
    validator = ModuleValidator.VALIDATORS.get(type(module))
    if validator is not None:
        errors = validator(module)
        if errors:
            # Opacus explains at length; its first sentence names the problem.
            return str(errors[0]).split(". ")[0].rstrip(".")
    if has_trainable_params(module) and any(True for _ in module.buffers(recurse=False)):
        return "it keeps buffers (e.g. running statistics) computed from many samples, which DP-SGD cannot make private"
    return None
