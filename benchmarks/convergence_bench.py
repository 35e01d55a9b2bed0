"""How fast each method fits: rounds to come within 1% of its own best held-out worst-group risk.

On MNIST (one digit per site, 10 sites) and Census-Income KDD (3 sites by race), the 512-unit MLP,
rho = 0.1, epsilon = 0.05, Algorithm 1's B = 1, seed 0, it trains

- FedSRCVaR before: Algorithm 1's plain server step at the curvature step 0.5 / ((1 - eps) / rho + eps),
  one local step (the point `reproduce --profile figure1` chose on MNIST before server momentum);
- FedSRCVaR after: server momentum 0.9 at 0.25 of that step, with 3 local steps, the point the same
  protocol chooses now (docs/paper.md);
- FedAvg: step 0.5 with 3 local steps (the point the protocol chose on both datasets, docs/paper.md),

and every `--every` rounds judges the model a run of that many rounds would output (the average of
the pairs its second half starts from, as `average_from` = 0.5 makes it) on the test rows. It reports
each method's best worst-decile risk, the first round within 1% of it, the first round at or below
FedAvg's final risk (None: never within the rounds), the final risk with the final output's held-out
mean risk, accuracy and worst-decile error (what the ranking buys, issue 96), and the training RCVaR
of the final output (the objective at rho = 0.1, epsilon = 0.05, every training row); beside them,
per dataset, the same held-out figures of the uniform classifier h̄ and the base rate. Prints JSON;
--json PATH writes it. About 5 minutes of one core.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from published import publish
from fedfair.core.evaluation import evaluate
from fedfair.core.objective import rcvar
from fedfair.core.server import ServerState
from fedfair.fairness import pooled
from fedfair.fairness.references import reference_reports
from fedfair.fairness.report import GroupRiskReport
from fedfair.core.models import build_model, flat_parameters
from fedfair.research.experiment import ExperimentConfig, load_federation, run_method
from fedfair.research.flags import config_from_flags, default_step_size
from fedfair.simulation.federation import Federation

RHO, EPSILON = 0.1, 0.05
HELD_OUT = ("worst_risk", "mean_risk", "accuracy", "worst_error")
"""The held-out figures of each method's final output and of the constant predictors, as ``final_<figure>``."""
WITHIN = 0.01
"""A method has converged at the first judged round whose risk is within this fraction of its best."""
DATASETS = {
    "mnist": ["--dataset", "mnist", "--partition", "class", "--clients", "10"],
    "census-income": ["--dataset", "census-income", "--partition", "race", "--clients", "3"],
}
CURVATURE_STEP = default_step_size(EPSILON, RHO)
METHODS = {
    "fedsrcvar_before": ["--method", "fedsrcvar", "--server-momentum", "0", "--lr", f"{CURVATURE_STEP:.6g}",
                         "--threshold-lr", f"{CURVATURE_STEP:.6g}", "--local-steps", "1", "--bound", "1"],
    "fedsrcvar_after": ["--method", "fedsrcvar", "--server-momentum", "0.9", "--lr", f"{0.25 * CURVATURE_STEP:.6g}",
                        "--threshold-lr", f"{0.25 * CURVATURE_STEP:.6g}", "--local-steps", "3", "--bound", "1"],
    "fedavg": ["--method", "fedavg", "--lr", "0.5", "--local-steps", "3"],
}  # fmt: skip


class SuffixAverages:
    """theta's prefix sums at every half-interval, so that the output of a run stopped at round t
    (the mean of theta^{t/2 + 1}, ..., theta^t) is one difference away."""

    def __init__(self, every: int) -> None:
        self.half = every // 2
        self.total = torch.zeros(0, dtype=torch.float64)
        self.sums: dict[int, torch.Tensor] = {}

    def add(self, round_started: int, theta: torch.Tensor) -> None:
        """theta^round_started: the pair the round starts from."""
        self.total = theta.clone() if round_started == 1 else self.total + theta
        if round_started % self.half == 0:
            self.sums[round_started] = self.total.clone()

    def output(self, rounds: int) -> torch.Tensor:
        first = rounds // 2
        return (self.sums[rounds] - self.sums[first]) / (rounds - first) if first else self.sums[rounds] / rounds


