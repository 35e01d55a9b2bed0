"""The epsilon x rho grid from the command line: `fedfair sweep`.

Runs one simulated experiment per grid point, in parallel processes, and writes the
final objectives and the held-out fairness report of each point as one CSV row
(`--out`), and with `--json` the same rows, each with its full configuration, as
JSON. The default grid is the paper's.
"""

from __future__ import annotations

import argparse
import csv
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fedfair.core.errors import ConfigError
from fedfair.research.experiment import ExperimentConfig, load_federation, simulate
from fedfair.research.flags import add_experiment_arguments, config_from_args, write_json
from fedfair.runtime.progress import Progress
from fedfair.simulation.federation import Federation
from fedfair.research.workers import process_pool

PAPER_EPSILONS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
PAPER_RHOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def parse_grid(text: str, name: str) -> tuple[float, ...]:
    """The values of a comma-separated flag such as --epsilons; `name` is the flag, for the error."""
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"--{name} must be comma-separated numbers, got '{text}'") from None


def grid_configs(args: argparse.Namespace, epsilons: Sequence[float], rhos: Sequence[float]) -> list[ExperimentConfig]:
    """One config per (epsilon, rho), each with the defaults that pair implies (step sizes scale with it)."""
    configs = [
        config_from_args(argparse.Namespace(**{**vars(args), "epsilon": epsilon, "rho": rho}))
        for epsilon in epsilons
        for rho in rhos
    ]
    # A grid reports final values only: per-round history would multiply its cost.
    return [replace(config, simulation=replace(config.simulation, record_every=0)) for config in configs]


def _sweep_point(job: tuple[ExperimentConfig, Federation]) -> dict[str, Any]:
    """One grid point's CSV row; runs in a worker process, on one thread so the workers share the cores."""
    torch.set_num_threads(1)
    config, federation = job
    result = simulate(config, federation, progress=False)
    return {
        "epsilon": config.objective.epsilon,
        "rho": config.objective.rho,
        "train_objective": result["final"]["train_objective"],
        "train_objective_smooth": result["final"]["train_objective_smooth"],
        "c": result["final"]["c"],
        **result["final"]["test"],
        "seconds": result["seconds"],
    }


def sweep(configs: Sequence[ExperimentConfig], federation: Federation, jobs: int) -> list[dict[str, Any]]:
    """Run every configuration (one per grid point); one process per core, one thread each."""
    rows: list[dict[str, Any]] = []
    with process_pool(jobs) as pool, Progress(len(configs), "sweep", unit="point") as shown:
        for index, row in enumerate(pool.map(_sweep_point, [(config, federation) for config in configs]), start=1):
            rows.append(row)
            shown.update(index, f"epsilon={row['epsilon']:g} rho={row['rho']:g}")
    return rows


def _sweep_command(args: argparse.Namespace) -> int:
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


def sweep_json(configs: Sequence[ExperimentConfig], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What `--json` writes: the grid, and per point its CSV row with the full configuration it ran."""
    return {
        "epsilons": sorted({config.objective.epsilon for config in configs}),
        "rhos": sorted({config.objective.rho for config in configs}),
        "points": [{**row, "config": config.to_dict()} for config, row in zip(configs, rows, strict=True)],
    }


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
