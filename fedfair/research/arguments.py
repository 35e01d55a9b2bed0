"""The experiment flags of `fedfair simulate`, `reference` and `sweep`, each with a default that just works.

Light on purpose (no PyTorch): the commands' ``--help`` is built from these; :mod:`fedfair.research.flags`
reads the parsed flags into an `ExperimentConfig`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedfair.core.config import (
    DEFAULT_SERVER_MOMENTUM,
    DRIFT_CORRECTIONS,
    MODEL_NAMES,
    SMOOTH_FUNCTIONS,
    LocalConfig,
    TrainingConfig,
)
from fedfair.datasets import DATASETS
from fedfair.privacy.flags import add_privacy_arguments
from fedfair.research.method_names import LOSS_METHODS, METHOD_NAMES, MOMENTUM_METHODS, RHO_FREE_METHODS


DEFAULT_BASELINE_LR = 0.5
"""The rho-free methods' default step size: `default_step_size` at epsilon = 1 (plain ERM), for any rho."""


def add_experiment_arguments(parser: argparse.ArgumentParser, *, federated: bool = True) -> None:
    """The flags `simulate`, `reference` and `sweep` share, each with a default that just works.

    `federated=False` (for `reference`, which solves centrally) leaves out the flags of
    federated training (rounds, step sizes, secure aggregation, `--dp-*`), so that they
    cannot be given and silently ignored; their defaults still fill the config.
    """
    _add_data_arguments(parser)
    _add_objective_arguments(parser)
    if federated:
        _add_federated_arguments(parser)
    else:
        defaults = argparse.ArgumentParser(add_help=False)
        _add_federated_arguments(defaults)
        parser.set_defaults(**vars(defaults.parse_args([])))
    parser.add_argument("--json", type=Path, help="write the result as JSON to this path")


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", default="adult", help=f"one of: {', '.join(DATASETS)} (default adult)")
    data.add_argument("--data", help="your own CSV or Parquet file instead of --dataset")
    data.add_argument("--label", help="label column of --data")
    data.add_argument("--split-by", dest="split_by", help="column of --data that names each row's site or group")
    data.add_argument(
        "--features",
        help="comma-separated feature columns of --data, e.g. age,hours,sex (default: every column but --label)",
    )
    data.add_argument(
        "--partition",
        default=None,
        help="how rows go to clients: a column (race, site, ...), class, dirichlet or iid (default: the dataset's own)",
    )
    data.add_argument("--clients", type=int, default=3, help="number of collaborators (default 3)")
    data.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration for --partition dirichlet")


def _add_objective_arguments(parser: argparse.ArgumentParser) -> None:
    objective = parser.add_argument_group("model and objective")
    objective.add_argument("--model", default="logreg", choices=MODEL_NAMES)
    objective.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help="trade-off: 1 is ERM, 0 is CVaR (default 0.1); bpf: each sample's least weight, ratios in "
        "[epsilon / rho, 1 / rho] (default 0, the plain bounded-size adversary)",
    )
    objective.add_argument("--rho", type=float, default=0.3, help="smallest protected group fraction (default 0.3)")
    objective.add_argument("--gamma", type=float, default=0.05, help="smoothing of the plus function (default 0.05)")
    objective.add_argument("--smooth", default="softrelu", choices=sorted(SMOOTH_FUNCTIONS))
    objective.add_argument("--bound", type=float, default=10.0, help="upper bound B of the threshold c (default 10)")
    objective.add_argument(
        "--seed", type=int, default=TrainingConfig.seed, help="seed of the data split and the initial model"
    )


