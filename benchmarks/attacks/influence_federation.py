"""One live loopback federation of Adult by race, one site lying or poisoning, and the quality of its model.

fedfair's aggregator runs in a thread (:class:`~attacks.pinned_federation.LoopAggregator`) with real
:class:`~fedfair.runtime.collaborator.client.Collaborator` objects in threads, the plan's ``[influence]`` agreeing
every institution's weight (make_workspace's declared sizes) and bounding each round update by C (``update_norm``).
:func:`run_federation` and :func:`evaluate_model` are shared by the influence rows (:mod:`attacks.influence`) and
``benchmarks/influence_bench.py``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.pinned_federation import LoopAggregator
from attacks.federation import HonestCollaborators
from attacks.liars import Liar
from fedfair.core.data import ClientData
from fedfair.core.evaluation import evaluate
from fedfair.core.models import build_model
from fedfair.datasets import load_dataset, partition
from fedfair.fairness import pooled
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.collaborator.client import Collaborator, TrainedUpdate
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_aggregator_plan

NAMES = ("site-a", "site-b", "site-c")
"""Adult by race: site-a White (the largest), site-b Black, site-c Other (the smallest)."""
RACES = {"site-a": "White", "site-b": "Black", "site-c": "Other"}
SMALLEST, LARGEST = "site-c", "site-a"
TIMEOUT = 30.0


def plan_sections(*, secure: bool, rounds: int, **extra: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """aggregator/plan.toml's learning settings (FedSRCVaR, local_steps 5, batch_fraction 0.01, lr 0.1);
    make_workspace adds [influence] weights = "declared" with the true sizes and C = 2.0 (the default)."""
    sections: dict[str, dict[str, Any]] = {
        "objective": {"epsilon": 0.1, "rho": 0.3, "gamma": 0.05, "smooth": "softrelu", "bound": 10.0},
        "training": {
            "rounds": rounds,
            "local_steps": 5,
            "batch_fraction": 0.01,
            "lr": 0.1,
            "threshold_lr": 0.1,
            "seed": 0,
            "average_from": 0.5,
        },
        "secure_aggregation": {"enabled": secure},
        "quorum": {"min_collaborators": 2, "round_timeout_seconds": TIMEOUT},
        "evaluation": {"every": 0},
    }
    for section, values in extra.items():
        sections.setdefault(section, {}).update(values)
    return sections


# ---------------------------------------------------------------- one federation


@dataclass
class RunResult:
    """What a federation run left: its round log, final model and the parties' errors."""

    plan: AggregatorPlan
    log: list[dict[str, Any]]
    final: dict[str, Any] | None
    errors: dict[str, str]
    seconds: float = 0.0
    uploads: list[tuple[str, float]] = field(default_factory=list)
    """(sender, weight) of every plain training upload the aggregator's screen saw (with `tap_weights`)."""
    norms: dict[str, list[float]] = field(default_factory=dict)
    """Each honest site's round updates' L2 norms (delta theta, delta c), as bounded and sent."""
    raw_norms: dict[str, list[float]] = field(default_factory=dict)
    """The same sites' updates' L2 norms as their trainer made them, before ``core.local.bounded``."""

    @property
    def applied(self) -> int:
        return sum(record.get("status") == "applied" for record in self.log)

    @property
    def aborted(self) -> int:
        return sum(record.get("status") == "aborted" for record in self.log)

    def contributed(self, name: str) -> int:
        return sum(name in record.get("contributors", []) for record in self.log if record.get("status") == "applied")

    def reasons(self) -> list[str]:
        seen: list[str] = []
        for record in self.log:
            reason = str(record.get("reason", ""))
            if reason and reason not in seen:
                seen.append(reason)
        return seen


def weight_tap(uploads: list[tuple[str, float]]) -> Callable[[RoundLoop], None]:
    """A hook on the aggregator's plain-upload screen that records each upload's weight."""

    def adjust(loop: RoundLoop) -> None:
        run = loop.driver.run

        def tapped(*args: Any, **options: Any) -> Any:
            screen = options.get("screen")
            if screen is not None:

                def recording(peer: str, values: np.ndarray, weight: float) -> None:
                    uploads.append((peer, weight))
                    screen(peer, values, weight)

                options["screen"] = recording
            return run(*args, **options)

        loop.driver.run = tapped  # type: ignore[method-assign]

    return adjust


