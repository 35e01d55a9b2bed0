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
- poisoner (the yardstick, no row of its own): :func:`~attacks.liars.poisoner` makes one site an honest protocol
  participant (bounded() and its agreed weight included) whose training labels are flipped; no protocol can detect
  it.
- dp weight: a DP collaborator (noise_multiplier 1.0, batch_fraction 0.5) on neighbouring
  datasets of 300 and 299 training rows with 300 declared: the weight the aggregator
  receives (the plain upload's last value, read by a hook on the aggregator's upload
  screen) must be the same; and without declared sizes the DP collaborator refuses to start,
  naming ``[influence] sizes``.

The federation and the model's quality are :mod:`attacks.influence_federation`'s, the liars :mod:`attacks.liars`'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from attacks.liars import claimed_weight_liar, bound_liar, poisoner
from attacks.own_ledgers import own_ledgers
from attacks.influence_federation import SMALLEST, run_federation, summary, agreed
from attacks.rows import PATCHED_AGGREGATOR, PATCHED_COLLABORATOR, RowBook
from fedfair.core.data import ClientData
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.local.workspace import declared_sizes


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
            # The two datasets are two worlds, not one site's two runs: each starts from an unspent budget, as the
            # same federation id over the same people would otherwise (rightly) read as a lost input record.
            with own_ledgers(root / f"dp-{rows}-ledgers"):
                run = run_federation(
                    root / f"dp-{rows}",
                    secure=False,
                    rounds=2,
                    plan={
                        "training": {"batch_fraction": 0.5},
                        "influence": {"weights": "declared", "sizes": sizes},
                        # The row is about the weight, not the budget: sigma 1 at q = 0.5 spends past the plan's
                        # default budget (10) in round 2, which now binds local DP-SGD too and would stop site-b.
                        "privacy": {"budget": 1000.0},
                    },
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
