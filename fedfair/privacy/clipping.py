"""Norm-only clipping for DP-SGD: each sample's gradient norm without its gradient, and the mode choice.

DP-SGD needs sum_i min(1, C / (||g_i|| + 1e-6)) * g_i over a Poisson sample, where
g_i is sample i's gradient of (theta, c). The per-sample path materialises every
g_i (for Adult's 107 x 512 layer, 55k numbers per sample) only to scale and sum
them. Norm-only clipping (Opacus' ghost clipping; Li et al. 2022, Bu et al. 2023)
gets the norms from what the backward pass already holds: for a dense layer
||g_i||^2 = ||backprop_i||^2 * ||activation_i||^2, for c it is |d f_i / d c|. The
clipped sum is then one more backward pass, of sum_i factor_i * f_i.

Why: docs/design.md, "Inside the privacy library".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from opacus.grad_sample import GradSampleHooksFastGradientClipping
from opacus.optimizers import DPOptimizerFastGradientClipping
from opacus.utils.module_utils import trainable_modules
from torch import nn

from fedfair.core.errors import ConfigError
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.hooks import linear_norm_sample, threshold_grad_sample

ClippingMode = Literal["one_pass", "norm", "per_sample"]
"""How a private step clips: norms only in one backward pass ("one_pass", dense models) or two
("norm"), or per-sample gradients ("per_sample")."""

CLIPPING_CHOICES = ("auto", "one_pass", "norm", "per_sample")
"""What a PrivateLearner may be asked for; "auto" picks the first of the modes in this order that the model allows."""

ONE_PASS_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, RCVaRThreshold)
"""The trainable layers whose clipped gradient `OnePassClipping` builds from one layer's backprops and activations."""

_HOOKED = "_fedfair_one_pass_clipping"  # marks a layer already recorded by a OnePassClipping


def has_clipping_hooks(module: nn.Module) -> bool:
    """Whether some clipping already hooks `module`: Opacus' (per-sample or norm-only) or a `OnePassClipping`.

    Two sets of hooks on one model would record every forward pass twice.
    """
    return any(hasattr(parameter, "grad_sample") for parameter in module.parameters()) or any(
        hasattr(layer, _HOOKED) for layer in module.modules()
    )


def norm_clipping_blockers(module: nn.Module) -> list[str]:
    """Why norm-only clipping cannot train `module`: one line per offending layer (empty when it can).

    A layer needs a registered norm sampler; a parameter shared by two layers would
    need its per-sample gradients summed before the norm is taken, which only the
    per-sample path does. (A layer called twice in one forward pass is only seen
    then; Opacus refuses it, and `PrivateLearner` names the fix.)
    """
    norm_sampled = tuple(GradSampleHooksFastGradientClipping.NORM_SAMPLERS)
    return _blockers(module, norm_sampled, "has no per-sample gradient norm")


def one_pass_blockers(module: nn.Module) -> list[str]:
    """Why one-pass clipping cannot train `module`: one line per offending layer (empty when it can).

    Every trainable layer must be dense or the threshold, and no parameter shared
    between layers, for the same reason as in `norm_clipping_blockers`.
    """
    return _blockers(module, ONE_PASS_LAYERS, "is neither a dense layer (nn.Linear) nor the threshold")


def _blockers(module: nn.Module, allowed: tuple[type[nn.Module], ...], why_not: str) -> list[str]:
    blockers: list[str] = []
    owners: dict[int, str] = {}
    for name, layer in trainable_modules(module):
        where = f"layer '{name}' ({type(layer).__name__})"
        # The exact type, as Opacus' registries match: a subclass may compute something else.
        if type(layer) not in allowed:
            blockers.append(f"{where} {why_not}")
        for parameter in layer.parameters(recurse=False):
            if id(parameter) in owners:
                blockers.append(f"{where} shares a parameter with {owners[id(parameter)]}")
            owners.setdefault(id(parameter), where)
    return blockers


def choose_clipping(module: nn.Module, requested: str = "auto") -> ClippingMode:
    """The clipping mode for `module`: the one requested, or with "auto" the cheapest that applies.

    "auto" tries one-pass, then norm-only, then per-sample clipping. Asking for
    "one_pass" or "norm" on a model that does not allow it is an error naming the layers.
    """
    if requested not in CLIPPING_CHOICES:
        raise ConfigError(f"unknown clipping mode '{requested}'; choose one of: {', '.join(CLIPPING_CHOICES)}")
    if requested == "per_sample":
        return "per_sample"
    if requested in ("auto", "one_pass"):
        blockers = one_pass_blockers(module)
        if not blockers:
            return "one_pass"
        if requested == "one_pass":
            raise ConfigError(
                f"one-pass clipping cannot train this model: {'; '.join(blockers)}; use clipping 'auto', 'norm' "
                "or 'per_sample'"
            )
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

    def capturing(self) -> AbstractContextManager[None]:
        """Where the step's forward pass runs; nothing to arm here, as Opacus' hooks record every forward pass."""
        return nullcontext()

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


