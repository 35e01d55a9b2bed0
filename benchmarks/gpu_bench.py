"""DP-SGD on the GPU against stock Opacus, and the plain local step against a bare eager loop, in one call.

Part 1, DP throughput (samples/s, higher is better): for each model and batch size (64, 1024),
  - fedfair: `PrivateLearner` in every clipping mode the model allows, and the mode "auto" picks
    (`fedfair.privacy.probe`, timed once on this device), on fedfair's objective (the RCVaR head) with
    Poisson batches of that expected size;
  - Opacus "hooks": `GradSampleModule` + `DPOptimizer` (per-sample gradients from module hooks);
  - Opacus "ghost": `GradSampleModuleFastGradientClipping` + `DPLossFastGradientClipping` (ghost clipping);
  Opacus trains with mean cross-entropy on fixed batches of that size (its cheaper case). Opacus refuses
  ResNet-18-GN as written (`out += identity` after a hooked layer); its rows then use an out-of-place copy
  (`inplace=False` ReLUs, `out = out + identity`), the edit a user of it must make, and say so.
  Models: Adult's MLP (real features), MNIST's CNN (real images), ResNet-18 with GroupNorm (width 64,
  synthetic 3 x 32 x 32 images: a step's time does not depend on content).
Part 2, plain step (seconds per step, lower is better): `LocalLearner.step()` without a threshold (FedAvg's
  mean cross-entropy) against the loop a PyTorch user writes (shuffled index, index, zero_grad, backward,
  `torch.optim.SGD.step()`), and that loop captured once as a CUDA graph, at batches 64, 256 and 1024.
Every row's learners are timed in alternating blocks (A, B, C, A, B, C, ...) with the device synchronised
around each block; a row's figure is its best block (the slow ones measure the neighbours). Each block
runs long enough to take about `--block-seconds`.

Prints JSON (and writes it with --json PATH). Meant for a GPU machine (about 5 minutes on one H100);
--device cpu --quick is a smoke run of the same code.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.local import LocalLearner
from fedfair.core.models import ResNetGN, ResidualBlock, build_model, flat_parameters
from fedfair.core.objective import RCVaRThreshold
from fedfair.datasets import load_dataset
from fedfair.privacy.clipping import ClippingMode, clipping_candidates
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.learner import PrivateLearner
from fedfair.privacy.probe import ModeProbe, per_sample_budget, per_sample_bytes
from gpu_loops import LR, Step, bare_step, graphed_step, mean_loss
from published import publish

MODELS = ("adult_mlp", "mnist_cnn", "resnet18_gn")
RESNET_IMAGE = (3, 32, 32)
DP_BATCHES = (64, 1024)
PLAIN_BATCHES = (64, 256, 1024)
WARMUP_STEPS = 3
BLOCKS = 3
MAX_STEPS_PER_BLOCK = 200


@functools.cache
def data(model: str, quick: bool) -> tuple[torch.Tensor, torch.Tensor, int, str]:
    """Features, labels, classes and where they come from, for a model name (read once per run)."""
    if model == "adult_mlp":
        dataset = load_dataset("adult")
        return torch.from_numpy(dataset.x_train), torch.from_numpy(dataset.y_train), 2, "adult (real)"
    if model == "mnist_cnn":
        dataset = load_dataset("mnist")
        return torch.from_numpy(dataset.x_train), torch.from_numpy(dataset.y_train), 10, "mnist (real)"
    generator = torch.Generator().manual_seed(0)
    samples = 2048 if quick else 8192
    features = torch.randn(samples, math.prod(RESNET_IMAGE), generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return features, labels, 10, "synthetic 3x32x32 images"


def build(model: str, features: int, classes: int, quick: bool) -> nn.Module:
    """The model, seeded alike for every learner that trains it."""
    if model == "resnet18_gn":
        torch.manual_seed(0)
        width = 16 if quick else 64
        return ResNetGN(RESNET_IMAGE, classes, width=width, groups=min(32, width))
    name, shape = ("cnn", (1, 28, 28)) if model == "mnist_cnn" else ("mlp", None)
    return build_model(name, features, classes, image_shape=shape)


class _BinaryAware(nn.Module):
    """`mean_loss` as the module Opacus' ghost-clipping loss wraps (it sets `reduction` to "none" and back)."""

    reduction = "mean"

    def forward(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if outputs.shape[-1] == 1:
            return F.binary_cross_entropy_with_logits(
                outputs.squeeze(-1), labels.to(outputs.dtype), reduction=self.reduction
            )
        return F.cross_entropy(outputs, labels, reduction=self.reduction)


def _out_of_place_forward(self: ResidualBlock, x: torch.Tensor) -> torch.Tensor:
    identity = x if self.downsample is None else self.downsample(x)
    out = F.relu(self.norm1(self.conv1(x)))
    out = self.norm2(self.conv2(out))
    return F.relu(out + identity)


def out_of_place(module: nn.Module) -> nn.Module:
    """The edit Opacus' hooks need on a residual network: no in-place ReLU, no `out += identity`."""
    for layer in module.modules():
        if isinstance(layer, nn.ReLU):
            layer.inplace = False
        if isinstance(layer, ResidualBlock):
            layer.forward = types.MethodType(_out_of_place_forward, layer)  # type: ignore[method-assign]
    return module


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def seconds_per_step(
    steps: dict[str, Step], device: torch.device, block_seconds: float, failures: dict[str, str]
) -> dict[str, float]:
    """Each step function's best block time per step, the blocks taken in turn.

    A step that fails in its warm-up (out of memory, say) is left out and its failure kept in `failures`.
    """
    alive: dict[str, Step] = {}
    per_block: dict[str, int] = {}
    for name, step in steps.items():
        try:
            for _ in range(WARMUP_STEPS):
                step()
            synchronize(device)
        except Exception as error:  # one learner that cannot run is a finding, not the end of the row
            failures[name] = _failure(error)
            release(device)
            continue
        started = time.perf_counter()
        step()
        synchronize(device)
        one = max(time.perf_counter() - started, 1e-6)
        per_block[name] = max(2, min(MAX_STEPS_PER_BLOCK, math.ceil(block_seconds / one)))
        alive[name] = step
    best = dict.fromkeys(alive, math.inf)
    for _ in range(BLOCKS):
        for name, step in list(alive.items()):
            synchronize(device)
            started = time.perf_counter()
            try:
                for _ in range(per_block[name]):
                    step()
                synchronize(device)
            except Exception as error:  # e.g. out of memory beside another learner's buffers
                failures[name] = _failure(error)
                del alive[name], best[name]
                release(device)
                continue
            best[name] = min(best[name], (time.perf_counter() - started) / per_block[name])
    return best


def steps_needed() -> int:
    """Local steps a private learner must be begun with to serve the warm-up, the sizing step and every block."""
    return WARMUP_STEPS + 1 + BLOCKS * MAX_STEPS_PER_BLOCK


def fedfair_step(
    model: nn.Module, features: torch.Tensor, labels: torch.Tensor, batch: int, clipping: str, probe: ModeProbe
) -> tuple[Step, ClippingMode]:
    """One DP-SGD step of a fresh PrivateLearner on fedfair's objective, and the mode it clips in."""
    head = RCVaRThreshold(ObjectiveConfig()).to(features.device)
    learner = LocalLearner(model, features, labels, batch, LocalConfig(local_steps=steps_needed()), threshold=head)
    privacy = PrivacyConfig(enabled=True, noise_multiplier=1.0, accountant="rdp")
    private = PrivateLearner(learner, privacy, clipping=clipping, probe=probe)
    private.begin(flat_parameters(model), 1.0)
    return private.step, private.clipping


def opacus_step(kind: str, model: nn.Module, features: torch.Tensor, labels: torch.Tensor, batch: int) -> Step:
    """One DP-SGD step of stock Opacus ("hooks" or "ghost") on mean cross-entropy, fixed batches of `batch`."""
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    order = torch.randperm(len(features), device=features.device)
    cursor = [0]

    def batch_of() -> tuple[torch.Tensor, torch.Tensor]:
        if cursor[0] + batch > len(order):
            cursor[0] = 0
        index = order[cursor[0] : cursor[0] + batch]
        cursor[0] += batch
        return features.index_select(0, index), labels.index_select(0, index)

    settings = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "expected_batch_size": batch}
    if kind == "hooks":
        module = GradSampleModule(model)
        optimizer = DPOptimizer(torch.optim.SGD(module.parameters(), lr=LR), **settings)

        def hooks_step() -> None:
            x, y = batch_of()
            optimizer.zero_grad(set_to_none=True)
            mean_loss(module(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)  # frees the per-sample gradients before the next learner runs

        return hooks_step
    ghost = GradSampleModuleFastGradientClipping(model, max_grad_norm=1.0, use_ghost_clipping=True)
    ghost_optimizer = DPOptimizerFastGradientClipping(torch.optim.SGD(ghost.parameters(), lr=LR), **settings)
    criterion = DPLossFastGradientClipping(ghost, ghost_optimizer, _BinaryAware(), loss_reduction="mean")

    def ghost_step() -> None:
        x, y = batch_of()
        ghost_optimizer.zero_grad(set_to_none=True)
        criterion(ghost(x), y).backward()
        ghost_optimizer.step()
        ghost_optimizer.zero_grad(set_to_none=True)

    return ghost_step


def _failure(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def dp_row(
    model_name: str, batch: int, device: torch.device, quick: bool, block_seconds: float, probe: ModeProbe
) -> dict[str, Any]:
    """One row of part 1: fedfair's modes and auto's choice, Opacus hooks and ghost, in samples/s."""
    cpu_features, cpu_labels, classes, source = data(model_name, quick)
    features, labels = cpu_features.to(device), cpu_labels.to(device)
    width = features.shape[1]
    notes: dict[str, str] = {}
    steps: dict[str, Step] = {}
    reference = build(model_name, width, classes, quick)
    heads = nn.ModuleList([reference, RCVaRThreshold(ObjectiveConfig())])
    modes = clipping_candidates(heads, "auto")
    if "one_pass" in modes:
        modes = ["one_pass", *(mode for mode in clipping_candidates(heads, "norm") if mode != "one_pass"), "per_sample"]
    if "per_sample" in modes and per_sample_bytes(heads, batch) > per_sample_budget(device):
        modes = [mode for mode in modes if mode != "per_sample"]
        notes["fedfair per_sample"] = (
            f"left out: {per_sample_bytes(heads, batch) / 2**30:.1f} GiB of per-sample gradients"
        )
    auto_step, chosen = fedfair_step(
        build(model_name, width, classes, quick).to(device), features, labels, batch, "auto", probe
    )
    del auto_step  # its learner's memory, before the timed learners are built
    release(device)
    for mode in modes:
        try:
            steps[f"fedfair {mode}"], _ = fedfair_step(
                build(model_name, width, classes, quick).to(device), features, labels, batch, mode, probe
            )
        except Exception as error:  # a mode the model refuses is a finding, not a crash
            notes[f"fedfair {mode}"] = _failure(error)
    for kind in ("hooks", "ghost"):
        name = f"opacus {kind}"
        model = build(model_name, width, classes, quick).to(device)
        try:
            step = opacus_step(kind, model, features, labels, batch)
            step()
            steps[name] = step
        except torch.cuda.OutOfMemoryError as error:  # Opacus' hooks hold every per-sample gradient
            notes[name] = _failure(error)
            release(device)
        except Exception as error:
            if model_name != "resnet18_gn":
                notes[name] = _failure(error)
                continue
            notes[name] = f"as written: {_failure(error)}; timed on the out-of-place copy"
            try:
                edited = out_of_place(build(model_name, width, classes, quick).to(device))
                step = opacus_step(kind, edited, features, labels, batch)
                step()
                steps[name] = step
            except Exception as again:
                notes[name] += f"; the copy too: {_failure(again)}"
                release(device)
    seconds = seconds_per_step(steps, device, block_seconds, notes)
    throughput = {name: batch / value for name, value in seconds.items()}
    fedfair = throughput.get(f"fedfair {chosen}")
    opacus = [throughput[name] for name in ("opacus hooks", "opacus ghost") if name in throughput]
    fastest_fedfair = max((name for name in throughput if name.startswith("fedfair")), key=throughput.__getitem__)
    row = {
        "model": model_name,
        "data": source,
        "batch_size": batch,
        "auto_mode": chosen,
        "auto_is_fastest": fastest_fedfair == f"fedfair {chosen}",
        "samples_per_s": throughput,
        "fedfair_auto_samples_per_s": fedfair,
        "opacus_best_samples_per_s": max(opacus) if opacus else None,
        "fedfair_over_opacus": fedfair / max(opacus) if fedfair and opacus else None,
        "notes": notes,
    }
    print(
        f"gpu_bench: {model_name} @ {batch}: "
        + ", ".join(f"{name} {value:,.0f}/s" for name, value in throughput.items())
        + f" (auto: {chosen})",
        file=sys.stderr,
        flush=True,
    )
    del steps
    release(device)
    return row


def plain_row(model_name: str, batch: int, device: torch.device, quick: bool, block_seconds: float) -> dict[str, Any]:
    """One row of part 2: fedfair's plain step, the bare eager loop and its CUDA graph, in seconds per step."""
    cpu_features, cpu_labels, classes, source = data(model_name, quick)
    features, labels = cpu_features.to(device), cpu_labels.to(device)
    width = features.shape[1]
    steps: dict[str, Step] = {}
    notes: dict[str, str] = {}
    learner = LocalLearner(
        build(model_name, width, classes, quick).to(device), features, labels, batch, LocalConfig(local_steps=1)
    )
    learner.begin(flat_parameters(learner.model), 0.0)
    steps["fedfair"] = learner.step
    steps["bare"] = bare_step(build(model_name, width, classes, quick).to(device), features, labels, batch)
    if device.type == "cuda":
        try:
            steps["bare cuda graph"] = graphed_step(
                build(model_name, width, classes, quick).to(device), features, labels, batch
            )
        except Exception as error:
            notes["bare cuda graph"] = _failure(error)
    seconds = seconds_per_step(steps, device, block_seconds, notes)
    row = {
        "model": model_name,
        "data": source,
        "batch_size": batch,
        "seconds_per_step": seconds,
        "fedfair_over_bare": seconds["fedfair"] / seconds["bare"],
        "notes": notes,
    }
    print(
        f"gpu_bench: plain {model_name} @ {batch}: fedfair/bare {row['fedfair_over_bare']:.2f}x"
        + (f", graph/bare {seconds['bare cuda graph'] / seconds['bare']:.2f}x" if "bare cuda graph" in seconds else ""),
        file=sys.stderr,
        flush=True,
    )
    release(device)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a smoke run")
    parser.add_argument("--quick", action="store_true", help="a ResNet of width 16 and short blocks (a smoke run)")
    parser.add_argument("--block-seconds", type=float, default=0.4, help="about how long each timed block runs")
    parser.add_argument("--parts", nargs="+", choices=("dp", "plain"), default=["dp", "plain"])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="the models to time")
    args = parser.parse_args()
    device = torch.device(args.device)
    # Opacus' hooks warn on every step where the first layer's input needs no gradient, as here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_bench: no CUDA device here; run it on a GPU machine (or --device cpu for a smoke run)")
    block = 0.02 if args.quick else args.block_seconds
    started = time.perf_counter()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "opacus": __import__("opacus").__version__,
    }
    if "dp" in args.parts:
        probe = ModeProbe()
        results["dp"] = [
            dp_row(model, batch, device, args.quick, block, probe) for model in args.models for batch in DP_BATCHES
        ]
    if "plain" in args.parts:
        results["plain"] = [
            plain_row(model, batch, device, args.quick, block)
            for model in args.models
            if model != "resnet18_gn"
            for batch in PLAIN_BATCHES
        ]
    results["seconds"] = time.perf_counter() - started
    publish(results, args.json)


if __name__ == "__main__":
    main()
