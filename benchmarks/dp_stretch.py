"""FedSRCVaR under distributed DP at epsilon 1, in the protocol of docs/paper.md's baselines table (issue 53).

For one baselines study (`fedfair reproduce --profile figure1`: a dataset in its paper split, or in another split
`SPLITS` names, with the split's model, at rho = 0.1), every run a `fedfair simulate` run of the flags its row
records:

  - "non-private": FedSRCVaR's point the study chose on validation rows (`CHOSEN`, the table's "chosen on
    validation rows"), its test runs' flags as the study builds them (`Study.test_runs`), once per test seed:
    this tree's re-run of the table's figure;
  - "distributed": the same flags plus `dp_flags` (the secure sum, Skellam noise calibrated to epsilon 1 at the
    dataset's delta, `DELTAS`, theta clipped at 20 and c at its own bound, the default colluders), `--repeats`
    times per seed.
    The noise and the Poisson samples come from the OS's CSPRNG, never from the seed, so each run is one draw;
  - a point with several local steps runs at one local step first ("non-private, one local step"), as
    distributed DP sums one clipped step a round;
  - with `--select R`: the point chosen again under DP, on the validation rows as the study chooses (the
    lowest worst-decile risk), over the study's FedSRCVaR grid at one local step, each point's validation
    run `R` times under DP (its mean); then its test runs as "distributed" ("distributed, chosen under DP").

Rows: the flags, the seed, the held-out worst-decile and mean risk and accuracy, the epsilon every site's
accountant spent (the largest), delta, the noise std per coordinate of the decoded weighted sum and over one
record's move, the colluders and the seconds; `summary` gives each kind's mean and population standard
deviation over all its runs (as the paper's tables take them over seeds) and each seed's mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from published import publish
from fedfair.research.experiment import load_federation, simulate
from fedfair.research.flags import config_from_flags
from fedfair.research.paper_splits import PaperSplit, paper_split
from fedfair.research.profiles import PROFILES, TABLE_RHO
from fedfair.research.study import Point, Study
from fedfair.research.runs import Run, execute

SPLITS = {"census-income-51": ("census-income", paper_split("census-income", "previous_state", 51))}
"""The studies not in their dataset's paper split, by name: each one's dataset and split (`reproduce
--partition previous_state --clients 51`); any other study's name is its dataset's, in its paper split."""

CHOSEN = {
    "rand-hie": Point(0.05, 0.01, 1, momentum=0.0),
    "adult": Point(0.25, 0.01, 3, momentum=0.9),
    "census-income": Point(0.25, 0.01, 3, momentum=0.9),
    "census-income-51": Point(0.25, 0.01, 3, momentum=0.0),
    "mnist": Point(1, 0.01, 3, momentum=0.9),
}
"""Each study's FedSRCVaR point chosen on validation rows at rho = 0.1 (table_rho0.1.csv of
docs/figures/baselines_rand_hie_all_rho/, baselines_adult/, baselines_census/, baselines_census_51/ and
baselines_mnist/): RAND HIE step x0.05, epsilon 0.01, Algorithm 1's server step; Adult and Census-Income by
race step x0.25, MNIST by digit step x1, each with epsilon 0.01, 3 local steps and server momentum 0.9;
Census-Income in 51 sites step x0.25, epsilon 0.01, 3 local steps and Algorithm 1's server step."""

DELTAS = {"rand-hie": 1e-5, "adult": 1e-5, "census-income": 1e-6, "census-income-51": 1e-6, "mnist": 1e-5}
"""Each study's delta, below 1 / n for every site's n: 1e-5 where no site holds more than the whole training
set's 15,140 (RAND HIE), 32,561 (Adult) or 60,000 (MNIST) rows; 1e-6 on Census-Income by race, whose largest
site (167,365 rows) puts 1 / n at 6.0e-6, above which a delta would permit leaking a whole record, and in 51
sites, which split the same rows."""


def dp_flags(study: str) -> tuple[str, ...]:
    """Distributed DP at epsilon 1 and the study's delta; the clip bound and the colluders at `simulate`'s defaults."""
    delta = f"{DELTAS[study]:g}"
    return ("--secure-aggregation", "--dp-mode", "distributed", "--dp-target-epsilon", "1", "--dp-delta", delta)


def dataset_and_split(study: str) -> tuple[str, PaperSplit]:
    """The dataset `study` trains on and how it splits it into clients."""
    return SPLITS.get(study, (study, paper_split(study)))


def study_of(name: str) -> Study:
    """The baselines study `name` as `fedfair reproduce --profile figure1` builds it, FedSRCVaR's runs."""
    dataset, split = dataset_and_split(name)
    profile = PROFILES["figure1"]
    profile = profile if split.model is None else dataclasses.replace(profile, model=split.model)
    return Study(dataset, profile, ("fedsrcvar",), split=split)


