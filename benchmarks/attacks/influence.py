"""Bounded influence: one institution that lies about its weight or its update, and DP's weight.

The plan's ``[influence]`` agrees every institution's weight (``weights = "declared"``:
round(batch_fraction * declared rows)) and bounds each round update by C (``update_norm``).
Here fedfair's aggregator runs in a thread (:class:`~attacks.pinned_federation.LoopAggregator`) with
real :class:`~fedfair.runtime.collaborator.client.Collaborator` objects on Adult split by
race (make_workspace's default data and declared sizes), one of them a liar: its
``train_on`` is replaced on that one instance, so it skips ``core.local.bounded`` and sends
a vector and weight of its own, steering toward a target model (the negative of an honest
run's model, which flips its predictions).

- liar weight: a claimed weight of 1e6 (inside the encoding's max_weight and per-coordinate
  clip, as the old checks allowed): a plain upload is refused and the round applied
  without it, a secure round is void (the decoded total is not the agreed one), so the
  model is never steered (plain: the other sites' worst-group loss within 10% of the honest
  run's); and a liar at the bound (the agreed weight, an update of L2 norm exactly C toward
  the target every round), accepted, and just past it (1.05 C), refused. The bound is per
  round: what the liar at C does over the rounds is measured, not bounded, beside the honest
  run and a poisoner.
- poisoner (the yardstick, no row of its own): :func:`poisoner` makes one site an honest protocol participant
  (bounded() and its agreed weight included) whose training labels are flipped; no protocol can detect it.
- dp weight: a DP collaborator (noise_multiplier 1.0, batch_fraction 0.5) on neighbouring
  datasets of 300 and 299 training rows with 300 declared: the weight the aggregator
  receives (the plain upload's last value, read by a hook on the aggregator's upload
  screen) must be the same; and without declared sizes the DP collaborator refuses to start,
  naming ``[influence] sizes``.

:func:`run_federation` and :func:`evaluate_model` are shared with ``benchmarks/influence_bench.py``.
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
from attacks.rows import PATCHED_AGGREGATOR, PATCHED_COLLABORATOR, RowBook
from fedfair.core.data import ClientData
from fedfair.core.evaluation import evaluate
from fedfair.core.models import build_model
from fedfair.datasets import load_dataset, partition
from fedfair.fairness import pooled
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.collaborator.client import Collaborator, TrainedUpdate
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import declared_sizes, make_workspace
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_aggregator_plan

NAMES = ("site-a", "site-b", "site-c")
"""Adult by race: site-a White (the largest), site-b Black, site-c Other (the smallest)."""
RACES = {"site-a": "White", "site-b": "Black", "site-c": "Other"}
SMALLEST, LARGEST = "site-c", "site-a"
CLAIMED_WEIGHT = 1e6
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


# ---------------------------------------------------------------- liars


Steer = Callable[[torch.Tensor, float], tuple[np.ndarray, float]]
"""(theta, c) of the round -> (the weighted vector [w * delta, w * delta_c], w) the liar sends."""


@dataclass
class Liar:
    """How one site lies: `steer` makes each round's vector and weight; `sent` keeps what it sent."""

    name: str
    steer: Steer
    sent: list[dict[str, float]] = field(default_factory=list)

    def install(self, collaborator: Collaborator) -> None:
        def lying_train_on(
            stub: Any, binding: Any, model: str, theta: torch.Tensor, c: float, control: Any = None
        ) -> TrainedUpdate:
            vector, weight = self.steer(theta.to(torch.float64), c)
            kept = np.array(vector, dtype=np.float64)
            kept.setflags(write=False)
            self.sent.append(
                {"round": binding.round, "weight": weight, "update_norm": float(np.linalg.norm(kept)) / weight}
            )
            return TrainedUpdate(binding.round, model, kept, float(weight))

        collaborator.train_on = lying_train_on  # type: ignore[method-assign]


