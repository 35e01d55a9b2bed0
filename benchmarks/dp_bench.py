"""What differential privacy costs: local-training throughput, and utility at a privacy level.

Throughput: samples/s of one collaborator's local steps with and without DP-SGD
(joint clipping of theta and c, noise), on the CPU and, when present, on the GPU,
for three models (--models picks some):
  - adult_mlp: the one-hidden-layer MLP (512) on Adult's training features, batch 256;
  - mnist_cnn: the small CNN on MNIST's training images, batch 64;
  - resnet18_gn_64 / resnet18_gn_1024: ResNet-18 with GroupNorm (fedfair.core.models.ResNetGN,
    torchvision's shape and in-place operations) on synthetic 3 x 32 x 32 images, batches 64 and 1024.
DP-SGD runs in every clipping mode the model allows: one-pass norm-only ("one_pass",
what "auto" picks for the dense MLP), two-pass norm-only ("norm") and per-sample
gradients ("per_sample"; left out, under `skipped`, where one step's per-sample
gradients would exceed `per_sample_budget`, as "auto" leaves it out). Per model: `mode` (what "auto"
chose: by rule, or by timing norm-only against per-sample clipping once),
`fastest_measured` (the fastest mode in this run's blocks), `dp_vs_plain_time` (the
chosen mode's DP step time over the plain step time at the same batch size) and the same
figures under `modes` for each mode timed.
On one CPU thread. Only the step loop is timed (accounting happens once per round,
outside it), best of three blocks, the plain and private learners' blocks taken in
turn so that a slow spell of the machine hits them alike; DP batches are Poisson
samples, counted at their expected size.

Utility (unless --no-utility): FedSRCVaR (logistic regression, Adult split by race
into 3 collaborators, eps = 0.1, rho = 0.3) with every collaborator at DP epsilon
1, 3, 8 (delta 1e-5, sigma calibrated per collaborator for the planned rounds, RDP
accountant) at clip bounds 1 and 20, and without DP; held-out worst-group
(rho = 0.3) and mean risk of the averaged iterate, and its threshold c.
Why two clip bounds: c's gradient is clipped jointly with theta's, and samples above
c have large theta gradients, so a small bound shrinks their pull on c more than the
others' and c settles below the (1 - rho)-quantile: the model drifts toward ERM
(lower mean risk, higher worst-group risk). A bound above typical gradient norms
keeps c near its non-private value at the price of more noise.

Prints JSON (and writes it with --json PATH); --quick shortens every part.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from published import publish
from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner
from fedfair.core.models import ResNetGN, build_model, flat_parameters
from fedfair.core.objective import RCVaRThreshold
from fedfair.datasets import load_dataset
from fedfair.privacy.clipping import ClippingMode, choose_clipping
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.learner import PrivateLearner
from fedfair.privacy.probe import per_sample_budget, per_sample_bytes
from fedfair.research.experiment import load_federation, simulate
from fedfair.research.flags import config_from_flags

MNIST_SHAPE = (1, 28, 28)
RESNET_IMAGE = (3, 32, 32)
MODELS = ("mlp", "cnn", "resnet18_gn")
DP_EPSILONS = (1.0, 3.0, 8.0)
# Opacus' customary C = 1 and one above most of Adult's per-sample gradient norms: with
# C = 1 nearly every sample is clipped, which biases the threshold c (see the docstring).
DP_CLIPS = (1.0, 20.0)
CLIPPING_MODES: tuple[ClippingMode, ...] = ("one_pass", "norm", "per_sample")
WARMUP_STEPS = 3


def adult_features() -> tuple[torch.Tensor, torch.Tensor, str]:
    dataset = load_dataset("adult")
    return torch.from_numpy(dataset.x_train), torch.from_numpy(dataset.y_train), "adult (real)"


def mnist_images() -> tuple[torch.Tensor, torch.Tensor, str]:
    dataset = load_dataset("mnist")
    return torch.from_numpy(dataset.x_train), torch.from_numpy(dataset.y_train), "mnist (real)"


def synthetic_images(samples: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Standard normal 3 x 32 x 32 images with 10 random classes: the time of a step does not depend on content."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(samples, math.prod(RESNET_IMAGE), generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return features, labels, f"synthetic {'x'.join(map(str, RESNET_IMAGE))} images"


@dataclass(frozen=True)
class Case:
    """One throughput row: a model on its data at one batch size, timed over `steps` steps per block."""

    model: str  # "mlp", "cnn" or "resnet18_gn"
    data: Callable[[], tuple[torch.Tensor, torch.Tensor, str]]
    classes: int
    batch: int
    steps: int
    width: int = 64  # ResNet's first stage; 64 is ResNet-18


def throughput_cases(quick: bool, models: Sequence[str]) -> dict[str, Case]:
    """The rows to time: Adult's MLP at 256, MNIST's CNN at 64 and ResNet-18-GN at 64 and 1024.

    --quick takes fewer steps and a ResNet of width 16 (the same shape, 1/16 of the weights):
    a smoke run, not ResNet-18's figures.
    """
    width = 16 if quick else 64
    cases = {
        "adult_mlp": Case("mlp", adult_features, 2, 256, 20 if quick else 200),
        "mnist_cnn": Case("cnn", mnist_images, 10, 64, 5 if quick else 50),
        "resnet18_gn_64": Case("resnet18_gn", lambda: synthetic_images(4096), 10, 64, 1 if quick else 5, width),
        "resnet18_gn_1024": Case("resnet18_gn", lambda: synthetic_images(8192), 10, 1024, 1 if quick else 2, width),
    }
    return {name: case for name, case in cases.items() if case.model in models}


def build(case: Case, num_features: int) -> nn.Module:
    if case.model == "resnet18_gn":
        torch.manual_seed(0)
        return ResNetGN(RESNET_IMAGE, case.classes, width=case.width, groups=min(32, case.width))
    image_shape = MNIST_SHAPE if case.model == "cnn" else None
    return build_model(case.model, num_features, case.classes, image_shape=image_shape)


def make_trainer(
    case: Case,
    features: torch.Tensor,
    labels: torch.Tensor,
    local_steps: int,
    device: torch.device,
    clipping: str | None,
) -> LocalLearner | PrivateLearner:
    """A learner with the RCVaR head, plain (clipping None) or private in that clipping mode, begun at theta_0."""
    model = build(case, features.shape[1]).to(device)
    head = RCVaRThreshold(ObjectiveConfig()).to(device)
    config = LocalConfig(local_steps=local_steps)
    learner = LocalLearner(model, features, labels, case.batch, config, threshold=head)
    privacy = PrivacyConfig(enabled=True, noise_multiplier=1.0, accountant="rdp")
    trainer = learner if clipping is None else PrivateLearner(learner, privacy, clipping=clipping)
    trainer.begin(flat_parameters(model), 1.0)
    return trainer


def seconds_per_step(
    trainers: dict[str, LocalLearner | PrivateLearner], steps: int, device: torch.device, repeats: int = 3
) -> dict[str, float]:
    """Seconds per local step of each trainer: the best of `repeats` timed blocks after a warm-up.

    The best block, not the mean: on a shared machine the slow blocks measure the neighbours.
    The trainers' blocks alternate, so that the ratios compare like with like.
    """
    for trainer in trainers.values():
        for _ in range(WARMUP_STEPS):
            trainer.step()
    best = dict.fromkeys(trainers, math.inf)
    for _ in range(repeats):
        for name, trainer in trainers.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(steps):
                trainer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best[name] = min(best[name], (time.perf_counter() - started) / steps)
    return best


def throughput(device: torch.device, quick: bool, models: Sequence[str]) -> dict[str, Any]:
    repeats = 3
    results: dict[str, Any] = {}
    for name, case in throughput_cases(quick, models).items():
        if device.type == "cuda":
            case = replace(case, steps=case.steps * 10)
        features, labels, source = case.data()
        local_steps = WARMUP_STEPS + repeats * case.steps
        heads = nn.ModuleList([build(case, features.shape[1]), RCVaRThreshold(ObjectiveConfig())])
        allowed = [mode for mode in CLIPPING_MODES if _allows(heads, mode)]
        skipped = {}
        if "per_sample" in allowed and per_sample_bytes(heads, case.batch) > per_sample_budget(device):
            allowed.remove("per_sample")
            gigabytes = per_sample_bytes(heads, case.batch) / 2**30
            skipped["per_sample"] = f"{gigabytes:.1f} GiB of per-sample gradients per step"
        # What "auto" picks here: the rule, or where it leaves two modes, the probe's timing of them.
        auto = make_trainer(case, features, labels, 1, device, "auto")
        assert isinstance(auto, PrivateLearner)
        chosen = auto.clipping
        del auto  # its model's memory, before the timed learners are built
        trainers: dict[str, LocalLearner | PrivateLearner] = {
            mode or "plain": make_trainer(case, features, labels, local_steps, device, mode)
            for mode in (None, *allowed)
        }
        seconds = seconds_per_step(trainers, case.steps, device, repeats)
        modes = {
            mode: {"dp_samples_per_s": case.batch / seconds[mode], "dp_vs_plain_time": seconds[mode] / seconds["plain"]}
            for mode in allowed
        }
        fastest = min(allowed, key=lambda mode: seconds[mode])
        results[name] = {
            "data": source,
            "model": case.model if case.model != "resnet18_gn" else f"resnet18_gn (width {case.width})",
            "batch_size": case.batch,
            "steps": case.steps,
            "plain_samples_per_s": case.batch / seconds["plain"],
            "mode": chosen,
            "fastest_measured": fastest,
            **modes[chosen],
            "modes": modes,
            "skipped": skipped,
        }
        ratios = ", ".join(f"{mode} {figures['dp_vs_plain_time']:.2f}x" for mode, figures in modes.items())
        print(
            f"dp_bench: {device.type} {name}: DP step time over plain: {ratios} (auto picks {chosen})", file=sys.stderr
        )
    return results


def _allows(heads: nn.Module, mode: ClippingMode) -> bool:
    """Whether `mode` can train this model (one-pass takes dense layers only)."""
    try:
        choose_clipping(heads, mode)
    except ConfigError:
        return False
    return True


def utility(quick: bool) -> dict[str, Any]:
    """FedSRCVaR at each DP level, through `fedfair simulate`'s own flags and defaults."""
    base = ["--dataset", "adult", "--partition", "race", "--clients", "3", "--model", "logreg"]
    base += ["--epsilon", "0.1", "--rho", "0.3", "--rounds", "200" if quick else "1000"]
    settings: list[tuple[float, float | None]] = [(e, clip) for clip in DP_CLIPS for e in DP_EPSILONS] + [
        (math.inf, None)
    ]
    federation = load_federation(config_from_flags(base))
    rows = []
    for dp_epsilon, clip in settings:
        flags = (
            base
            if clip is None
            else [
                *base,
                "--dp-target-epsilon",
                str(dp_epsilon),
                "--dp-max-grad-norm",
                str(clip),
                "--dp-accountant",
                "rdp",
            ]
        )
        config = config_from_flags(flags)
        result = simulate(config, federation, progress=False)
        test = result["final"]["test"]
        rows.append(
            {
                "dp_epsilon": dp_epsilon if math.isfinite(dp_epsilon) else "inf",
                "max_grad_norm": clip,
                "worst_risk": test["worst_risk"],
                "mean_risk": test["mean_risk"],
                "accuracy": test["accuracy"],
                "c": result["final"]["c"],
                "collaborators": result["privacy"],
                "seconds": result["seconds"],
            }
        )
        print(
            f"dp_bench: DP epsilon {dp_epsilon}, clip {clip}: worst {test['worst_risk']:.4f}, mean {test['mean_risk']:.4f}",
            file=sys.stderr,
        )
    header = (
        "| DP epsilon (delta 1e-5) | clip C | worst-group risk (rho 0.3) | mean risk | accuracy | threshold c |\n"
        "|---|---|---|---|---|---|\n"
    )
    table = header + "".join(
        f"| {_label(row['dp_epsilon'], 'inf (no DP)')} | {_label(row['max_grad_norm'], '-')} | {row['worst_risk']:.4f} | "
        f"{row['mean_risk']:.4f} | {row['accuracy']:.4f} | {row['c']:.3f} |\n"
        for row in rows
    )
    return {
        "setup": {"flags": base, "accountant": "rdp", "delta": 1e-5, "iterate": "average"},
        "rows": rows,
        "table_markdown": table,
    }


def _label(value: float | str | None, special: str) -> str:
    return special if value in ("inf", None) else f"{value:g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (a smoke run, noisier figures)")
    parser.add_argument(
        "--no-utility", action="store_true", help="skip the privacy-utility table (it trains 4 federations)"
    )
    parser.add_argument(
        "--models", nargs="+", choices=MODELS, default=list(MODELS), help="the throughput rows to time (default: all)"
    )
    args = parser.parse_args()
    # One thread, as the other benchmarks: steady figures on a shared machine, per core on a big one.
    torch.set_num_threads(1)

    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    results: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "throughput": {device.type: throughput(device, args.quick, args.models) for device in devices},
    }
    if not args.no_utility:
        results["utility"] = utility(args.quick)
    publish(results, args.json)


if __name__ == "__main__":
    main()
