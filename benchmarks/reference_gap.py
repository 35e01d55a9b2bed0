"""FedSRCVaR against the centralized optimum over the acceptance grid.

Adult, logistic regression, 3 clients by race, tau = 1, default flags: for each
(epsilon, rho) in {0.01, 0.1, 0.5} x {0.1, 0.3, 0.5}, the relative gap between
the federation's averaged smoothed training objective and `reference.py`'s
optimum. Target: every gap within 1%. Prints JSON; --json PATH writes it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from published import publish
from fedfair.research.experiment import load_federation, reference, simulate
from fedfair.research.flags import config_from_flags

GRID_EPSILONS = (0.01, 0.1, 0.5)
GRID_RHOS = (0.1, 0.3, 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    federation = load_federation(config_from_flags())
    rows = []
    started = time.perf_counter()
    for epsilon in GRID_EPSILONS:
        for rho in GRID_RHOS:
            config = config_from_flags(["--epsilon", str(epsilon), "--rho", str(rho)])
            federated = simulate(config, federation, progress=False)["final"]["train_objective_smooth"]
            optimum = reference(config, federation)["final"]["train_objective_smooth"]
            rows.append(
                {
                    "epsilon": epsilon,
                    "rho": rho,
                    "federated": federated,
                    "reference": optimum,
                    "relative_gap": (federated - optimum) / optimum,
                }
            )
    result = {
        "max_relative_gap": max(row["relative_gap"] for row in rows),
        "seconds": time.perf_counter() - started,
        "grid": rows,
    }
    publish(result, args.json)


if __name__ == "__main__":
    main()
