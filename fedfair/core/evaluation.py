"""Per-sample losses and correctness of a model on some data: the input of every fairness report.

The result never leaves its caller: a collaborator turns it into secure-sum answers
(`fedfair.fairness.sums`), the simulation into a pooled report.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedfair.core.data import ClientData
from fedfair.core.models import load_flat_parameters, per_sample_loss, predict


@dataclass
class Evaluation:
    """Per-sample losses and correctness of a model on some data."""

    losses: np.ndarray
    correct: np.ndarray


@torch.no_grad()
def evaluate(model: nn.Module, theta: torch.Tensor, data: ClientData, chunk: int = 65536) -> Evaluation:
    """Per-sample cross-entropy and correctness of parameters theta on data."""
    parameter = next(model.parameters())
    load_flat_parameters(model, theta.to(parameter.device, parameter.dtype))
    losses, correct = [], []
    for start in range(0, data.size, chunk):
        features = data.features[start : start + chunk].to(parameter.device, parameter.dtype)
        labels = data.labels[start : start + chunk].to(parameter.device)
        logits = model(features)
        losses.append(per_sample_loss(logits, labels).double().cpu())
        correct.append((predict(logits) == labels).cpu())
    return Evaluation(torch.cat(losses).numpy(), torch.cat(correct).numpy())