@dataclass(frozen=True)
class _Recorded:
    """What one layer's forward call left for the step's backward pass."""

    name: str
    activation: torch.Tensor  # its input, detached
    output: torch.Tensor  # its output, in the graph: the backward pass stops here
    version: int  # the output's version then; a later in-place change would hide its gradient


class OnePassClipping:
    """Clipped, summed gradients of a model of dense layers (and the threshold) from one backward pass.

    During `capturing()` each trainable layer records its input a and output; `backward`
    then differentiates the batch's objective with respect to those outputs only (no
    parameter gradient, no input gradient of the first layer), which gives each layer's
    per-sample backprops g. From them: each sample's joint norm over every parameter
    (dense layer ||g_i|| ||a_i|| for the weight, ||g_i|| for the bias, |d f_i / d c| for
    the threshold; the norm samplers of `fedfair.privacy.hooks`, as in `NormClipping`),
    the clip factors min(1, C / (norm_i + 1e-6)), and each parameter's clipped sum:
    (factor * G)^T A for a weight, factor^T G for a bias, sum_i factor_i d f_i / d c for c.
    The result, left in `.grad`, is the one `NormClipping` and the per-sample path give,
    up to float rounding; `NormClippingOptimizer` then noises it alike.

    With `threshold_norm`, theta and c are clipped separately: theta's per-sample gradient (every
    layer but the threshold) to norm `max_grad_norm`, c's to `threshold_norm`; one sample then moves
    the clipped sum by at most sqrt(max_grad_norm^2 + threshold_norm^2) in L2, as in distributed DP.
    """

    def __init__(self, module: nn.Module, max_grad_norm: float, threshold_norm: float | None = None) -> None:
        blockers = one_pass_blockers(module)
        if blockers:
            raise ConfigError(f"one-pass clipping cannot train this model: {'; '.join(blockers)}")
        self.max_grad_norm = max_grad_norm
        self.threshold_norm = threshold_norm
        self._layers = dict(trainable_modules(module))
        if has_clipping_hooks(module):
            raise ConfigError("this model already has clipping hooks; make a PrivateLearner once per LocalLearner")
        for name, layer in self._layers.items():
            setattr(layer, _HOOKED, True)
            layer.register_forward_hook(partial(self._record, name))
        self._recorded: dict[nn.Module, _Recorded] = {}
        self._armed = False

    @contextmanager
    def capturing(self) -> Iterator[None]:
        """Run the step's forward pass inside: the layers record their inputs and outputs only here."""
        self._recorded.clear()
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def _record(self, name: str, layer: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if not self._armed:
            return
        if layer in self._recorded:
            # Same exception type as Opacus' for tied layers, so that PrivateLearner names the fix for both.
            raise NotImplementedError(
                f"layer '{name}' ({type(layer).__name__}) ran twice in one forward pass, and the norm of its "
                "per-sample gradient is not the sum of its calls' norms"
            )
        self._recorded[layer] = _Recorded(name, inputs[0].detach(), output, output._version)

    def backward(self, per_sample: torch.Tensor) -> None:
        """Accumulate the clipped sum of the per-sample gradients of `per_sample` (one objective per sample)."""
        if not self._layers:
            return
        recorded = [self._recorded.get(layer) for layer in self._layers.values()]
        self._recorded.clear()  # the graph goes with this step, whatever happens below
        missing = [f"'{name}'" for name, record in zip(self._layers, recorded, strict=True) if record is None]
        records = [record for record in recorded if record is not None]
        changed = [f"'{record.name}'" for record in records if record.output._version != record.version]
        if changed:
            raise ConfigError(
                f"the output of layer(s) {', '.join(changed)} was modified in place (e.g. by ReLU(inplace=True)), "
                "so their per-sample backprops cannot be read; make that operation out of place, or train with "
                "clipping 'norm' or 'per_sample'"
            )
        # Gradients at the layers' outputs only: autograd runs no parameter's backward node.
        backprops = torch.autograd.grad(per_sample.sum(), [record.output for record in records], allow_unused=True)
        missing += [f"'{record.name}'" for record, backprop in zip(records, backprops, strict=True) if backprop is None]
        if missing:
            raise ConfigError(
                f"trainable layer(s) {', '.join(missing)} took no part in this step's objective, so their per-sample "
                "gradient norms are unknown; freeze them (requires_grad = False) or train with clipping 'per_sample'"
            )
        layers = [self._layers[record.name] for record in records]
        samples = [
            _per_sample_terms(layer, record.activation, backprop)
            for layer, record, backprop in zip(layers, records, backprops, strict=True)
        ]
        # The norm as Opacus' get_norm_sample takes it: over the per-parameter norms of every layer
        # (of every layer but the threshold, when c is clipped on its own).
        separate = self.threshold_norm is not None
        joint = [
            norm
            for layer, (_, layer_norms) in zip(layers, samples, strict=True)
            if not (separate and isinstance(layer, RCVaRThreshold))
            for norm in layer_norms
        ]
        norms = torch.stack(joint).norm(2, dim=0)
        factors = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        for layer, (terms, layer_norms) in zip(layers, samples, strict=True):
            layer_factors = factors
            if self.threshold_norm is not None and isinstance(layer, RCVaRThreshold):
                layer_factors = (self.threshold_norm / (layer_norms[0] + 1e-6)).clamp(max=1.0)
            for parameter, gradient in _clipped_sums(layer, terms, layer_factors):
                parameter.grad = gradient if parameter.grad is None else parameter.grad + gradient


def _per_sample_terms(
    layer: nn.Module, activation: torch.Tensor, backprop: torch.Tensor
) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]:
    """A layer's per-sample pieces its clipped sums are built from, and its per-parameter per-sample norms."""
    if isinstance(layer, RCVaRThreshold):
        grad_c = threshold_grad_sample(layer, [activation], backprop)[layer.c]
        return (grad_c,), [grad_c.abs()]
    activation = activation.to(backprop.dtype)
    if backprop.dim() > 3:
        # Any leading layout is a sequence of positions to the norm (Opacus' own sampler takes 2-D or 3-D only).
        activation, backprop = activation.flatten(1, -2), backprop.flatten(1, -2)
    norms = linear_norm_sample(layer, [activation], backprop)  # type: ignore[arg-type]  # a dense layer here
    return (activation, backprop), list(norms.values())


