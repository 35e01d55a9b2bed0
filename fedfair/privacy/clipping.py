"""Clipping for DP-SGD from each layer's inputs and backprops, and the mode choice.

DP-SGD needs sum_i min(1, C / (||g_i|| + 1e-6)) * g_i over a Poisson sample (g_i: sample i's
gradient of (theta, c)); the per-sample mode materialises every g_i only to scale and sum them. Norm-only clipping (Opacus' ghost clipping; Li et al. 2022, Bu et al. 2023)
gets the norms from what the backward pass already holds: for a dense layer
||g_i||^2 = ||backprop_i||^2 * ||activation_i||^2, for c it is |d f_i / d c|. The
clipped sum is then one more backward pass, of sum_i factor_i * f_i. All modes read
the backprops at gradient edges (`LayerClipping`), never through module backward
hooks, so a model that changes a layer's output in place (a residual network's
`out += identity`) trains as written. Why: docs/design.md, "Inside the privacy library".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from opacus.grad_sample import GradSampleHooks, GradSampleHooksFastGradientClipping
from opacus.grad_sample.functorch import ft_compute_per_sample_gradient
from opacus.optimizers import DPOptimizerFastGradientClipping
from opacus.utils.module_utils import trainable_modules
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from fedfair.core.errors import ConfigError
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.hooks import linear_norm_sample, threshold_grad_sample

ClippingMode = Literal["one_pass", "norm", "per_sample"]
"""How a private step clips: norms only in one backward pass ("one_pass", dense models) or two
("norm"), or per-sample gradients ("per_sample")."""

CLIPPING_CHOICES = ("auto", "one_pass", "norm", "per_sample")
"""What a PrivateLearner may be asked for; "auto" picks among the modes the model allows (`clipping_candidates`)."""

ONE_PASS_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, RCVaRThreshold)
"""The trainable layers whose clipped gradient `OnePassClipping` builds from one layer's backprops and activations."""

_HOOKED = "_fedfair_layer_clipping"  # marks a layer already recorded by a LayerClipping

_MODE_NAMES: dict[ClippingMode, str] = {"one_pass": "one-pass", "norm": "norm-only", "per_sample": "per-sample"}


def has_clipping_hooks(module: nn.Module) -> bool:
    """Whether some clipping already hooks `module`: Opacus' (per-sample or norm-only) or a `LayerClipping`.

    Two sets of hooks on one model would record every forward pass twice.
    """
    return any(hasattr(parameter, "grad_sample") for parameter in module.parameters()) or any(
        hasattr(layer, _HOOKED) for layer in module.modules()
    )


