"""Which server step lets FedSRCVaR fit as fast as FedAvg: Algorithm 1's, heavy-ball momentum or FedAdam.

MNIST with one digit per site (10 sites), the 512-unit MLP, rho = 0.1, epsilon = 0.05, Algorithm 1's B = 1,
200 rounds, seed 0, on validation rows (each site's training rows split 80 / 20, as the tuning protocol splits
them): for each server step, step size (a multiple of the curvature step 0.5 / ((1 - eps) / rho + eps)) and
local step count of docs/paper.md's table, the output model's validation worst-decile risk, mean risk, accuracy
and worst-decile error, and its training RCVaR (the objective at rho and epsilon on the rows it trained on);
FedAvg at step 0.5 with 3 local steps and the uniform classifier h̄ and the base rate beside them. Prints JSON;
--json PATH writes it. About 10 minutes of one core.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from convergence_bench import CURVATURE_STEP, DATASETS, EPSILON, HELD_OUT, RHO, seeded_model
from published import publish
from fedfair.core.evaluation import evaluate
from fedfair.core.objective import rcvar
from fedfair.fairness import pooled
from fedfair.fairness.references import reference_reports
from fedfair.research.experiment import run_method
from fedfair.research.flags import config_from_flags
from fedfair.research.runs import federation_for

SERVER_STEPS: tuple[tuple[str, float, int], ...] = (
    ("Algorithm 1", 1, 1),
    ("Algorithm 1", 2.5, 1),
    ("Algorithm 1", 1, 3),
    ("momentum 0.5", 1, 1),
    ("momentum 0.9", 1, 1),
    ("momentum 0.9", 0.5, 1),
    ("momentum 0.9", 0.25, 1),
    ("momentum 0.9", 0.1, 1),
    ("momentum 0.9", 0.25, 3),
    ("FedAdam, server step 0.001", 1, 3),
    ("FedAdam, server step 0.003", 1, 3),
    ("FedAdam, server step 0.005", 1, 3),
    ("FedAdam, server step 0.01", 1, 3),
    ("FedAdam, server step 0.01", 0.25, 3),
    ("FedAdam, server step 0.03", 1, 3),
    ("FedAdam, server step 0.1", 1, 3),
)
"""docs/paper.md's rows: the server step, the step as a multiple of the curvature step, and the local steps."""

FEDAVG = ("FedAvg, step 0.5", ["--method", "fedavg", "--lr", "0.5", "--local-steps", "3"])
"""The reference row: FedAvg at the point the protocol chose (as convergence_bench's)."""


def server_flags(server_step: str, multiple: float, local_steps: int) -> list[str]:
    """FedSRCVaR's flags for one row of `SERVER_STEPS` (Algorithm 1's plain step, momentum or FedAdam on theta)."""
    step = f"{multiple * CURVATURE_STEP:.6g}"
    flags = ["--method", "fedsrcvar", "--lr", step, "--threshold-lr", step, "--local-steps", str(local_steps)]
    flags += ["--bound", "1"]
    if server_step.startswith("FedAdam, server step "):
        return [*flags, "--server-adam-lr", server_step.removeprefix("FedAdam, server step ")]
    momentum = server_step.removeprefix("momentum ") if server_step.startswith("momentum ") else "0"
    return [*flags, "--server-momentum", momentum]


def measure(method_flags: list[str], rounds: int) -> dict[str, Any]:
    """One run of 200 rounds on the validation split: the output's validation figures and training RCVaR."""
    flags = [*DATASETS["mnist"], "--model", "mlp", "--rho", f"{RHO:g}", "--epsilon", f"{EPSILON:g}"]
    flags += [*method_flags, "--rounds", str(rounds), "--seed", "0"]
    config = config_from_flags(flags)
    federation = federation_for(tuple(flags), "validation")  # its held-out rows are the validation rows
    started = time.process_time()
    outcome = run_method(config, federation)
    seconds = time.process_time() - started
    model = seeded_model(config, federation)
    validation = evaluate(model, outcome.theta, federation.pooled("test"))
    report = pooled.group_risk_report(validation.losses, validation.correct, RHO)
    train_losses = evaluate(model, outcome.theta, federation.pooled("train")).losses
    return {
        "flags": method_flags,
        **{f"validation_{figure}": getattr(report, figure) for figure in HELD_OUT},
        "train_rcvar": rcvar(train_losses, EPSILON, RHO),
        "cpu_seconds": seconds,
    }


def references() -> dict[str, dict[str, float]]:
    """h̄'s and the base rate's figures on the same validation rows, exact (no training), by table name."""
    flags = (*DATASETS["mnist"], "--model", "mlp", "--rho", f"{RHO:g}", "--seed", "0")
    federation = federation_for(flags, "validation")
    train, validation = federation.pooled("train").labels.numpy(), federation.pooled("test").labels.numpy()
    return {
        name: {f"validation_{figure}": getattr(report, figure) for figure in HELD_OUT}
        for name, report in reference_reports(train, validation, federation.num_classes, RHO).items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [
        {"server_step": server_step, "step_multiple": multiple, "local_steps": local_steps}
        | measure(server_flags(server_step, multiple, local_steps), args.rounds)
        for server_step, multiple, local_steps in SERVER_STEPS
    ]
    fedavg, fedavg_flags = FEDAVG
    rows.append({"server_step": fedavg, "step_multiple": None, "local_steps": 3} | measure(fedavg_flags, args.rounds))
    publish(
        {"rounds": args.rounds, "rho": RHO, "epsilon": EPSILON, "rows": rows, "references": references()}, args.json
    )


if __name__ == "__main__":
    main()
