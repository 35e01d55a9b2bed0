"""The plain loops `gpu_bench` times fedfair's local step against: the loop a PyTorch user writes, and that loop
captured once as a CUDA graph; with the loss and step size every learner of the benchmark shares."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

LR = 0.05
"""Every learner's step size: the benchmark times steps, so any fixed value serves."""

Step = Callable[[], None]
"""One training step of a learner, timed as a call."""


def mean_loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; a one-logit (binary) model's is the logistic loss, as fedfair's own."""
    if outputs.shape[-1] == 1:
        return F.binary_cross_entropy_with_logits(outputs.squeeze(-1), labels.to(outputs.dtype))
    return F.cross_entropy(outputs, labels)


def bare_step(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, batch: int) -> Step:
    """The loop a PyTorch user writes, one step per call."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(1)
    order = torch.randperm(len(features), generator=generator)
    cursor = [0]

    def step() -> None:
        if cursor[0] + batch > len(order):
            cursor[0] = 0
        index = order[cursor[0] : cursor[0] + batch].to(features.device, non_blocking=True)
        cursor[0] += batch
        optimizer.zero_grad(set_to_none=True)
        mean_loss(model(features.index_select(0, index)), labels.index_select(0, index)).backward()
        optimizer.step()

    return step


def graphed_step(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, batch: int) -> Step:
    """The bare loop's step captured once as a CUDA graph (PyTorch's whole-network capture recipe)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    order = torch.randperm(len(features), device=features.device)
    static_index = order[:batch].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            mean_loss(model(features[static_index]), labels[static_index]).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = mean_loss(model(features.index_select(0, static_index)), labels.index_select(0, static_index))
        loss.backward()
        optimizer.step()
    cursor = [0]

    def step() -> None:
        if cursor[0] + batch > len(order):
            cursor[0] = 0
        static_index.copy_(order[cursor[0] : cursor[0] + batch])
        cursor[0] += batch
        graph.replay()

    return step
