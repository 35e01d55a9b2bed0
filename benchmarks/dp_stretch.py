"""FedSRCVaR under distributed DP at epsilon 1, against the baselines of docs/paper.md (issues 53 and 64).

One study at rho 0.1: `--profile figure1` (the superseded multiples grid, its choice `CHOSEN`) or `--profile tuned`
(the tuning protocol, its choice read from docs/figures/tuned_<dataset>/tuning.csv). Its runs' flags are the
study's (`Study.test_runs`, `Study.validation_run`): "non-private" (the choice's test runs, one a seed), "non-private,
one local step" (distributed DP sums one clipped step a round), "distributed" (that plus `dp_flags`, `--repeats`
times a seed: the noise and Poisson samples come from the OS's CSPRNG, never the seed) and, with `--select R`,
"distributed, chosen under DP" (chosen again on the validation rows by the study's own rule, each point's value
the mean of R DP runs: `choose_on_grid`, or under the protocol `search_under_dp`).
Rows: the flags, seed, held-out risks, epsilon spent, delta, noise and seconds; `summary`: each kind's mean and
population std over its runs and each seed's mean.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dp_baselines import HELD_LIMIT, NESTED_BASELINES, OWN_SEARCH_BASELINES, PLAIN_SERVER_STEP, baseline_search
from dp_draws import Draws
from published import publish
from fedfair.core.errors import ConfigError
from fedfair.research import tuning
from fedfair.research.experiment import load_federation, simulate
from fedfair.research.flags import config_from_flags
from fedfair.research.paper_splits import PaperSplit, paper_split
from fedfair.research.profiles import PROFILES, TABLE_RHO
from fedfair.research.study import METHOD_LABELS, Point, Study, ladder_point
from fedfair.research.runs import Run, execute

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"
ONE_STEP_LIMIT = "local steps held at 1: distributed DP sums one clipped local step a round"
"""The limit the search under DP states beside the edge rule's: it does not search the local-step ladder."""

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


DRAWS = Draws()
"""Every run's draws this study has trained or read back (`--draws`: kept in a file, so an interrupted study
resumes)."""


def dp_flags(study: str) -> tuple[str, ...]:
    """Distributed DP at epsilon 1 and the study's delta; the clip bound and the colluders at `simulate`'s defaults."""
    delta = f"{DELTAS[study]:g}"
    return ("--secure-aggregation", "--dp-mode", "distributed", "--dp-target-epsilon", "1", "--dp-delta", delta)


def dataset_and_split(study: str) -> tuple[str, PaperSplit]:
    """The dataset `study` trains on and how it splits it into clients."""
    return SPLITS.get(study, (study, paper_split(study)))


def study_of(name: str, profile_name: str = "figure1") -> Study:
    """The study `name` as `fedfair reproduce --profile PROFILE_NAME` builds it, FedSRCVaR's runs and those of the
    baselines trained under DP with their own search (`OWN_SEARCH_BASELINES`)."""
    dataset, split = dataset_and_split(name)
    profile = PROFILES[profile_name]
    profile = profile if split.model is None else dataclasses.replace(profile, model=split.model)
    return Study(dataset, profile, ("fedsrcvar", *OWN_SEARCH_BASELINES), split=split)


def tuned_table(name: str) -> Path:
    """The folder of the tuned study of `name` (`fedfair reproduce --profile tuned`'s tables, committed):
    docs/figures/tuned_<name> (its rho 0.1 study), else tuned_<name>_all_rho (the four rhos, rho 0.1 among them);
    Census-Income's folders say census, as docs/figures' other Census-Income folders do."""
    base = FIGURES / f"tuned_{name.replace('census-income', 'census').replace('-', '_')}"
    for folder in (base, base.with_name(base.name + "_all_rho")):
        if (folder / "tuning.csv").is_file():
            return folder
    raise ConfigError(
        f"no tuned study of {name} at {base} or {base.name}_all_rho: run fedfair reproduce --profile tuned "
        f"--dataset {name} and commit its tables there, or use --profile figure1"
    )