def _clipped_sums(
    layer: nn.Module, terms: tuple[torch.Tensor, ...], factors: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each trainable parameter of `layer` with sum_i factor_i * (its gradient from sample i)."""
    if isinstance(layer, RCVaRThreshold):
        (grad_c,) = terms
        return [(layer.c, factors.to(grad_c.dtype) @ grad_c)]
    assert isinstance(layer, nn.Linear)
    activation, backprop = terms
    factors = factors.to(backprop.dtype)
    sums: list[tuple[torch.Tensor, torch.Tensor]] = []
    if layer.weight.requires_grad:
        scale = factors.view(-1, *([1] * (backprop.dim() - 1)))
        rows = activation.reshape(-1, activation.shape[-1])
        backprop_rows = backprop.reshape(-1, backprop.shape[-1])
        # Scale whichever side is narrower; the product is the plain backward's weight gradient, reweighted.
        if activation.shape[-1] <= backprop.shape[-1]:
            weight = backprop_rows.T @ (activation * scale).reshape(rows.shape)
        else:
            weight = (backprop * scale).reshape(backprop_rows.shape).T @ rows
        sums.append((layer.weight, weight))
    if layer.bias is not None and layer.bias.requires_grad:
        per_sample_bias = backprop if backprop.dim() == 2 else backprop.sum(dim=tuple(range(1, backprop.dim() - 1)))
        sums.append((layer.bias, factors @ per_sample_bias))
    return sums


class NormClippingOptimizer(DPOptimizerFastGradientClipping):  # type: ignore[misc]  # Opacus ships no types
    """Opacus' optimizer for norm-only clipping, without its copy of every gradient per step.

    Opacus copies `.grad` into `summed_grad` to support accumulating several backward
    passes per step; a private step here is exactly one pass, so the gradient itself
    is the sum (noise is then added out of place, leaving it untouched).
    """

    def accumulate(self) -> None:
        """Take each parameter's `.grad` as its summed gradient, by reference: no copy."""
        for parameter in self.params:
            parameter.summed_grad = parameter.grad
