"""The experiment flags: `fedfair simulate` and `fedfair reference`, their arguments and reports.

`config_from_args` turns flags into an `ExperimentConfig` (each default one that just
works, each mistake refused naming the fix); `fedfair sweep` and `fedfair reproduce`
build on the same flags.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedfair.core.config import (
    DEFAULT_SERVER_MOMENTUM,
    DRIFT_CORRECTIONS,
    MODEL_NAMES,
    LocalConfig,
    ObjectiveConfig,
)
from fedfair.core import server
from fedfair.core.errors import ConfigError
from fedfair.core.objective import SMOOTH_PLUS_FUNCTIONS
from fedfair.datasets import DATASETS
from fedfair.fairness import pooled
from fedfair.privacy.commands import add_privacy_arguments, privacy_config_from_args
from fedfair.privacy.learner import PrivacyReport
from fedfair.research import baselines, dro
from fedfair.research.experiment import (
    LOSS_METHODS,
    ExperimentConfig,
    load_federation,
    reference,
    simulate,
)
from fedfair.research.methods import METHODS, MethodSettings, settings_for
from fedfair.simulation.rounds import TrainingConfig

RHO_FREE_METHODS = tuple(name for name, method in METHODS.items() if method.rho_free)
"""Methods whose objective has no rho or epsilon: their step size is --baseline-lr, not one scaled by them."""

DEFAULT_TRADE_OFF = 0.1
"""RCVaR's trade-off when --epsilon is not given (BPF's default is 0: see `config_from_args`)."""

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
    objective.add_argument("--smooth", default="softrelu", choices=sorted(SMOOTH_PLUS_FUNCTIONS))
    objective.add_argument("--bound", type=float, default=10.0, help="upper bound B of the threshold c (default 10)")
    objective.add_argument("--seed", type=int, default=0, help="seed of the data split and the initial model")


def _add_federated_arguments(parser: argparse.ArgumentParser) -> None:
    learning = parser.add_argument_group("federated training")
    learning.add_argument("--method", default="fedsrcvar", choices=METHODS)
    learning.add_argument("--local-steps", type=int, default=1, help="tau: local SGD steps per round (default 1)")
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
    learning.add_argument("--rounds", type=int, default=1000, help="communication rounds (default 1000)")
    learning.add_argument(
        "--average-from",
        type=float,
        default=0.5,
        help="fraction of rounds left out of the output average (default 0.5); 0 = Algorithm 1's average of "
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
        default="none",
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
        help=f"fedsrcvar: the server's heavy-ball momentum on the mean update (default {DEFAULT_SERVER_MOMENTUM}; "
        "0 is Algorithm 1's plain averaging step); what travels is unchanged",
    )
    learning.add_argument(
        "--server-adam-lr",
        type=float,
        default=None,
        help="fedsrcvar: FedAdam's server step on theta instead of momentum (Reddi et al. 2021; default off; "
        "then the momentum and the --lr default are Algorithm 1's)",
    )
    learning.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    learning.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    learning.add_argument("--record-every", type=int, default=0, help="record history every N rounds (default: 20 points)")
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
        "--groups",
        default=None,
        help="fedminmax: the sensitive column whose groups it protects (default: the --partition column)",
    )


def parse_features(text: str | None) -> tuple[str, ...] | None:
    """The columns of `--features a,b,c` (None when the flag is not given: every column but the label)."""
    if text is None:
        return None
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ConfigError(f"--features must name at least one column, e.g. --features age,hours; got '{text}'")
    return names


def default_step_size(epsilon: float, rho: float) -> float:
    """0.5 / ((1 - eps) / rho + eps).

    The smoothed objective's curvature grows like (1 - eps) / rho + eps (the paper's smoothness constant), so a
    step that is safe at rho = 1 is scaled down with it.
    """
    return 0.5 / ((1.0 - epsilon) / rho + epsilon)


MOMENTUM_EFFECTIVE_STEP = 2.5
"""FedSRCVaR's default effective step lr / (1 - beta), in multiples of `default_step_size` (docs/paper.md,
"Fitting as fast as FedAvg": on MNIST by digit at rho = 0.1, 2.5 and 5 were best, 10 unstable, and a
plain step of 2.5 diverged; heavy-ball momentum is what makes the larger effective step stable)."""


def momentum_step_scale(momentum: float) -> float:
    """The multiple of `default_step_size` FedSRCVaR steps by under server momentum beta.

    The effective step lr / (1 - beta) at MOMENTUM_EFFECTIVE_STEP times it, never a plain step above it (1 at
    beta = 0).
    """
    return min(1.0, MOMENTUM_EFFECTIVE_STEP * (1.0 - momentum))


def default_batch_size(model: str) -> int:
    """Large enough that the c-gradient noise at small rho (it scales as 1/rho) averages out for the convex model.

    The neural models keep the paper's smaller batches, which their step cost needs.
    """
    return 1024 if model == "logreg" else 256


METHOD_FLAGS = ("local_epochs", "mixture_lr", "q", "adversary_lr", "groups", "loss_rows")
"""The flags only some methods take (each is a field of those methods' settings); unset, they are None."""


def method_settings(args: argparse.Namespace) -> MethodSettings:
    """The method's own settings from the method-only flags given; another method's flag is refused."""
    given = {name: getattr(args, name) for name in METHOD_FLAGS if getattr(args, name) is not None}
    return settings_for(args.method, given)


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """Validate flags into an ExperimentConfig; invalid values raise ConfigError naming the fix."""
    if args.data is not None and args.label is None:
        raise ConfigError("--data needs --label naming the label column")
    partition_scheme = args.partition or (
        args.split_by if args.data else DATASETS[args.dataset].default_partition if args.dataset in DATASETS else "iid"
    )
    # BPF reads epsilon as its ratios' floor, not as RCVaR's trade-off: FedSRCVaR's default 0.1 would pin
    # every ratio at 1 when rho = 0.1 (plain ERM), so its default is the unconstrained adversary's 0.
    epsilon = args.epsilon if args.epsilon is not None else 0.0 if args.method == "bpf" else DEFAULT_TRADE_OFF
    objective = ObjectiveConfig(epsilon=epsilon, rho=args.rho, gamma=args.gamma, smooth=args.smooth, bound=args.bound)
    if args.server_momentum is not None and args.method != "fedsrcvar":
        raise ConfigError(
            f"--server-momentum sets FedSRCVaR's server step; --method {args.method} takes the plain averaging "
            "step its publication describes, so drop the flag"
        )
    if args.server_adam_lr is not None and args.method != "fedsrcvar":
        raise ConfigError(f"--server-adam-lr sets FedSRCVaR's server step; --method {args.method} takes none")
    momentum = 0.0
    step = default_step_size(objective.epsilon, objective.rho)
    if args.method == "fedsrcvar":
        default_momentum = DEFAULT_SERVER_MOMENTUM if args.server_adam_lr is None else 0.0
        momentum = default_momentum if args.server_momentum is None else args.server_momentum
        step *= momentum_step_scale(momentum)
    if args.baseline_lr is not None and args.method not in RHO_FREE_METHODS:
        raise ConfigError(
            f"--baseline-lr sets the step size of {', '.join(RHO_FREE_METHODS)}; --method {args.method} scales its "
            "default with epsilon and rho, so set --lr instead"
        )
    if args.method in RHO_FREE_METHODS:
        step_theta = args.baseline_lr if args.baseline_lr is not None else DEFAULT_BASELINE_LR
    elif args.method == "dro":
        # DRO weighs sample i by C (l_i - eta)_+ / s, up to about C times CVaR's 1 / rho: the step shrinks with C.
        step_theta = default_step_size(0.0, objective.rho) / dro.chi_square_constant(objective.rho)
    else:
        step_theta = step
    if args.data is None and args.dataset not in DATASETS:
        raise ConfigError(f"unknown dataset '{args.dataset}'; choose one of: {', '.join(DATASETS)} or pass --data FILE")
    return ExperimentConfig(
        dataset=args.dataset if args.data is None else Path(args.data).name,
        data=args.data,
        label=args.label,
        split_by=args.split_by,
        features=parse_features(args.features),
        partition=partition_scheme or "iid",
        clients=args.clients,
        alpha=args.alpha,
        method=args.method,
        objective=objective,
        training=TrainingConfig(
            model=args.model,
            rounds=args.rounds,
            batch_size=args.batch_size if args.batch_size is not None else default_batch_size(args.model),
            local=LocalConfig(
                local_steps=args.local_steps,
                lr=args.lr if args.lr is not None else step_theta,
                threshold_lr=args.threshold_lr if args.threshold_lr is not None else step,
                reuse_batch=args.reuse_batch,
                project_locally=args.project_locally,
                drift_correction=args.drift_correction,
            ),
            seed=args.seed,
            device=args.device,
            dtype=args.dtype,
            average_from=args.average_from,
            record_every=args.record_every or max(args.rounds // 20, 1),
            server_momentum=momentum,
            server_adam=None if args.server_adam_lr is None else server.Adam(args.server_adam_lr),
        ),
        privacy=privacy_config_from_args(args),
        secure_aggregation=args.secure_aggregation,
        settings=method_settings(args),
    )


def parse_flags(flags: Sequence[str] = ()) -> argparse.Namespace:
    """The experiment flags parsed as the CLI would, defaults included."""
    parser = argparse.ArgumentParser()
    add_experiment_arguments(parser)
    return parser.parse_args(list(flags))


def config_from_flags(flags: Sequence[str] = ()) -> ExperimentConfig:
    """The ExperimentConfig the CLI would build from these flags."""
    return config_from_args(parse_flags(flags))


def format_report(result: dict[str, Any]) -> str:
    """A readable table of one result."""
    config, final = result["config"], result["final"]
    objective = config["objective"]
    if config["method"] == "reference":
        length = f"L-BFGS-B iterations={result['history'][0]['iterations']}"
    else:
        length = f"rounds={config['training']['rounds']}"
    lines = [
        f"{config['method']} on {config['dataset']} ({', '.join(f'{k}: {v}' for k, v in result['clients'].items())})",
        (
            f"  epsilon={objective['epsilon']} rho={objective['rho']} model={config['training']['model']} "
            f"{length} ({result['seconds']:.1f} s)"
        ),
        f"  train objective (exact RCVaR)   {final['train_objective']:.5f}",
        f"  train objective (smoothed)      {final['train_objective_smooth']:.5f}   c = {final['c']:.5f}",
        f"  test, at rho = {objective['rho']}:",
    ]
    test = final["test"]
    for key in ("mean_risk", "worst_risk", "best_risk", "disparity", "accuracy", "worst_error"):
        lines.append(f"    {key:<14}{test[key]:.5f}")
    lines.append(f"    {'uniform_risk':<14}{final['uniform_risk']:.5f}   (ln K: the uniform classifier's risk)")
    lines.extend(privacy_lines(result.get("privacy") or {}))
    return "\n".join(lines)


def privacy_lines(reports: dict[str, dict[str, Any]]) -> list[str]:
    """The epsilon each collaborator spent under DP-SGD (nothing when privacy is off)."""
    if not reports:
        return []
    lines = ["  privacy spent (DP-SGD, per collaborator):"]
    lines.extend(f"    {name:<14}{PrivacyReport(**report).describe()}" for name, report in reports.items())
    return lines


def write_json(path: Path | None, payload: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, default=str))


def _simulate_command(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    result = simulate(config, load_federation(config))
    print(format_report(result))
    write_json(args.json, result)
    return 0


def _reference_command(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    result = reference(config, load_federation(config))
    print(format_report({**result, "config": {**result["config"], "method": "reference"}}))
    write_json(args.json, result)
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair simulate` and `fedfair reference`, both taking the experiment flags."""
    simulate_parser = subparsers.add_parser("simulate", help="run a federation in process and report fairness")
    add_experiment_arguments(simulate_parser)
    simulate_parser.set_defaults(handler=_simulate_command)

    reference_parser = subparsers.add_parser(
        "reference",
        help="the centralized optimum the federation must reach",
        description="The centralized optimum the federation must reach: L-BFGS-B on the pooled training data. "
        "It trains nothing federated, so it takes no rounds, step sizes, --secure-aggregation or --dp-* flags.",
    )
    add_experiment_arguments(reference_parser, federated=False)
    reference_parser.set_defaults(handler=_reference_command)