def tuned_choice(name: str, study: Study) -> Point:
    """FedSRCVaR's point the tuned study of `name` chose at rho 0.1: the row of its tuning.csv marked chosen."""
    axes = study.search("fedsrcvar").axes
    with open(tuned_table(name) / "tuning.csv", newline="") as handle:
        rows = [
            row
            for row in csv.DictReader(handle)
            if row["method"] == METHOD_LABELS["fedsrcvar"]
            and float(row["rho"]) == TABLE_RHO
            and row["chosen"] == "True"
        ]
    named = " | ".join(axis.name for axis in axes)
    if len(rows) != 1 or rows[0]["axes"] != named:
        raise ConfigError(f"{name}'s tuning.csv needs one chosen FedSRCVaR row at rho 0.1 on the axes {named}")
    return ladder_point("fedsrcvar", axes, tuple(float(value) for value in rows[0]["coordinates"].split(" | ")))


def best_baseline(name: str) -> dict[str, Any]:
    """The tuned study's non-private baseline with the lowest held-out worst-decile risk at rho 0.1 (fig2_rho.csv,
    every method's row at every rho)."""
    with open(tuned_table(name) / "fig2_rho.csv", newline="") as handle:
        rows = [
            row
            for row in csv.DictReader(handle)
            if row["method"] != METHOD_LABELS["fedsrcvar"] and float(row["rho"]) == TABLE_RHO
        ]
    best = min(rows, key=lambda row: float(row["worst_risk_mean"]))
    return {
        "method": best["method"],
        "worst_risk_mean": float(best["worst_risk_mean"]),
        "worst_risk_std": float(best["worst_risk_std"]),
        "mean_risk_mean": float(best["mean_risk_mean"]),
        "chosen": best["chosen"],
    }


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


def held_out_rows(
    study: Study, point: Point, kind: str, extra: Sequence[str], repeats: int, method: str = "fedsrcvar"
) -> list[dict[str, Any]]:
    """`method`'s test runs of `point` (the study's seeds) with `extra` flags, each `repeats` times."""
    rows = []
    for run in study.test_runs(method, TABLE_RHO, point):
        flags = (*run.flags, *extra)

        def train(flags: tuple[str, ...] = flags) -> dict[str, Any]:
            config = config_from_flags(flags)
            row = described(flags, kind, simulate(config, load_federation(config), progress=False))
            gc.collect()
            return row

        rows += [{**row, "kind": kind} for row in DRAWS.take("test", flags, repeats, train)]
    return rows


def dp_validation(name: str, study: Study, point: Point, repeats: int, method: str = "fedsrcvar") -> dict[str, Any]:
    """`method`'s validation run of `point` (the study's flags) under DP, `repeats` times: its flags and
    worst-decile risks."""
    flags = (*study.validation_run(method, TABLE_RHO, point).flags, *dp_flags(name))
    draws = DRAWS.take(
        "validation", flags, repeats, lambda: {"worst_risk": execute(Run(flags, "validation"))["worst_risk"]}
    )
    risks = [draw["worst_risk"] for draw in draws]
    print(f"dp_stretch: validation {point.describe(method)}: {np.mean(risks):.4f}", file=sys.stderr)
    return {"point": point.describe(method), "flags": list(flags), "worst_risks": risks}


def choose_on_grid(name: str, study: Study, repeats: int) -> tuple[Point, dict[str, Any]]:
    """The one-local-step point of FedSRCVaR's fixed grid with the lowest mean validation risk under DP."""
    grid = [point for point in study.grid("fedsrcvar", TABLE_RHO) if point.local_steps == 1]
    rows = [dp_validation(name, study, point, repeats) for point in grid]
    best = min(range(len(rows)), key=lambda index: float(np.mean(rows[index]["worst_risks"])))
    return grid[best], {"validation": rows}


