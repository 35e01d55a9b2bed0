"""The epsilon x rho grid of `fedfair sweep`: one simulated experiment per point, in parallel.

Runs one simulated experiment per grid point, in parallel processes, and writes the
final objectives and the held-out fairness report of each point as one CSV row
(`--out`), and with `--json` the same rows, each with its full configuration, as
JSON. The default grid is the paper's.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from fedfair.core.errors import ConfigError
from fedfair.research.experiment import ExperimentConfig, simulate
from fedfair.research.flags import config_from_args
from fedfair.runtime.observe.progress import Progress
from fedfair.simulation.federation import Federation
from fedfair.research.workers import process_pool


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


def sweep_json(configs: Sequence[ExperimentConfig], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What `--json` writes: the grid, and per point its CSV row with the full configuration it ran."""
    return {
        "epsilons": sorted({config.objective.epsilon for config in configs}),
        "rhos": sorted({config.objective.rho for config in configs}),
        "points": [{**row, "config": config.to_dict()} for config, row in zip(configs, rows, strict=True)],
    }