def run_federation(
    root: Path,
    *,
    secure: bool,
    rounds: int,
    liar: Liar | Callable[[AggregatorPlan], Liar] | None = None,
    plan: Mapping[str, Mapping[str, Any]] | None = None,
    data: Mapping[str, Mapping[str, Any]] | None = None,
    names: tuple[str, ...] = NAMES,
    privacy: Mapping[str, Mapping[str, Any]] | None = None,
    adjust: Callable[[str, Collaborator], None] | None = None,
    tap_weights: bool = False,
    seconds: float = 300.0,
    wait_for: str | None = None,
) -> RunResult:
    """A live loopback federation: fedfair's aggregator in a thread, a Collaborator per name in threads
    (`liar`, or `liar(plan)`, replacing one site's training), `privacy[name]` as that site's [privacy].
    It waits up to `seconds` for every collaborator to finish (with `wait_for`, for that one only)."""
    started = time.perf_counter()
    workspace = make_workspace(root, names, plan=plan_sections(secure=secure, rounds=rounds, **(plan or {})), data=data)
    loaded = load_aggregator_plan(workspace.plan)
    chosen = liar(loaded) if callable(liar) and not isinstance(liar, Liar) else liar
    uploads: list[tuple[str, float]] = []
    aggregator = LoopAggregator(loaded, adjust=weight_tap(uploads) if tap_weights else None)
    configs = {name: load_collaborator_config(workspace.configs[name]) for name in names}
    for name, section in (privacy or {}).items():
        configs[name] = dataclasses.replace(
            configs[name], privacy=dataclasses.replace(configs[name].privacy, **dict(section))
        )

    norms: dict[str, list[float]] = {}
    raw_norms: dict[str, list[float]] = {}

    def patch(name: str, collaborator: Collaborator) -> None:
        if chosen is not None and name == chosen.name:
            chosen.install(collaborator)
        else:
            record_norms(collaborator, norms.setdefault(name, []))
            record_raw_norms(collaborator, raw_norms.setdefault(name, []))
        if adjust is not None:
            adjust(name, collaborator)

    group = HonestCollaborators.launch(configs, lambda name: None, adjust=patch)
    try:
        if wait_for is not None:
            group.threads[wait_for].join(seconds)
        else:
            group.join(seconds)
    finally:
        group.stop()
        aggregator.stop()
    errors = dict(group.errors)
    if aggregator.error:
        errors["aggregator"] = aggregator.error
    final_path = workspace.output / "final_model.pt"
    final = torch.load(final_path, weights_only=True) if final_path.exists() else None
    log = read_round_log(workspace.output)
    return RunResult(loaded, log, final, errors, time.perf_counter() - started, uploads, norms, raw_norms)


def record_norms(collaborator: Collaborator, norms: list[float]) -> None:
    """Keep the norm of every update this (honest) collaborator sends."""
    train_on = collaborator.train_on

    def recording(*args: Any, **options: Any) -> TrainedUpdate:
        trained = train_on(*args, **options)
        if trained.vector is not None and trained.weight > 0:
            norms.append(float(np.linalg.norm(trained.vector)) / trained.weight)
        return trained

    collaborator.train_on = recording  # type: ignore[method-assign]


def record_raw_norms(collaborator: Collaborator, norms: list[float]) -> None:
    """Keep the L2 norm of (delta theta, delta c) of every update this collaborator's trainer makes, before
    ``core.local.bounded`` scales it into the C ball (its trainer is wrapped once ``prepare`` builds it)."""
    prepare = collaborator.prepare

    def preparing(local: Any, shared: Any) -> None:
        prepare(local, shared)
        trainer = collaborator.trainer
        if trainer is None:
            return
        train_round = trainer.train_round

        def recording(*args: Any, **options: Any) -> Any:
            update = train_round(*args, **options)
            delta = update.delta.detach().to("cpu", torch.float64)
            norms.append(math.sqrt(float(delta.square().sum()) + float(update.delta_c) ** 2))
            return update

        trainer.train_round = recording  # type: ignore[method-assign]

    collaborator.prepare = preparing  # type: ignore[method-assign,assignment]