def search_under_dp(name: str, study: Study, repeats: int) -> tuple[Point, dict[str, Any]]:
    """The tuning protocol's choice under DP: FedSRCVaR's `tuning.Search` over its axes but the local steps
    (held at 1), the edge rule and the same extension budget, each point's value its mean validation risk
    over `repeats` DP runs (a diverged run makes the mean NaN: diverged)."""
    axes = tuple(axis for axis in study.search("fedsrcvar").axes if axis is not tuning.LOCAL_STEPS)
    search = tuning.Search(axes, tuning.EXTENSION_RUNS)
    found: dict[tuning.Coordinates, dict[str, Any]] = {}

    def evaluate(asked: list[tuple[int, tuning.Coordinates]]) -> list[float]:
        for _, coordinates in asked:
            found[coordinates] = dp_validation(name, study, ladder_point("fedsrcvar", axes, coordinates), repeats)
        return [float(np.mean(found[coordinates]["worst_risks"])) for _, coordinates in asked]

    tuning.settle([search], evaluate)
    choice = search.choice()
    rows = [
        {
            **found[coordinates],
            "coordinates": list(coordinates),
            "round": search.round_of[coordinates],
            "worst_risk": risk,
            "chosen": coordinates == choice,
        }
        for coordinates, risk in search.tried.items()
    ]
    return ladder_point("fedsrcvar", axes, choice), {
        "search": {
            "axes": [axis.name for axis in axes],
            "ladders": {axis.name: axis.describe() for axis in axes},
            "repeats": repeats,
            "extension_runs": search.extension_runs,
            "budget": search.budget,
            "settled": search.settled,
            "limits": [*search.limits(), ONE_STEP_LIMIT],
        },
        "validation": rows,
    }


