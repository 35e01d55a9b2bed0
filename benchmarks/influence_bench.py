"""How much one lying institution can damage the model, with the plan's [influence] in force.

The federation is make_workspace's default: Adult split by race into three sites (site-a
White, the largest; site-b Black; site-c Other, the smallest), weights declared from the
true partition sizes (``[influence] weights = "declared"``, w_k = round(0.01 n_k)), C =
``update_norm`` = 2.0, FedSRCVaR with aggregator/plan.toml's settings (epsilon 0.1, rho
0.3, local_steps 5, batch_fraction 0.01, lr 0.1), 40 rounds. Each run is a live loopback
federation: fedfair's aggregator in a thread and real Collaborator objects in threads (as
benchmarks/attacks/*.py run them); the liar is one Collaborator whose ``train_on`` is
replaced on that instance, so it skips ``core.local.bounded`` and sends its own vector and
weight, steering toward the negation of the honest run's final model (which flips every
prediction):

- honest: plain and secure aggregation;
- claim: the liar claims weight 1e6 with an update inside the encoding's per-coordinate
  clip (what the checks before [influence] allowed): plain, its uploads are refused;
  secure, the rounds are void (the decoded total is not the agreed one);
- bound: the agreed weight and an update of L2 norm exactly C toward the target, every
  round (plain and secure), for the smallest site and, for comparison, the largest;
- mean bound (secure only): per-site norms cannot be checked under secure aggregation, so the
  liar sends a weighted vector of norm 0.9 W C (and, a second run, 0.75 W C) toward the
  target (W the agreed total), its update inside the per-coordinate clip; the round is void
  only when the decoded mean is longer than C;
- poison (the yardstick): the smallest site is no liar at all, an honest protocol participant
  (bounded() and its agreed weight included) whose training labels are flipped (y -> 1 - y),
  which no protocol can detect; a liar at the bound that does no more damage gains nothing
  beyond its declared data share.

Each run reports the rounds applied and aborted, the final averaged model's (theta_average)
worst-group loss (the largest mean log-loss over the three sites' held-out rows), each
site's loss and accuracy, the pooled rho-worst risk (CVaR at rho over the pooled held-out
losses), the ratio of both to the honest run's (plain runs to honest plain, secure to
honest secure), and the honest sites' update norms, which say how much of the C ball honest
training uses (as sent, and ``raw_update_norms`` before bounded() scales them into the C ball).
``--update-norm C`` runs everything with another C (the honest runs too). ``--sweep C1 C2 ...``
runs, for each C, only the honest runs, the liar at the bound and the poisoner (plain and
secure; ``--plain-only`` skips secure), and reports per C a comparison of the two against
the honest run and the honest run's worst-group loss relative to C = 2's.

Output: JSON on stdout and, with ``--json PATH``, in that file.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from published import publish
from attacks.influence_federation import LARGEST, SMALLEST, agreed, agreed_total, run_federation, summary
from attacks.liars import bound_liar, claimed_weight_liar, mean_bound_liar, poisoner


def influence_settings(plan: Any) -> dict[str, Any]:
    """The plan's [influence] as the JSON reports it (agreed weights and the largest per-round mean shift)."""
    norm, total = plan.influence.update_norm, agreed_total(plan)
    return {
        "weights": plan.influence.weights,
        "sizes": dict(plan.influence.sizes),
        "agreed_weights": {name: agreed(plan, name) for name in plan.collaborators},
        "agreed_total": total,
        "update_norm": norm,
        "largest_mean_shift_per_round": {
            name: round(agreed(plan, name) * norm / total, 4) for name in plan.collaborators
        },
    }


def bench(
    root: Path, rounds: int, extra: dict[str, dict[str, Any]], *, sweep: bool, secure_modes: tuple[bool, ...]
) -> tuple[Any, dict[str, Any]]:
    """Every run at one C (`extra`'s [influence], or the plan's default): the honest runs, then the liars and the
    poisoner against the honest run of the same mode. With `sweep`, only the liar at the bound and the poisoner,
    both as the smallest site."""
    results: dict[str, Any] = {}
    runs: dict[str, Any] = {}

    def run(
        label: str, secure: bool, liar: Any = None, honest: dict[str, Any] | None = None, poisoned: str | None = None
    ) -> dict[str, Any]:
        print(f"influence bench: {root.name}/{label} ...", file=sys.stderr, flush=True)
        outcome = run_federation(
            root / label,
            secure=secure,
            rounds=rounds,
            liar=liar,
            plan=extra,
            adjust=poisoner(poisoned) if poisoned is not None else None,
        )
        results[label] = summary(outcome, honest, liar, poisoned)
        results[label]["secure"] = secure
        runs[label] = outcome
        document: dict[str, Any] = results[label]
        return document

    baseline: dict[bool, dict[str, Any]] = {}
    for secure in secure_modes:
        baseline[secure] = run(f"honest-{'secure' if secure else 'plain'}", secure)
    reference = runs["honest-plain"] if "honest-plain" in runs else next(iter(runs.values()))
    plan = reference.plan
    target = -reference.final["theta"].to(torch.float64)
    norm, total = plan.influence.update_norm, agreed_total(plan)
    clip = plan.secure_aggregation.clip
    for secure in secure_modes:
        mode = "secure" if secure else "plain"
        cases: dict[str, Any] = {f"bound-{SMALLEST}-{mode}": bound_liar(SMALLEST, target, agreed(plan, SMALLEST), norm)}
        if not sweep:
            cases = {
                f"claim-1e6-{SMALLEST}-{mode}": claimed_weight_liar(SMALLEST, target, clip),
                **cases,
                f"bound-{LARGEST}-{mode}": bound_liar(LARGEST, target, agreed(plan, LARGEST), norm),
            }
            if secure:
                for fraction in (0.9, 0.75):
                    cases[f"mean-bound-{fraction:g}-{SMALLEST}-secure"] = mean_bound_liar(
                        SMALLEST, target, agreed(plan, SMALLEST), total, norm, clip, fraction
                    )
        for label, liar in cases.items():
            run(label, secure, liar, baseline[secure])
        run(f"poison-{SMALLEST}-{mode}", secure, None, baseline[secure], poisoned=SMALLEST)
    return plan, results