def _add_federated_arguments(parser: argparse.ArgumentParser) -> None:
    learning = parser.add_argument_group("federated training")
    learning.add_argument("--method", default="fedsrcvar", choices=METHOD_NAMES)
    learning.add_argument(
        "--local-steps",
        type=int,
        default=LocalConfig.local_steps,
        help=f"tau: local SGD steps per round (default {LocalConfig.local_steps})",
    )
    learning.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="total mini-batch per round, split b_k ~ n_k; 0 = full batches (default: 1024 logreg, 256 others)",
    )
    learning.add_argument(
        "--lr",
        type=float,
        default=None,
        help="step size for theta (default: 0.5 / ((1 - epsilon) / rho + epsilon), for fedsrcvar times "
        "min(1, 2.5 (1 - server momentum)), 0.25 at its default momentum; dro: 0.5 rho / C with "
        "C = sqrt(1 + (1 / rho - 1)^2); the methods without rho: --baseline-lr)",
    )
    learning.add_argument(
        "--threshold-lr",
        type=float,
        default=None,
        help="step size for the threshold c of fedsrcvar and central-cvar (default: the --lr default)",
    )
    learning.add_argument(
        "--rounds",
        type=int,
        default=TrainingConfig.rounds,
        help=f"communication rounds (default {TrainingConfig.rounds})",
    )
    learning.add_argument(
        "--average-from",
        type=float,
        default=TrainingConfig.average_from,
        help=f"fraction of rounds left out of the output average (default {TrainingConfig.average_from}); 0 = "
        "Algorithm 1's average of "
        "the pairs every round starts from",
    )
    learning.add_argument("--reuse-batch", action="store_true", help="one mini-batch per round for all tau steps")
    learning.add_argument(
        "--project-locally",
        action="store_true",
        help="also project c onto [0, B] after every local step (Algorithm 1 projects at the server only); "
        "helps when local steps push c far out of range, e.g. under DP noise or with many local steps",
    )
    learning.add_argument(
        "--drift-correction",
        default=LocalConfig.drift_correction,
        choices=DRIFT_CORRECTIONS,
        help="scaffold: SCAFFOLD control variates for theta and c, so --local-steps > 1 no longer drift toward "
        "each collaborator's own optimum and quantile; doubles what each collaborator sends per round "
        "(still one secure sum); needs a step well below plain local SGD's to stay stable. fedsrcvar and "
        "fedavg only (default none: Algorithm 1 as written)",
    )
    learning.add_argument(
        "--server-momentum",
        type=float,
        default=None,
        help=f"{', '.join(MOMENTUM_METHODS)}: the server's heavy-ball momentum on the mean update (default "
        f"{DEFAULT_SERVER_MOMENTUM} for fedsrcvar and fedavgm, 0 for the others; 0 is the plain averaging step); "
        "what travels is unchanged, and the default --lr keeps lr / (1 - momentum) at 2.5 times the plain step",
    )
    learning.add_argument(
        "--server-adam-lr",
        type=float,
        default=None,
        help="fedsrcvar: FedAdam's server step on theta instead of momentum (Reddi et al. 2021; default off; "
        "then the momentum and the --lr default are Algorithm 1's)",
    )
    # The simulation's own options (SimulationOptions) live beside torch; tests hold these equal to them.
    learning.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    learning.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    learning.add_argument(
        "--record-every", type=int, default=0, help="record history every N rounds (default: 20 points)"
    )
    learning.add_argument(
        "--secure-aggregation",
        action="store_true",
        help="sum every round through the real secure-aggregation protocol, in process (slower)",
    )
    _add_baseline_arguments(parser)
    add_privacy_arguments(parser)


def _add_baseline_arguments(parser: argparse.ArgumentParser) -> None:
    """The knobs of the methods FedSRCVaR is compared with, the ones the paper tunes."""
    baseline = parser.add_argument_group("baselines")
    baseline.add_argument(
        "--baseline-lr",
        type=float,
        default=None,
        help=f"step size for theta of {', '.join(RHO_FREE_METHODS)}, whose objectives have no epsilon or rho "
        f"(default {DEFAULT_BASELINE_LR}; --lr, when given, wins)",
    )
    baseline.add_argument(
        "--local-epochs",
        type=int,
        default=None,
        help="fedavg: E passes over each collaborator's data per round instead of --local-steps (paper: 3, 8, 15)",
    )
    baseline.add_argument(
        "--mixture-lr",
        type=float,
        default=None,
        help="afl: step size of the ascent on the collaborators' mixture weights (default 0.01)",
    )
    baseline.add_argument(
        "--q", type=float, default=None, help="qfedavg: fairness exponent q, 0 is FedAvg with equal weights (default 1)"
    )
    baseline.add_argument(
        "--adversary-lr",
        type=float,
        default=None,
        help="bpf and fedminmax: step size of the ascent on the adversary's sample or group weights (default 0.1)",
    )
    baseline.add_argument(
        "--loss-rows",
        type=int,
        default=None,
        help=f"{', '.join(LOSS_METHODS)}: read each round's losses at theta_t from a fresh draw of this many "
        "rows per collaborator instead of all of them (default 0: all rows, as published)",
    )
    baseline.add_argument(
        "--ceiling",
        type=float,
        default=None,
        help="propfair: M in -log(M - F_k), above the losses it meets (default 5)",
    )
    baseline.add_argument(
        "--tilt",
        type=float,
        default=None,
        help="term: the tilt t > 0 of (1/t) log mean exp(t loss); t -> 0 is FedAvg (default 1)",
    )
    baseline.add_argument(
        "--client-level",
        type=float,
        default=None,
        help="deltafl: the share of client weight in the tail whose mean loss it minimises, in (0, 1]; 1 is "
        "FedAvg (default 0.5)",
    )
    baseline.add_argument(
        "--groups",
        default=None,
        help="fedminmax: the sensitive column whose groups it protects (default: the --partition column)",
    )


PAPER_EPSILONS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
"""The 14 trade-offs of the paper's Figure 3, `sweep`'s default epsilon grid."""

PAPER_RHOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""The paper's rho grid, `sweep`'s default."""