# ---------------------------------------------------------------- the model's quality


@cache
def held_out() -> dict[str, ClientData]:
    """Each site's held-out rows (Adult by race, make_workspace's partition)."""
    dataset = load_dataset("adult")
    splits = partition(dataset, "race", len(NAMES), seed=0)
    return {
        name: ClientData(
            name,
            torch.from_numpy(np.ascontiguousarray(dataset.x_test[split.test_index])),
            torch.from_numpy(dataset.y_test[split.test_index]).long(),
        )
        for name, split in zip(NAMES, splits, strict=True)
    }


def evaluate_model(plan: AggregatorPlan, theta: torch.Tensor) -> dict[str, Any]:
    """Worst-group (site) loss, each site's loss and accuracy, and the pooled rho-worst risk of `theta`."""
    model = build_model(plan.model.name, plan.model.features, plan.model.classes)
    groups: dict[str, dict[str, float]] = {}
    losses, correct = [], []
    for name, data in held_out().items():
        result = evaluate(model, theta.to(torch.float32), data)
        groups[name] = {
            "race": RACES[name],  # type: ignore[dict-item]
            "rows": data.size,
            "loss": round(float(np.mean(result.losses)), 5),
            "accuracy": round(float(np.mean(result.correct)), 5),
        }
        losses.append(np.asarray(result.losses))
        correct.append(np.asarray(result.correct))
    report = pooled.group_risk_report(np.concatenate(losses), np.concatenate(correct), plan.objective.rho)
    worst = max(groups, key=lambda name: groups[name]["loss"])
    return {
        "worst_group_loss": groups[worst]["loss"],
        "worst_group": worst,
        "worst_rho_risk": round(float(report.worst_risk), 5),
        "accuracy": round(float(report.accuracy), 5),
        "groups": groups,
    }


def summary(
    run: RunResult, honest: Mapping[str, Any] | None = None, liar: Liar | None = None, poisoned: str | None = None
) -> dict[str, Any]:
    """The JSON of one run: rounds applied / aborted, the final averaged model's quality, the ratio to honest
    (`poisoned`: the site whose labels were flipped, see :func:`poisoner`; its norms sit with the honest ones)."""
    document: dict[str, Any] = {"rounds_applied": run.applied, "rounds_aborted": run.aborted}
    if poisoned is not None:
        document["poisoner"] = poisoned
        document["poisoner_in_applied_rounds"] = run.contributed(poisoned)
    if liar is not None:
        document["liar"] = liar.name
        document["liar_in_applied_rounds"] = run.contributed(liar.name)
        if liar.sent:
            document["liar_sent"] = {
                "rounds": len(liar.sent),
                "weight": liar.sent[-1]["weight"],
                "max_update_norm": round(max(item["update_norm"] for item in liar.sent), 4),
            }
    if run.reasons():
        document["abort_reasons"] = [reason[:240] for reason in run.reasons()[:3]]
    if run.errors:
        document["errors"] = run.errors
    if run.norms:
        document["honest_update_norms"] = {
            name: {"median": round(float(np.median(values)), 4), "max": round(max(values), 4)}
            for name, values in sorted(run.norms.items())
            if values
        }
    if run.raw_norms and any(run.raw_norms.values()):
        document["raw_update_norms"] = {
            name: {"median": round(float(np.median(values)), 4), "max": round(max(values), 4)}
            for name, values in sorted(run.raw_norms.items())
            if values
        }
    if run.final is None:
        document["final_model"] = "missing"
        return document
    quality = evaluate_model(run.plan, run.final["theta_average"])
    document.update(quality)
    if honest is not None:
        document["worst_loss_ratio"] = round(quality["worst_group_loss"] / honest["worst_group_loss"], 4)
        document["worst_rho_risk_ratio"] = round(quality["worst_rho_risk"] / honest["worst_rho_risk"], 4)
    document["seconds"] = round(run.seconds, 1)
    return document


def agreed(plan: AggregatorPlan, name: str) -> float:
    return float(plan.influence.weight_of(name, plan.batch_fraction))


def agreed_total(plan: AggregatorPlan) -> float:
    return float(plan.influence.total_weight(plan.collaborators, plan.batch_fraction))
