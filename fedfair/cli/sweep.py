"""``fedfair sweep``: an epsilon x rho grid of experiments to CSV (:mod:`fedfair.research.sweep`).

The flags come from :mod:`fedfair.research.arguments` (no PyTorch); the sweep is imported when the
command runs, so ``fedfair sweep --help`` answers at once.
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

from fedfair.core.errors import ConfigError
from fedfair.research.arguments import PAPER_EPSILONS, PAPER_RHOS, add_experiment_arguments


def _sweep_command(args: argparse.Namespace) -> int:
    from fedfair.research.experiment import load_federation
    from fedfair.research.flags import write_json
    from fedfair.research.sweep import grid_configs, parse_grid, sweep, sweep_json

    configs = grid_configs(args, parse_grid(args.epsilons, "epsilons"), parse_grid(args.rhos, "rhos"))
    if not configs:
        raise ConfigError("the grid is empty; give --epsilons and --rhos at least one value each, e.g. --rhos 0.3")
    rows = sweep(configs, load_federation(configs[0]), args.jobs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {args.out}")
    if args.json is not None:
        write_json(args.json, sweep_json(configs, rows))
        print(f"wrote the grid as JSON to {args.json}")
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair sweep`: the experiment flags plus the grid, the parallelism and the CSV path."""
    sweep_parser = subparsers.add_parser("sweep", help="run an epsilon x rho grid to CSV")
    add_experiment_arguments(sweep_parser)
    sweep_parser.add_argument(
        "--epsilons",
        default=",".join(map(str, PAPER_EPSILONS)),
        help="comma-separated trade-offs epsilon to run, e.g. 0.1,0.5,1 (default: the paper's 14 values)",
    )
    sweep_parser.add_argument(
        "--rhos",
        default=",".join(map(str, PAPER_RHOS)),
        help="comma-separated protected group fractions rho to run, e.g. 0.2,0.3 (default: 0.1 to 0.9)",
    )
    sweep_parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes (default: one per core)"
    )
    sweep_parser.add_argument(
        "--out", type=Path, default=Path("sweep.csv"), help="CSV file, one row per grid point (default sweep.csv)"
    )
    sweep_parser.set_defaults(handler=_sweep_command)
