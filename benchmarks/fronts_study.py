"""Fronts against fronts: each method's front over its own knob, every point stopped by validation, tested (issue 96).

For each method with a trade-off knob (FedSRCVaR's epsilon, TERM's tilt, PropFair's ceiling, Delta-FL's level:
`stopped.MAIN_KNOB`), the knob's ladder values within --span rungs of the committed stopped choice
(FOLDER/stopped_choice.csv), each held while its step is re-chosen and its round stopped by validation exactly as
the stopped study does (`stopped.choose`, --step-runs, the knob not searched), then tested on --seeds seeds (0, 1
and, from 2 on, seeds nobody tuned on). FedAvg and FedAvgM are their stopped points. Writes into FOLDER:
fronts_stopped.csv (a row per method, knob value and seed: its stop and held-out figures) and
fronts_dominance.csv (`fronts.dominance_rows`: each front's worst-rho risk at FedAvg's held-out mean risk, seed by
seed, and its gap to FedSRCVaR's, paired over the seeds). Runs are cached under --cache (resumable); the cost is
each run's `cpu_seconds` there. E.g.

    python benchmarks/fronts_study.py --dataset adult --folder docs/figures/tuned_adult_all_rho \\
        --cache /tmp/stopped_adult --workers 16 --seeds 5 --span 2 --ceilings 1000,2000,4000
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from fedfair.research import fronts, stopped, stopping
from fedfair.research.paper_splits import paper_split
from fedfair.research.profiles import PROFILES, TABLE_RHO
from fedfair.research.reproduce import read_csv, write_csv
from fedfair.research.study import METHOD_LABELS, Point, Study

METHODS = ("fedsrcvar", "fedavg", "fedavgm", "propfair", "term", "deltafl")
POINTS_ONLY = ("fedavg", "fedavgm")
"""The methods drawn as their stopped point alone: their own knob (local steps, momentum) trades nothing off."""


def knob_points(method: str, point: Point, span: int) -> list[Point]:
    """`point` at each value of `method`'s knob ladder within `span` rungs of its own (itself alone for a point)."""
    if method in POINTS_ONLY:
        return [point]
    axis = stopped.MAIN_KNOB[method]
    at = axis.ladder.index(stopped.knob_value(point, axis))
    values = axis.ladder[max(at - span, 0) : at + span + 1]
    return [stopped.with_knob(point, axis, value) for value in values]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="e.g. adult, census-income, mnist")
    parser.add_argument("--folder", type=Path, required=True, help="the stopped study's folder")
    parser.add_argument("--cache", type=Path, required=True, help="where the runs are cached")
    parser.add_argument("--rho", type=float, default=TABLE_RHO)
    parser.add_argument("--seeds", type=int, default=5, help="test seeds, 0 to N - 1 (default 5: 2, 3, 4 untuned)")
    parser.add_argument("--span", type=int, default=2, help="knob rungs each side of the stopped choice (default 2)")
    parser.add_argument("--step-runs", type=int, default=2, help="steps tried past each knob value's start")
    parser.add_argument("--loss-rows", type=int, default=0, help="as the study's --loss-rows (TERM's losses)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--ceilings", default=",".join(str(rounds) for rounds in stopping.CEILINGS))
    args = parser.parse_args()
    profile = dataclasses.replace(PROFILES["tuned"], seeds=args.seeds)
    study = Study(args.dataset, profile, METHODS, loss_rows=args.loss_rows, split=paper_split(args.dataset))
    stops = stopped.committed_stops(
        read_csv(args.folder / "stopped_choice.csv"), read_csv(args.folder / "tuning.csv"), study, args.rho
    )
    ceilings = tuple(int(rounds) for rounds in args.ceilings.split(","))
    rows = []
    for method, (point, _, _) in stops.items():
        for held in knob_points(method, point, args.span):
            chosen = stopped.choose(study, args.rho, {method: held}, args.cache, args.workers, args.step_runs, ceilings)
            tested, _, _ = stopped.stopped_rows(study, args.rho, chosen, args.cache, args.workers)
            value = (
                held.describe(method) if method in POINTS_ONLY else stopped.knob_value(held, stopped.MAIN_KNOB[method])
            )
            rows += [{"knob": value, "chosen": chosen[method].point.describe(method)} | row for row in tested]
    write_csv(args.folder / "fronts_stopped.csv", rows)
    write_csv(
        args.folder / "fronts_dominance.csv",
        fronts.dominance_rows(rows, METHOD_LABELS["fedsrcvar"], METHOD_LABELS["fedavg"]),
    )


if __name__ == "__main__":
    main()