def comparison(results: dict[str, Any], mode: str) -> dict[str, Any]:
    """The liar at the bound against the poisoner (both the smallest site) in one mode: worst-group losses and
    ratios to the honest run; `liar_over_poisoner` > 1 is damage beyond what flipped labels do."""
    honest = results.get(f"honest-{mode}", {})
    liar = results.get(f"bound-{SMALLEST}-{mode}", {})
    poison = results.get(f"poison-{SMALLEST}-{mode}", {})
    if not honest or not liar or not poison or "worst_group_loss" not in liar or "worst_group_loss" not in poison:
        return {}
    return {
        "honest_worst_group_loss": honest.get("worst_group_loss"),
        "bound_liar_worst_group_loss": liar["worst_group_loss"],
        "poisoner_worst_group_loss": poison["worst_group_loss"],
        "bound_liar_ratio": liar.get("worst_loss_ratio"),
        "poisoner_ratio": poison.get("worst_loss_ratio"),
        "liar_over_poisoner": round(liar["worst_group_loss"] / poison["worst_group_loss"], 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument(
        "--update-norm", type=float, default=None, help="[influence] update_norm (default: the plan's, 2.0)"
    )
    parser.add_argument(
        "--sweep",
        type=float,
        nargs="+",
        metavar="C",
        help="instead: for each C, the honest runs, the liar at the bound and the poisoner (the smallest site)",
    )
    parser.add_argument("--plain-only", action="store_true", help="skip the secure-aggregation runs")
    args = parser.parse_args(argv)
    logging.getLogger("fedfair").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    started = time.perf_counter()
    rounds = args.rounds
    secure_modes = (False,) if args.plain_only else (False, True)
    norms = args.sweep if args.sweep else ([args.update_norm] if args.update_norm is not None else [None])
    per_norm: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="fedfair-influence-") as folder:
        root = Path(folder)
        sizes: dict[str, Any] | None = None
        if any(norm is not None for norm in norms):
            # [influence] given: make_workspace writes no sizes of its own, so they are copied from a default plan.
            probe = run_federation(root / "probe", secure=False, rounds=1)
            sizes = dict(probe.plan.influence.sizes)
        for norm in norms:
            extra: dict[str, dict[str, Any]] = {}
            if norm is not None:
                extra = {"influence": {"weights": "declared", "sizes": sizes, "update_norm": norm}}
            name = f"C={norm:g}" if norm is not None else "default"
            plan, results = bench(root / name, rounds, extra, sweep=bool(args.sweep), secure_modes=secure_modes)
            per_norm[name] = {"plan": plan, "runs": results}
    first = next(iter(per_norm.values()))
    plan = first["plan"]
    settings: dict[str, Any] = {
        "data": "Adult split by race into 3 sites (make_workspace's default)",
        "objective": "FedSRCVaR epsilon 0.1, rho 0.3",
        "rounds": rounds,
        "local_steps": plan.training.local.local_steps,
        "batch_fraction": plan.batch_fraction,
        "lr": plan.training.local.lr,
        "target": "the negation of the honest plain run's final theta (of the same C)",
        "poisoner": f"{SMALLEST} runs the honest collaborator (bounded(), agreed weight) on training labels flipped "
        "y -> 1 - y; its held-out rows keep their true labels",
    }
    document: dict[str, Any] = {
        "benchmark": "influence_bench",
        "settings": settings,
    }
    if not args.sweep:
        settings["influence"] = influence_settings(plan)
        document["runs"] = first["runs"]
    else:
        modes = ["secure" if secure else "plain" for secure in secure_modes]
        sweep: dict[str, Any] = {}
        reference = per_norm.get("C=2", {}).get("runs", {})
        for name, entry in per_norm.items():
            results = entry["runs"]
            item: dict[str, Any] = {
                "influence": influence_settings(entry["plan"]),
                "comparison": {mode: comparison(results, mode) for mode in modes},
            }
            honest, base = results.get("honest-plain", {}), reference.get("honest-plain", {})
            if "worst_group_loss" in honest and "worst_group_loss" in base:
                item["honest_worst_loss_vs_C2"] = round(honest["worst_group_loss"] / base["worst_group_loss"], 4)
                item["honest_worst_rho_risk_vs_C2"] = round(honest["worst_rho_risk"] / base["worst_rho_risk"], 4)
            item["runs"] = results
            sweep[name] = item
        document["sweep"] = sweep
    document["seconds"] = round(time.perf_counter() - started, 1)
    publish(document, args.json, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
