"""Opacus hooks: the per-sample gradient of the threshold c, and which models DP-SGD can train.

c lives in `RCVaRThreshold`, a module with a registered per-sample gradient, so its
gradient is clipped together with theta's (one joint norm) and noised alike.
"""

from __future__ import annotations

import torch
from opacus.grad_sample import register_grad_sampler
from opacus.utils.module_utils import has_trainable_params
from opacus.validators import ModuleValidator
from torch import nn

from fedfair.core.errors import ConfigError
from fedfair.core.objective import RCVaRThreshold

# ---------------------------------------------------------------- per-sample gradient of c


def _threshold_grad_sample(
    module: RCVaRThreshold, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """d(output_i)/dc times the backpropagated gradient of each sample: one scalar per sample.

    Output i depends on c only through sample i's own loss term, so the per-sample
    gradient is exact: backprops_i * (1 - eps) * (1 - s'(l_i - c) / rho).
    """
    losses = activations[0].to(backprops.dtype)
    with torch.no_grad():
        return {module.c: backprops * module.grad_c_per_sample(losses)}


# Registered by a call, not a decorator: Opacus ships no types, so its decorator would erase this signature.
register_grad_sampler(RCVaRThreshold)(_threshold_grad_sample)


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

