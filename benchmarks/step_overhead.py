"""What fedfair's plain local step costs over a bare eager PyTorch loop on the same model and batches.

For each model (Adult's MLP on 107 features, MNIST's CNN; synthetic data of their shapes,
as a step's time does not depend on content) and batch size (64, 256, 1024), two copies of
the same model are trained side by side:
  - fedfair: `LocalLearner.step()` without a threshold (the FedAvg objective, the mean
    cross-entropy), which draws its batch, computes the gradient and takes the algorithm's step;
  - bare: the loop a PyTorch user writes: slice a shuffled index, index the batch, zero the
    gradients, mean cross-entropy, backward, `torch.optim.SGD.step()` (same learning rate).
Their blocks of steps alternate (A, B, A, B, ...) in one process on one thread, so that a slow
spell of a shared machine hits both alike; each block is timed in CPU seconds of this process
(`time.process_time`), and `ratio` is fedfair's best block over the bare loop's best block
(the best, as the slow blocks measure the neighbours). `median_pair_ratio` is the median of
the ratios of the blocks taken side by side, a second view of the same.

Prints JSON (and writes it with --json PATH); --quick times fewer, shorter blocks.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from fedfair.core.config import LocalConfig
from fedfair.core.local import BatchSampler, LocalLearner
from fedfair.core.models import build_model, flat_parameters
from published import publish

MODELS = {"adult_mlp": ("mlp", 107, 2), "mnist_cnn": ("cnn", 784, 10)}
BATCHES = (64, 256, 1024)
LR = 0.05


def bare_loop(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, batch: int) -> Callable[[], None]:
    """One step of the loop a PyTorch user writes, as a closure over its model, optimizer and shuffled order."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    sampler = BatchSampler(features.shape[0], batch, seed=1)
    binary = model(features[:1]).shape[-1] == 1

    def step() -> None:
        index = sampler.next_batch()
        x = features if index is None else features[index]
        y = labels if index is None else labels[index]
        optimizer.zero_grad(set_to_none=True)
        outputs = model(x)
        if binary:
            loss = F.binary_cross_entropy_with_logits(outputs.squeeze(-1), y.to(outputs.dtype))
        else:
            loss = F.cross_entropy(outputs, y)
        torch.autograd.backward(loss)
        optimizer.step()

    return step


def compare(name: str, batch: int, steps: int, blocks: int) -> dict[str, Any]:
    """fedfair's plain step against the bare loop for one model and batch size: CPU seconds per step and their ratio."""
    model_name, width, classes = MODELS[name]
    generator = torch.Generator().manual_seed(0)
    samples = max(4 * batch, 4096)
    features = torch.randn(samples, width, generator=generator)
    labels = torch.randint(0, classes, (samples,), generator=generator)
    shape = (1, 28, 28) if model_name == "cnn" else None
    ours = build_model(model_name, width, classes, image_shape=shape, seed=3)
    theirs = build_model(model_name, width, classes, image_shape=shape, seed=3)
    learner = LocalLearner(ours, features, labels, batch, LocalConfig(local_steps=1, lr=LR), seed=1)
    learner.begin(flat_parameters(ours), 0.0)
    runners = {"fedfair": learner.step, "bare": bare_loop(theirs, features, labels, batch)}
    for run in runners.values():  # warm-up: first-call allocations are neither's cost
        for _ in range(3):
            run()
    seconds: dict[str, list[float]] = {label: [] for label in runners}
    for _ in range(blocks):
        for label, run in runners.items():
            started = time.process_time()
            for _ in range(steps):
                run()
            seconds[label].append((time.process_time() - started) / steps)
    best = {label: min(times) for label, times in seconds.items()}
    pairs = [ours_ / bare for ours_, bare in zip(seconds["fedfair"], seconds["bare"], strict=True)]
    return {
        "batch_size": batch,
        "steps_per_block": steps,
        "blocks": blocks,
        "fedfair_ms_per_step": best["fedfair"] * 1e3,
        "bare_ms_per_step": best["bare"] * 1e3,
        "ratio": best["fedfair"] / best["bare"],
        "median_pair_ratio": statistics.median(pairs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter blocks (a smoke run, noisier ratios)")
    args = parser.parse_args()
    # One thread: steady figures on a shared machine, and CPU time equal to the step's own time.
    torch.set_num_threads(1)
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in MODELS:
        rows[name] = []
        for batch in BATCHES:
            # About 0.2 CPU-s per block (1/10 of that with --quick), whatever the step costs.
            per_step = 4e-6 * batch if name == "adult_mlp" else 1.5e-4 * batch
            steps = max(2, int((0.02 if args.quick else 0.2) / per_step))
            row = compare(name, batch, steps, 5 if args.quick else 15)
            rows[name].append(row)
            print(f"step_overhead: {name} batch {batch}: fedfair / bare = {row['ratio']:.3f}", flush=True)
    publish({"torch_threads": torch.get_num_threads(), "clock": "process_time", "rows": rows}, args.json)


if __name__ == "__main__":
    main()
