"""The section of docs/benchmarks.md for benchmarks/gpu_bench.py: DP-SGD against stock Opacus on a GPU, and the
plain local step against a bare eager loop there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from report_tables import Section, count, ratio, table

MODEL_NAMES = {"adult_mlp": "Adult MLP", "mnist_cnn": "MNIST CNN", "resnet18_gn": "ResNet-18-GN"}


def _thousands(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1000:,.1f}k"


def gpu_bench(name: str, document: Mapping[str, Any]) -> Section:
    """One row per (model, batch): fedfair's auto mode against Opacus' hooks and ghost clipping, samples/s."""
    rows = []
    for row in document["dp"]:
        speeds = row["samples_per_s"]
        rows.append(
            (
                MODEL_NAMES.get(row["model"], row["model"]),
                count(row["batch_size"]),
                f"{_thousands(row['fedfair_auto_samples_per_s'])} ({row['auto_mode']})",
                _thousands(speeds.get("fedfair per_sample")),
                _thousands(speeds.get("fedfair norm")),
                _thousands(speeds.get("opacus hooks")),
                _thousands(speeds.get("opacus ghost")),
                ratio(row["fedfair_over_opacus"]),
                "yes" if row["auto_is_fastest"] else "no",
            )
        )
    plain = [
        (
            MODEL_NAMES.get(row["model"], row["model"]),
            count(row["batch_size"]),
            f"{row['seconds_per_step']['fedfair'] * 1e6:,.0f}",
            f"{row['seconds_per_step']['bare'] * 1e6:,.0f}",
            ratio(row["fedfair_over_bare"]),
            f"{row['seconds_per_step']['bare cuda graph'] * 1e6:,.0f}"
            if "bare cuda graph" in row["seconds_per_step"]
            else "n/a",
        )
        for row in document.get("plain", [])
    ]
    edited = sorted({row["model"] for row in document["dp"] if "opacus hooks" in row["notes"]})
    notes = [
        "",
        f"On {document['device']} (torch {document['torch']}, Opacus {document['opacus']}). fedfair trains its own "
        "objective (the RCVaR head) on Poisson batches; Opacus mean cross-entropy on fixed batches.",
    ]
    if edited:
        notes.append(
            f"Opacus refuses {', '.join(MODEL_NAMES.get(model, model) for model in edited)} as written "
            "(`out += identity` after a hooked layer); its rows were timed on an out-of-place copy, the edit a user "
            "of Opacus must make. fedfair trains the model as written."
        )
    notes += [
        "",
        "The plain local step (FedAvg's objective) against the loop a PyTorch user writes, and that loop captured "
        "as a CUDA graph, microseconds per step (target: fedfair at most 1.1× the bare loop):",
        "",
        *table(["model", "batch", "fedfair (µs)", "bare (µs)", "fedfair ÷ bare", "bare, CUDA graph (µs)"], plain),
    ]
    return Section(
        "DP-SGD on the GPU against stock Opacus",
        "Samples per second of one DP-SGD step (noise multiplier 1, clip 1), best of three interleaved blocks per "
        "learner: fedfair's `PrivateLearner` in the mode `auto` picks (and every mode it allows), Opacus' "
        "per-sample hooks and its ghost clipping (goal: fedfair at least the faster Opacus mode in every row).",
        table(
            [
                "model",
                "batch",
                "fedfair auto",
                "fedfair per-sample",
                "fedfair norm",
                "Opacus hooks",
                "Opacus ghost",
                "fedfair ÷ best Opacus",
                "auto fastest",
            ],
            rows,
        )
        + notes,
    )