def measure(dataset: str, method: str, rounds: int, every: int) -> dict[str, Any]:
    flags = [*DATASETS[dataset], "--model", "mlp", "--rho", f"{RHO:g}", "--epsilon", f"{EPSILON:g}"]
    config = config_from_flags([*flags, *METHODS[method], "--rounds", str(rounds), "--seed", "0"])
    federation = load_federation(config)
    model, test = seeded_model(config, federation), federation.pooled("test")
    starts = [flat_parameters(model).to(torch.float64)]  # theta^1: the model as the run builds it
    sums = SuffixAverages(every)
    judged: dict[int, GroupRiskReport] = {}

    def on_round(state: ServerState) -> None:
        # This round started from starts[-1]; state.theta is where the next one starts.
        sums.add(state.round, starts[-1])
        starts[:] = [state.theta.clone()]
        if state.round % every == 0:
            scored = evaluate(model, sums.output(state.round), test)
            judged[state.round] = pooled.group_risk_report(scored.losses, scored.correct, RHO)

    started = time.process_time()
    outcome = run_method(config, federation, on_round)
    seconds = time.process_time() - started
    curve = {r: report.worst_risk for r, report in sorted(judged.items())}
    best = min(curve.values())
    train_losses = evaluate(model, outcome.theta, federation.pooled("train")).losses
    return {
        "best_worst_risk": best,
        "rounds_to_within_1pct": min(r for r, risk in curve.items() if risk <= (1 + WITHIN) * best),
        **{f"final_{figure}": getattr(judged[rounds], figure) for figure in HELD_OUT},
        "final_train_rcvar": rcvar(train_losses, EPSILON, RHO),
        "cpu_seconds": seconds,
        "curve": {str(r): risk for r, risk in curve.items()},
    }


def references(dataset: str) -> dict[str, dict[str, float]]:
    """h̄'s and the base rate's held-out figures on `dataset`'s test rows, exact (no training), by table name."""
    config = config_from_flags([*DATASETS[dataset], "--model", "mlp", "--rho", f"{RHO:g}", "--seed", "0"])
    federation = load_federation(config)
    train, test = federation.pooled("train").labels.numpy(), federation.pooled("test").labels.numpy()
    return {
        name: {f"final_{figure}": getattr(report, figure) for figure in HELD_OUT}
        for name, report in reference_reports(train, test, federation.num_classes, RHO).items()
    }


def seeded_model(config: ExperimentConfig, federation: Federation) -> torch.nn.Module:
    """The run's initial model (the same seed and dtype as the simulation's template)."""
    return build_model(
        config.simulation.model,
        federation.num_features,
        federation.num_classes,
        image_shape=federation.image_shape,
        seed=config.training.seed,
        dtype=config.simulation.torch_dtype,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--every", type=int, default=10, help="judge every N rounds (even, dividing --rounds)")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    args = parser.parse_args()
    if args.every % 2 or args.rounds % args.every:
        parser.error("--every must be even and divide --rounds")
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for dataset in args.datasets.split(","):
        results[dataset] = {method: measure(dataset, method, args.rounds, args.every) for method in METHODS}
        before, after = results[dataset]["fedsrcvar_before"], results[dataset]["fedsrcvar_after"]
        # Each method's own best may still be falling at the last round; FedAvg's final risk is a common bar.
        bar = results[dataset]["fedavg"]["final_worst_risk"]
        for method in METHODS:
            curve = results[dataset][method]["curve"]
            reached = [int(r) for r, risk in curve.items() if risk <= bar]
            results[dataset][method]["rounds_to_fedavg_final"] = min(reached) if reached else None
        results[dataset]["after_over_before_rounds"] = after["rounds_to_within_1pct"] / before["rounds_to_within_1pct"]
        results[dataset]["after_over_fedavg_worst_risk"] = (
            after["final_worst_risk"] / results[dataset]["fedavg"]["final_worst_risk"]
        )
        results[dataset]["references"] = references(dataset)
    publish({"rounds": args.rounds, "rho": RHO, "epsilon": EPSILON, "results": results}, args.json)


if __name__ == "__main__":
    main()