def described(flags: Sequence[str], kind: str, result: dict[str, Any]) -> dict[str, Any]:
    """One run's row from its `fedfair simulate` result."""
    test = result["final"]["test"]
    noise = result.get("distributed_noise", {})
    sites = result["privacy"].values()
    row = {
        "kind": kind,
        "flags": list(flags),
        "seed": int(flags[list(flags).index("--seed") + 1]),
        "worst_risk": test["worst_risk"],
        "mean_risk": test["mean_risk"],
        "accuracy": test["accuracy"],
        "epsilon_spent": max((site["epsilon"] for site in sites), default=None),
        "delta": noise.get("delta"),
        "noise_std": noise.get("noise_std"),
        "noise_multiplier": noise.get("noise_multiplier"),
        "colluders": noise.get("colluders"),
        "sample_rate": noise.get("sample_rate"),
        "seconds": result["seconds"],
    }
    print(
        f"dp_stretch: {kind} seed {row['seed']}: worst {row['worst_risk']:.4f} mean {row['mean_risk']:.4f} "
        f"({row['seconds']:.0f} s)",
        file=sys.stderr,
    )
    return row


def held_out_rows(study: Study, point: Point, kind: str, extra: Sequence[str], repeats: int) -> list[dict[str, Any]]:
    """`point`'s test runs (the study's seeds) with `extra` flags, each `repeats` times."""
    rows = []
    for run in study.test_runs("fedsrcvar", TABLE_RHO, point):
        flags = (*run.flags, *extra)
        for _ in range(repeats):
            config = config_from_flags(flags)
            rows.append(described(flags, kind, simulate(config, load_federation(config), progress=False)))
            gc.collect()
    return rows


def select_under_dp(name: str, study: Study, repeats: int) -> tuple[Point, list[dict[str, Any]]]:
    """The one-local-step point of FedSRCVaR's grid with the lowest mean validation worst-decile risk under DP."""
    grid = study.grid("fedsrcvar", TABLE_RHO)
    runs = study.selection_runs("fedsrcvar", TABLE_RHO)
    rows = []
    for point, run in zip(grid, runs, strict=True):
        if point.local_steps != 1:
            continue
        flags = (*run.flags, *dp_flags(name))
        risks = [execute(Run(flags, "validation"))["worst_risk"] for _ in range(repeats)]
        rows.append({"point": point.describe(), "flags": list(flags), "worst_risks": risks})
        print(f"dp_stretch: validation {point.describe()}: {np.mean(risks):.4f}", file=sys.stderr)
    best = min(range(len(rows)), key=lambda index: float(np.mean(rows[index]["worst_risks"])))
    chosen = next(point for point in grid if point.describe() == rows[best]["point"])
    return chosen, rows


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each kind's runs: mean and population standard deviation of each risk, and each seed's mean."""
    out: dict[str, dict[str, Any]] = {}
    for kind in dict.fromkeys(row["kind"] for row in rows):
        mine = [row for row in rows if row["kind"] == kind]
        worst = np.array([row["worst_risk"] for row in mine])
        spent = [row["epsilon_spent"] for row in mine if row["epsilon_spent"] is not None]
        out[kind] = {
            "runs": len(mine),
            "worst_risk_mean": float(worst.mean()),
            "worst_risk_std": float(worst.std()),
            "worst_risk_min": float(worst.min()),
            "worst_risk_max": float(worst.max()),
            "mean_risk_mean": float(np.mean([row["mean_risk"] for row in mine])),
            "per_seed_worst_risk": {
                str(seed): float(np.mean([row["worst_risk"] for row in mine if row["seed"] == seed]))
                for seed in dict.fromkeys(row["seed"] for row in mine)
            },
            "epsilon_spent_max": max(spent) if spent else None,
            "noise_std": mine[0]["noise_std"],
            "noise_multiplier": mine[0]["noise_multiplier"],
            "seconds_mean": float(np.mean([row["seconds"] for row in mine])),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--dataset",
        choices=sorted(CHOSEN),
        default="rand-hie",
        help="the study: a dataset in its paper split, or a name in SPLITS",
    )
    parser.add_argument("--repeats", type=int, default=10, help="runs of each DP test seed (default 10)")
    parser.add_argument("--select", type=int, default=0, metavar="R", help="also choose under DP, R runs a point")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    study = study_of(args.dataset)
    point = CHOSEN[args.dataset]
    rows = held_out_rows(study, point, "non-private", (), 1)
    if point.local_steps != 1:
        point = dataclasses.replace(point, local_steps=1)
        rows += held_out_rows(study, point, "non-private, one local step", (), 1)
    rows += held_out_rows(study, point, "distributed", dp_flags(args.dataset), args.repeats)
    document: dict[str, Any] = {
        "dataset": args.dataset,
        "split": study.split.describe(),
        "rho": TABLE_RHO,
        "point": point.describe(),
    }
    if args.select:
        chosen, validation = select_under_dp(args.dataset, study, args.select)
        document |= {"chosen_under_dp": chosen.describe(), "validation": validation}
        if chosen != point:
            rows += held_out_rows(study, chosen, "distributed, chosen under DP", dp_flags(args.dataset), args.repeats)
    document |= {"summary": summary(rows), "rows": rows, "seconds": time.perf_counter() - started}
    publish(document, args.json)


if __name__ == "__main__":
    main()