def trainable_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules whose forward calls clipping records: those holding a trainable parameter of their own.

    A module whose every trainable parameter also belongs to one of its submodules is left out:
    it only exposes them under other names (Opacus' DPLSTM names its cells' weights as
    nn.LSTM does), and the submodules' calls are what produce the gradients.
    """
    layers = []
    for name, layer in trainable_modules(module):
        below = {id(p) for sub in layer.modules() if sub is not layer for p in sub.parameters(recurse=False)}
        if not all(id(p) in below for p in layer.parameters(recurse=False) if p.requires_grad):
            layers.append((name, layer))
    return layers


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
    for name, layer in trainable_layers(module):
        where = f"layer '{name}' ({type(layer).__name__})"
        # The exact type, as Opacus' registries match: a subclass may compute something else.
        if type(layer) not in allowed:
            blockers.append(f"{where} {why_not}")
        for parameter in layer.parameters(recurse=False):
            if id(parameter) in owners:
                blockers.append(f"{where} shares a parameter with {owners[id(parameter)]}")
            owners.setdefault(id(parameter), where)
    return blockers


def clipping_candidates(module: nn.Module, requested: str = "auto") -> list[ClippingMode]:
    """The clipping modes that may train `module`, cheapest in work first: the one requested, or "auto"'s choices.

    "auto" gives ["one_pass"] where the model allows it: it does the first backward pass that
    the other modes also do, then only the matmuls of the plain weight gradients, so it never
    does more work than they do. Else ["norm", "per_sample"] where every layer has a norm
    sampler (which is faster depends on the model and device: norm-only clipping runs a second
    backward pass, per-sample clipping holds every per-sample gradient; `fedfair.privacy.probe`
    times them), else ["per_sample"]. Asking for "one_pass" or "norm" on a model that does not
    allow it is an error naming the layers.
    """
    if requested not in CLIPPING_CHOICES:
        raise ConfigError(f"unknown clipping mode '{requested}'; choose one of: {', '.join(CLIPPING_CHOICES)}")
    if requested == "per_sample":
        return ["per_sample"]
    if requested in ("auto", "one_pass"):
        blockers = one_pass_blockers(module)
        if not blockers:
            return ["one_pass"]
        if requested == "one_pass":
            raise ConfigError(
                f"one-pass clipping cannot train this model: {'; '.join(blockers)}; use clipping 'auto', 'norm' "
                "or 'per_sample'"
            )
    blockers = norm_clipping_blockers(module)
    if not blockers:
        return ["norm", "per_sample"] if requested == "auto" else ["norm"]
    if requested == "norm":
        raise ConfigError(
            f"norm-only clipping cannot train this model: {'; '.join(blockers)}; use clipping 'auto' or 'per_sample'"
        )
    return ["per_sample"]


def choose_clipping(module: nn.Module, requested: str = "auto") -> ClippingMode:
    """The clipping mode for `module` without timing: the first of `clipping_candidates`.

    "auto" thus gives one-pass, else norm-only, else per-sample clipping; `PrivateLearner`
    times the candidates instead where there are several (`fedfair.privacy.probe`).
    """
    return clipping_candidates(module, requested)[0]


@dataclass(frozen=True)
class _Recorded:
    """What one layer's forward call left for the step's backward pass."""

    name: str
    layer: nn.Module
    activations: list[torch.Tensor]  # its tensor inputs, detached
    versions: list[int]  # their versions then; a later in-place change would corrupt them
    edge: GradientEdge  # where its output entered the graph: the gradient there is the backprop


class LayerClipping:
    """Clipped, summed gradients of a model from its layers' inputs and backprops, in one of three modes.

    During `capturing()` each trainable layer records its inputs and the gradient edge of its
    output (`torch.autograd.graph.get_gradient_edge`): the point where the output entered the
    graph, before anything the model does to it in place (a residual `out += identity`, a
    `ReLU(inplace=True)`), so models run as written. No module hook wraps an output, which is
    what breaks Opacus' full backward hooks on residual networks. `backward` then differentiates
    the batch's objective with respect to those edges only (no parameter gradient, no input
    gradient of the first layer), which gives each layer's per-sample backprops g. From them:

    - "one_pass" (dense layers and the threshold only): each sample's norm (||g_i|| ||a_i|| for a
      weight, ||g_i|| for a bias, |d f_i / d c| for c), the clip factors and each parameter's
      clipped sum, (factor * G)^T A for a weight, factor^T G for a bias, sum_i factor_i d f_i / d c for c;
    - "norm" (layers with a registered norm sampler): the norms from the samplers, then a second
      backward pass of sum_i factor_i * f_i;
    - "per_sample" (any layer with a per-sample gradient: Opacus' samplers, else torch.func on
      that layer alone): every parameter's per-sample gradients (summed over the calls of a layer
      run twice, and over the layers sharing a parameter), their norms, and sum_i factor_i g_i.

    The clip factor is min(1, C / (||g_i|| + 1e-6)) with the joint norm ||g_i|| over every
    parameter, as in Opacus; all three modes leave the same sum in `.grad` up to float rounding,
    and `NormClippingOptimizer` then noises it. With `threshold_norm` ("one_pass" and "per_sample"),
    theta and c are clipped separately: theta's per-sample gradient (every layer but the threshold)
    to norm `max_grad_norm`, c's to `threshold_norm`; one sample then moves the clipped sum by at
    most sqrt(max_grad_norm^2 + threshold_norm^2) in L2, as in distributed DP.
    """

    def __init__(
        self,
        module: nn.Module,
        mode: ClippingMode,
        max_grad_norm: float,
        threshold_norm: float | None = None,
    ) -> None:
        if has_clipping_hooks(module):
            raise ConfigError("this model already has clipping hooks; make a PrivateLearner once per LocalLearner")
        self._module = module
        self.max_grad_norm = max_grad_norm
        self.threshold_norm = threshold_norm
        self.mode: ClippingMode = "per_sample"
        self.use(mode)
        self._layers = dict(trainable_layers(module))
        for name, layer in self._layers.items():
            setattr(layer, _HOOKED, True)
            layer.register_forward_hook(partial(self._record, name))
        self._recorded: list[_Recorded] = []
        self._ran: set[int] = set()  # the layers recorded in this forward pass
        self._armed = False

    def use(self, mode: ClippingMode) -> None:
        """Clip in `mode` from the next step on; refused (ConfigError, naming the layers) where the model does not allow it."""
        if mode == "one_pass":
            blockers = one_pass_blockers(self._module)
        elif mode == "norm":
            blockers = norm_clipping_blockers(self._module)
            if self.threshold_norm is not None:
                blockers.append(
                    "c's separate bound needs per-parameter clip factors, which its second pass cannot apply"
                )
        else:
            blockers = []
        if blockers:
            raise ConfigError(f"{_MODE_NAMES[mode]} clipping cannot train this model: {'; '.join(blockers)}")
        self.mode = mode

    @contextmanager
    def capturing(self) -> Iterator[None]:
        """Run the step's forward pass inside: the layers record their inputs and outputs only here."""
        self._recorded.clear()
        self._ran.clear()
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def _record(self, name: str, layer: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if not self._armed:
            return
        if self.mode != "per_sample" and id(layer) in self._ran:
            # Same exception type as Opacus' for tied layers, so that PrivateLearner names the fix for both.
            raise NotImplementedError(
                f"layer '{name}' ({type(layer).__name__}) ran twice in one forward pass, and the norm of its "
                "per-sample gradient is not the sum of its calls' norms"
            )
        if not isinstance(output, torch.Tensor) or output.grad_fn is None:
            raise ConfigError(
                f"layer '{name}' ({type(layer).__name__}) returned no tensor in the autograd graph, so its per-sample "
                "gradients cannot be read; DP-SGD trains layers that return one tensor, with gradients enabled"
            )
        tensors = [value for value in inputs if isinstance(value, torch.Tensor)]
        activations = [tensor.detach() for tensor in tensors]
        versions = [tensor._version for tensor in tensors]
        self._ran.add(id(layer))
        self._recorded.append(_Recorded(name, layer, activations, versions, get_gradient_edge(output)))

    def backward(self, per_sample: torch.Tensor) -> None:
        """Accumulate the clipped sum of the per-sample gradients of `per_sample` (one objective per sample)."""
        if not self._layers:
            return
        records = list(self._recorded)
        self._recorded.clear()  # the graph goes with this step, whatever happens below
        seen = {id(record.layer) for record in records}
        missing = [f"'{name}'" for name, layer in self._layers.items() if id(layer) not in seen]
        changed = sorted(
            {
                f"'{record.name}'"
                for record in records
                for activation, version in zip(record.activations, record.versions, strict=True)
                if activation._version != version
            }
        )
        if changed:
            raise ConfigError(
                f"the input of layer(s) {', '.join(changed)} was modified in place after the layer ran, so their "
                "per-sample gradients cannot be read; make that operation out of place"
            )
        # Gradients at the layers' outputs only: autograd runs no parameter's backward node.
        backprops = torch.autograd.grad(
            per_sample.sum(), [record.edge for record in records], retain_graph=self.mode == "norm", allow_unused=True
        )
        missing += [f"'{record.name}'" for record, backprop in zip(records, backprops, strict=True) if backprop is None]
        if missing:
            fallback = "" if self.mode == "per_sample" else " or train with clipping 'per_sample'"
            raise ConfigError(
                f"trainable layer(s) {', '.join(sorted(set(missing)))} took no part in this step's objective, so their "
                f"per-sample gradient norms are unknown; freeze them (requires_grad = False){fallback}"
            )
        taken = [
            (record, backprop) for record, backprop in zip(records, backprops, strict=True) if backprop is not None
        ]
        if self.mode == "one_pass":
            self._one_pass(taken)
        elif self.mode == "norm":
            self._norm(taken, per_sample)
        else:
            self._per_sample(taken)

    def _factors(self, norms: list[tuple[nn.Module, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The clip factors of theta (every layer but the threshold when c is clipped on its own) and of c.

        The norm as Opacus' get_norm_sample takes it: over the per-parameter norms of every layer.
        """
        separate = self.threshold_norm is not None
        joint = [norm for layer, norm in norms if not (separate and isinstance(layer, RCVaRThreshold))]
        factors = (self.max_grad_norm / (torch.stack(joint).norm(2, dim=0) + 1e-6)).clamp(max=1.0)
        if self.threshold_norm is None:
            return factors, None
        own = [norm for layer, norm in norms if isinstance(layer, RCVaRThreshold)]
        threshold = (self.threshold_norm / (torch.stack(own).norm(2, dim=0) + 1e-6)).clamp(max=1.0) if own else None
        return factors, threshold

    def _one_pass(self, taken: list[tuple[_Recorded, torch.Tensor]]) -> None:
        samples = [(record.layer, _per_sample_terms(record.layer, record.activations[0], g)) for record, g in taken]
        factors, threshold = self._factors([(layer, norm) for layer, (_, norms) in samples for norm in norms])
        for layer, (terms, _) in samples:
            own = threshold if threshold is not None and isinstance(layer, RCVaRThreshold) else factors
            for parameter, gradient in _clipped_sums(layer, terms, own):
                _accumulate(parameter, gradient)

    def _norm(self, taken: list[tuple[_Recorded, torch.Tensor]], per_sample: torch.Tensor) -> None:
        norm_samplers = GradSampleHooksFastGradientClipping.NORM_SAMPLERS
        norms = [
            (record.layer, norm)
            for record, backprop in taken
            for norm in norm_samplers[type(record.layer)](record.layer, record.activations, backprop).values()
        ]
        factors, _ = self._factors(norms)
        torch.autograd.backward((factors.to(per_sample.dtype) * per_sample).sum())

    def _per_sample(self, taken: list[tuple[_Recorded, torch.Tensor]]) -> None:
        samples: dict[nn.Parameter, torch.Tensor] = {}
        owners: dict[nn.Parameter, nn.Module] = {}
        for record, backprop in taken:
            for parameter, sample in _grad_sample(record.layer, record.activations, backprop).items():
                # A layer run twice, or a parameter two layers share: g_i is the sum of every call's part.
                samples[parameter] = sample if parameter not in samples else samples[parameter] + sample
                owners.setdefault(parameter, record.layer)
        norms = [
            (owners[parameter], sample.reshape(len(sample), -1).norm(2, dim=1)) for parameter, sample in samples.items()
        ]
        factors, threshold = self._factors(norms)
        for parameter, sample in samples.items():
            own = threshold if threshold is not None and isinstance(owners[parameter], RCVaRThreshold) else factors
            _accumulate(parameter, torch.tensordot(own.to(sample.dtype), sample, dims=1))


class OnePassClipping(LayerClipping):
    """`LayerClipping` in mode "one_pass": a model of dense layers (and the threshold), one backward pass."""

    def __init__(self, module: nn.Module, max_grad_norm: float, threshold_norm: float | None = None) -> None:
        super().__init__(module, "one_pass", max_grad_norm, threshold_norm)


class NormClipping(LayerClipping):
    """`LayerClipping` in mode "norm": norms from each layer's norm sampler, then a second, reweighted backward pass."""

    def __init__(self, module: nn.Module, max_grad_norm: float) -> None:
        super().__init__(module, "norm", max_grad_norm)


class PerSampleClipping(LayerClipping):
    """`LayerClipping` in mode "per_sample": every layer's per-sample gradients, clipped and summed."""

    def __init__(self, module: nn.Module, max_grad_norm: float, threshold_norm: float | None = None) -> None:
        super().__init__(module, "per_sample", max_grad_norm, threshold_norm)


def _accumulate(parameter: torch.Tensor, gradient: torch.Tensor) -> None:
    parameter.grad = gradient if parameter.grad is None else parameter.grad + gradient


def _grad_sample(
    layer: nn.Module, activations: list[torch.Tensor], backprop: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """Each trainable parameter of `layer` with its per-sample gradients (leading axis: the sample).

    Opacus' registered sampler for the layer's exact type, else torch.func's vmap of the
    layer's own gradient (Opacus' functorch helper), which serves any layer without buffers.
    """
    sampler = GradSampleHooks.GRAD_SAMPLERS.get(type(layer))
    samples: dict[nn.Parameter, torch.Tensor] = (
        sampler(layer, activations, backprop)
        if sampler is not None
        else ft_compute_per_sample_gradient(layer, activations, backprop)
    )
    return {parameter: sample for parameter, sample in samples.items() if parameter.requires_grad}


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