def toward(target: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """The unit vector from theta to the target (delta_c left 0)."""
    direction = target.to(torch.float64) - theta
    return direction / max(float(direction.norm()), 1e-12)


def claimed_weight_liar(name: str, target: torch.Tensor, clip: float) -> Liar:
    """Weight 1e6 and delta = target - theta clipped to [-clip, clip] per coordinate (the old checks)."""

    def steer(theta: torch.Tensor, c: float) -> tuple[np.ndarray, float]:
        delta = (target.to(torch.float64) - theta).clamp(-clip, clip)
        return np.append(delta.numpy(), 0.0) * CLAIMED_WEIGHT, CLAIMED_WEIGHT

    return Liar(name, steer)


def bound_liar(name: str, target: torch.Tensor, weight: float, norm: float) -> Liar:
    """The agreed weight and an update of L2 norm exactly C toward the target, every round."""

    def steer(theta: torch.Tensor, c: float) -> tuple[np.ndarray, float]:
        delta = toward(target, theta) * norm
        return np.append(delta.numpy(), 0.0) * weight, weight

    return Liar(name, steer)


def mean_bound_liar(
    name: str, target: torch.Tensor, weight: float, total: float, norm: float, clip: float, fraction: float = 0.9
) -> Liar:
    """Secure rounds check only the mean: the agreed weight and a weighted vector of norm `fraction` W C toward
    the target (W the agreed total), its update kept inside the encoding's per-coordinate clip."""

    def steer(theta: torch.Tensor, c: float) -> tuple[np.ndarray, float]:
        delta = (toward(target, theta) * (fraction * total * norm / weight)).clamp(-clip, clip)
        return np.append(delta.numpy(), 0.0) * weight, weight

    return Liar(name, steer)


def poisoner(name: str) -> Callable[[str, Collaborator], None]:
    """An `adjust` for :func:`run_federation`: `name` is an honest protocol participant (fedfair's own
    ``train_on``, ``core.local.bounded`` and its agreed weight) whose training labels are flipped (y -> 1 - y,
    binary Adult) before its learner is built; its held-out rows keep their true labels. No protocol can tell
    it from an honest site: the yardstick for what a liar gains beyond its declared share."""

    def adjust(site: str, collaborator: Collaborator) -> None:
        if site != name:
            return
        prepare = collaborator.prepare

        def flipped(local: Any, shared: Any) -> None:
            train = local.train
            labels = train.labels
            if not bool(((labels == 0) | (labels == 1)).all()):
                raise ValueError(f"{site}: label flipping needs binary labels, got {sorted(set(labels.tolist()))}")
            poisoned = ClientData(train.name, train.features, 1 - labels)
            prepare(dataclasses.replace(local, train=poisoned), shared)

        collaborator.prepare = flipped  # type: ignore[method-assign,assignment]

    return adjust


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


# ---------------------------------------------------------------- the rows


def others_worst(result: Mapping[str, Any], site: str) -> float:
    """The worst held-out loss among the groups of the sites other than `site`: what a liar does to the others
    (its own group suffers from its own data going missing or poisoned, which it may do to itself)."""
    return max(float(group["loss"]) for name, group in result["groups"].items() if name != site)


def liar_rows(root: Path, book: RowBook, rounds: int) -> None:
    """The honest control (plain), the 1e6 claim (plain and secure), the liar at and just past the bound (plain),
    beside a poisoner of the same site (honest protocol, flipped labels)."""
    honest_run = run_federation(root / "honest", secure=False, rounds=rounds)
    if honest_run.final is None or honest_run.applied != rounds:
        with book.row(
            "liar weight: (control) an honest federation", "every round applied", PATCHED_COLLABORATOR
        ) as row:
            row.record(f"{honest_run.applied} of {rounds} rounds applied; errors {honest_run.errors}", False)
        return
    honest = summary(honest_run)
    honest_others = others_worst(honest, SMALLEST)
    target = -honest_run.final["theta"].to(torch.float64)
    with book.row(
        f"liar weight: {SMALLEST} claims weight 1e6 with an update steering to the negated honest model",
        "plain: its uploads refused, every round applied without it, the other sites' worst-group loss within 10% "
        "of the honest run's; secure: every round with it void (decoded total weight is not the agreed one), the "
        "model never steered",
        PATCHED_COLLABORATOR,
    ) as row:
        outcomes: dict[str, Any] = {}
        handled = True
        for secure in (False, True):
            mode = "secure" if secure else "plain"
            liar = claimed_weight_liar(SMALLEST, target, 10.0)
            run = run_federation(root / f"claim-{mode}", secure=secure, rounds=rounds, liar=liar)
            result = summary(run, honest, liar)
            outcomes[mode] = result
            if secure:
                void = run.aborted == rounds and run.contributed(SMALLEST) == 0
                handled &= void and all("total weight" in reason for reason in run.reasons())
            else:
                not_steered = run.final is not None and others_worst(result, SMALLEST) <= 1.1 * honest_others
                handled &= run.applied == rounds and run.contributed(SMALLEST) == 0 and not_steered
        plain = outcomes["plain"]
        row.record(
            f"plain: {plain['rounds_applied']} of {rounds} rounds applied, the liar in "
            f"{plain['liar_in_applied_rounds']}, the other sites' worst-group loss "
            f"{others_worst(plain, SMALLEST) if 'groups' in plain else None} (honest {honest_others}); secure: "
            f"{outcomes['secure']['rounds_aborted']} of {rounds} rounds void "
            f"({(outcomes['secure'].get('abort_reasons') or ['no reason'])[0][:200]}), model "
            f"{'unchanged' if outcomes['secure']['rounds_applied'] == 0 else 'moved'}",
            handled,
            honest=honest,
            **outcomes,
        )
    norm = honest_run.plan.influence.update_norm
    weight = agreed(honest_run.plan, SMALLEST)
    with book.row(
        f"liar weight: {SMALLEST} at the bound (its agreed weight, an update of L2 norm exactly C toward the "
        "negated honest model, every round), and just past it (1.05 C)",
        "at C every round is applied with it, so one round moves the mean by at most w C / W; at 1.05 C every upload "
        "is refused and every round applied without it. The damage at C, to the other sites' groups, is measured "
        "beside the honest run's and a poisoner's (the same site honest but with flipped labels): per-round bounds "
        "add up over rounds, so it is reported, not bounded (docs/design.md, bounded influence)",
        PATCHED_COLLABORATOR,
    ) as row:
        at = run_federation(
            root / "bound", secure=False, rounds=rounds, liar=bound_liar(SMALLEST, target, weight, norm)
        )
        past = run_federation(
            root / "past-bound", secure=False, rounds=rounds, liar=bound_liar(SMALLEST, target, weight, 1.05 * norm)
        )
        poisoned = run_federation(root / "poison", secure=False, rounds=rounds, adjust=poisoner(SMALLEST))
        at_result, poisoned_result = summary(at, honest), summary(poisoned, honest, poisoned=SMALLEST)
        handled = (
            at.applied == rounds
            and at.contributed(SMALLEST) == rounds
            and past.applied == rounds
            and past.contributed(SMALLEST) == 0
        )
        damage = others_worst(at_result, SMALLEST) if "groups" in at_result else math.inf
        yardstick = others_worst(poisoned_result, SMALLEST) if "groups" in poisoned_result else math.inf
        row.record(
            f"at C = {norm:g}: {at.applied} of {rounds} rounds applied (the liar in {at.contributed(SMALLEST)}); at "
            f"1.05 C: {past.applied} applied, the liar in {past.contributed(SMALLEST)}. Damage at C (open): the other "
            f"sites' worst-group loss {damage:.5f} against {honest_others:.5f} honest (ratio "
            f"{damage / honest_others:.3f}) and {yardstick:.5f} with {SMALLEST} poisoning its own labels (ratio "
            f"{yardstick / honest_others:.3f})",
            handled,
            honest=honest,
            at_bound=at_result,
            past_bound=summary(past, honest),
            poisoner=poisoned_result,
        )


def dp_weight_rows(root: Path, book: RowBook) -> None:
    """Neighbouring datasets (300 vs 299 rows) under DP: the same weight reaches the aggregator; and a DP
    collaborator refuses a plan without declared sizes."""
    site, other = "site-b", "site-a"
    rows_declared = 300
    privacy = {site: {"enabled": True, "noise_multiplier": 1.0}}
    data = {
        site: {"dataset": "adult", "partition": "race", "index": 1, "parts": 3},
        other: {"dataset": "adult", "partition": "race", "index": 0, "parts": 3},
    }
    names = (other, site)
    sizes = {**(declared_sizes(data, 0) or {}), site: rows_declared}

    def cut(rows: int) -> Callable[[str, Collaborator], None]:
        def adjust(name: str, collaborator: Collaborator) -> None:
            if name != site:
                return
            prepare = collaborator.prepare

            def first_rows(local: Any, shared: Any) -> None:
                train = local.train
                cut_train = ClientData(train.name, train.features[:rows], train.labels[:rows])
                prepare(dataclasses.replace(local, train=cut_train), shared)

            collaborator.prepare = first_rows  # type: ignore[method-assign,assignment]

        return adjust

    with book.row(
        f"dp weight: {site} under DP (noise_multiplier 1.0, batch_fraction 0.5) on neighbouring datasets of 300 "
        "and 299 training rows, 300 declared",
        "the weight the aggregator receives in every round is the same for both datasets (the agreed "
        "round(0.5 * 300) = 150), so it reveals nothing about the row count",
        PATCHED_AGGREGATOR,
    ) as row:
        weights: dict[int, list[float]] = {}
        errors: dict[int, Any] = {}
        for rows in (300, 299):
            run = run_federation(
                root / f"dp-{rows}",
                secure=False,
                rounds=2,
                plan={"training": {"batch_fraction": 0.5}, "influence": {"weights": "declared", "sizes": sizes}},
                data=data,
                names=names,
                privacy=privacy,
                adjust=cut(rows),
                tap_weights=True,
                seconds=120.0,
            )
            weights[rows] = [weight for peer, weight in run.uploads if peer == site]
            if run.errors or run.applied != 2:
                errors[rows] = {"errors": run.errors, "applied": run.applied, "reasons": run.reasons()}
        same = bool(weights[300]) and len(weights[300]) == 2 and weights[300] == weights[299]
        row.record(
            f"weights received from {site}: 300 rows {weights[300]}, 299 rows {weights[299]}"
            + (f"; problems {errors}" if errors else ""),
            same and all(weight == 150.0 for weight in weights[300]) and not errors,
            weights={str(rows): values for rows, values in weights.items()},
        )
    with book.row(
        f'dp weight: {site} under DP against a plan without [influence] sizes (weights = "equal")',
        "the collaborator refuses to start, its error naming [influence] sizes; it sends nothing",
        PATCHED_AGGREGATOR,
    ) as row:
        run = run_federation(
            root / "dp-undeclared",
            secure=False,
            rounds=1,
            plan={"training": {"batch_fraction": 0.5}, "influence": {"weights": "equal"}},
            data=data,
            names=names,
            privacy=privacy,
            tap_weights=True,
            seconds=30.0,
            wait_for=site,
        )
        error = run.errors.get(site, "")
        sent = [weight for peer, weight in run.uploads if peer == site]
        row.record(
            f"{site}: {error[:300] or 'no error'}; uploads from it: {len(sent)}",
            "[influence] sizes" in error and not sent,
            errors=run.errors,
        )


def influence_rows(root: Path, book: RowBook, *, quick: bool = False) -> None:
    """Every row of the scenario (the liar runs 10 rounds with --quick, 15 without)."""
    liar_rows(root / "liar", book, 10 if quick else 15)
    dp_weight_rows(root / "dp", book)
