"""What differential privacy costs: local-training throughput, and utility at a privacy level.

Throughput: samples/s of one collaborator's local steps with and without DP-SGD
(joint clipping of theta and c, noise), on the CPU and, when present, on the GPU,
for two models:
  - adult_mlp: the one-hidden-layer MLP (512) on Adult's training features;
  - mnist_cnn: the small CNN on MNIST's training images.
DP-SGD runs in every clipping mode the model allows: one-pass norm-only ("one_pass",
what "auto" picks for the dense MLP), two-pass norm-only ("norm", what it picks for
the CNN) and per-sample gradients ("per_sample", the fallback for other layers).
Per model: `mode` (what "auto" chose), `dp_vs_plain_time` (its DP step time over the
plain step time at the same batch size) and the same figures under `modes` for each
mode the model allows.
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
from pathlib import Path
from typing import Any

import torch
from torch import nn

from published import publish
from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner
from fedfair.core.models import build_model, flat_parameters
from fedfair.core.objective import RCVaRThreshold
from fedfair.datasets import load_dataset
from fedfair.privacy.clipping import ClippingMode, choose_clipping
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.learner import PrivateLearner
from fedfair.research.experiment import load_federation, simulate
from fedfair.research.flags import config_from_flags

MNIST_SHAPE = (1, 28, 28)
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


def build(model_name: str, num_features: int, num_classes: int) -> nn.Module:
    return build_model(model_name, num_features, num_classes, image_shape=MNIST_SHAPE if model_name == "cnn" else None)


def make_trainer(
    model_name: str,
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    batch_size: int,
    local_steps: int,
    device: torch.device,
    clipping: ClippingMode | None,
) -> LocalLearner | PrivateLearner:
    """A learner with the RCVaR head, plain (clipping None) or private in that clipping mode, begun at theta_0."""
    model = build(model_name, features.shape[1], num_classes).to(device)
    head = RCVaRThreshold(ObjectiveConfig()).to(device)
    learner = LocalLearner(model, features, labels, batch_size, LocalConfig(local_steps=local_steps), threshold=head)
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


def throughput(device: torch.device, quick: bool) -> dict[str, Any]:
    cases = {
        "adult_mlp": ("mlp", adult_features(), 2, 256, 20 if quick else 200),
        "mnist_cnn": ("cnn", mnist_images(), 10, 64, 5 if quick else 50),
    }
    if device.type == "cuda":
        cases = {
            name: (model, data, classes, batch, steps * 10)
            for name, (model, data, classes, batch, steps) in cases.items()
        }
    repeats = 3
    results: dict[str, Any] = {}
    for name, (model_name, (features, labels, source), classes, batch, steps) in cases.items():
        local_steps = WARMUP_STEPS + repeats * steps
        heads = nn.ModuleList([build(model_name, features.shape[1], classes), RCVaRThreshold(ObjectiveConfig())])
        chosen = choose_clipping(heads)
        allowed = [mode for mode in CLIPPING_MODES if _allows(heads, mode)]
        trainers: dict[str, LocalLearner | PrivateLearner] = {
            mode or "plain": make_trainer(model_name, features, labels, classes, batch, local_steps, device, mode)
            for mode in (None, *allowed)
        }
        seconds = seconds_per_step(trainers, steps, device, repeats)
        modes = {
            mode: {"dp_samples_per_s": batch / seconds[mode], "dp_vs_plain_time": seconds[mode] / seconds["plain"]}
            for mode in allowed
        }
        results[name] = {
            "data": source,
            "batch_size": batch,
            "steps": steps,
            "plain_samples_per_s": batch / seconds["plain"],
            "mode": chosen,
            **modes[chosen],
            "modes": modes,
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
    args = parser.parse_args()
    # One thread, as the other benchmarks: steady figures on a shared machine, per core on a big one.
    torch.set_num_threads(1)

    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    results: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "throughput": {device.type: throughput(device, args.quick) for device in devices},
    }
    if not args.no_utility:
        results["utility"] = utility(args.quick)
    publish(results, args.json)


if __name__ == "__main__":
    main()