def baseline_under_dp(
    name: str,
    study: Study,
    repeats: int,
    baseline: str,
    extension_runs: int = tuning.EXTENSION_RUNS,
    held: Mapping[str, float] | None = None,
) -> tuple[Point, dict[str, Any]]:
    """`baseline`'s choice under the same distributed DP by the protocol: the search of `search_under_dp` over the
    axes `baseline_search` leaves free (FedAvg's step, FedAvgM's momentum too, TERM's step, momentum and tilt).

    `extension_runs` below the protocol's cuts the search where the machine cannot afford it, and so do the axes
    `held` at a value: the document states both (`fixed`, `limits`), and the search's limits say so where it ran
    out before it settled."""
    plan = baseline_search(study, baseline, held)
    free, fixed, point_of = plan.free, plan.fixed, plan.point_of
    search = tuning.Search(free, extension_runs)
    found: dict[tuning.Coordinates, dict[str, Any]] = {}

    def evaluate(asked: list[tuple[int, tuning.Coordinates]]) -> list[float]:
        for _, coordinates in asked:
            found[coordinates] = dp_validation(name, study, point_of(coordinates), repeats, plan.method)
        return [float(np.mean(found[coordinates]["worst_risks"])) for _, coordinates in asked]

    tuning.settle([search], evaluate)
    choice = search.choice()
    rows = [
        {**found[point], "coordinates": list(point), "worst_risk": risk, "chosen": point == choice}
        for point, risk in search.tried.items()
    ]
    limits = [
        *search.limits(),
        ONE_STEP_LIMIT,
        *(HELD_LIMIT.format(axis, value) for axis, value in (held or {}).items()),
    ]
    return point_of(choice), {
        "search": {
            "axes": [axis.name for axis in free],
            "fixed": fixed,
            "repeats": repeats,
            "extension_runs": search.extension_runs,
            "budget": search.budget,
            "settled": search.settled,
            "limits": limits,
        },
        "validation": rows,
    }


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
    parser.add_argument(
        "--profile",
        choices=("figure1", "tuned"),
        default="figure1",
        help="the study's tuning: figure1's multiples grid (CHOSEN) or the tuning protocol (docs/figures/tuned_*)",
    )
    parser.add_argument("--repeats", type=int, default=10, help="runs of each DP test seed (default 10)")
    parser.add_argument("--select", type=int, default=0, metavar="R", help="also choose under DP, R runs a point")
    parser.add_argument(
        "--as",
        dest="baseline",
        choices=sorted((*NESTED_BASELINES, *OWN_SEARCH_BASELINES)),
        help="train this baseline under the same DP instead (as FedSRCVaR's limit case, or TERM by its own DP "
        "mechanism), chosen under DP by --select R",
    )
    parser.add_argument(
        "--extension-runs",
        type=int,
        default=tuning.EXTENSION_RUNS,
        metavar="N",
        help=f"with --as: the baseline search's extension runs (default the protocol's {tuning.EXTENSION_RUNS}); "
        "fewer cuts the search, stated in the JSON",
    )
    parser.add_argument(
        "--plain-server-step",
        action="store_true",
        help="with --as: hold the baseline's server momentum at 0 (its paper's step), a cut stated in the JSON",
    )
    parser.add_argument(
        "--hold-step",
        type=float,
        metavar="S",
        help="with --as: hold the baseline's step at S (a rung of the step ladder), a cut stated in the JSON",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--draws", type=Path, help="keep every run's draw in this JSON-lines file as it finishes, and resume from it"
    )
    args = parser.parse_args()
    if args.draws:
        DRAWS.open(args.draws)
    torch.set_num_threads(1)
    started = time.perf_counter()
    study = study_of(args.dataset, args.profile)
    tuned = study.profile.ladders
    point = tuned_choice(args.dataset, study) if tuned else CHOSEN[args.dataset]
    document: dict[str, Any] = {"dataset": args.dataset, "split": study.split.describe(), "rho": TABLE_RHO}
    if tuned:
        table = tuned_table(args.dataset).relative_to(FIGURES.parents[1])
        document |= {"profile": args.profile, "table": str(table), "baseline": best_baseline(args.dataset)}
    if args.baseline:
        if not (tuned and args.select):
            raise ConfigError("--as chooses the baseline under DP on the protocol: give --profile tuned and --select R")
        held = {
            **(PLAIN_SERVER_STEP if args.plain_server_step else {}),
            **({} if args.hold_step is None else {tuning.STEP.name: args.hold_step}),
        }
        if args.hold_step is not None and args.hold_step not in tuning.STEP.ladder:
            raise ConfigError(f"--hold-step {args.hold_step:g} is not on the step ladder {tuning.STEP.ladder}")
        chosen, how = baseline_under_dp(args.dataset, study, args.select, args.baseline, args.extension_runs, held)
        kind = f"distributed, {METHOD_LABELS[args.baseline]} chosen under DP"
        method = baseline_search(study, args.baseline).method
        rows = held_out_rows(study, chosen, kind, dp_flags(args.dataset), args.repeats, method)
        document |= {"method": args.baseline, "chosen_under_dp": chosen.describe(method), **how}
        document |= {"summary": summary(rows), "rows": rows, "seconds": time.perf_counter() - started}
        publish(document, args.json)
        return
    rows = held_out_rows(study, point, "non-private", (), 1)
    document["non_private_point"] = point.describe()
    if point.local_steps != 1:
        point = dataclasses.replace(point, local_steps=1)
        rows += held_out_rows(study, point, "non-private, one local step", (), 1)
    rows += held_out_rows(study, point, "distributed", dp_flags(args.dataset), args.repeats)
    document["point"] = point.describe()
    if args.select:
        choose = search_under_dp if tuned else choose_on_grid
        chosen, how = choose(args.dataset, study, args.select)
        document |= {"chosen_under_dp": chosen.describe(), **how}
        if chosen != point:
            rows += held_out_rows(study, chosen, "distributed, chosen under DP", dp_flags(args.dataset), args.repeats)
    document |= {"summary": summary(rows), "rows": rows, "seconds": time.perf_counter() - started}
    publish(document, args.json)


if __name__ == "__main__":
    main()
