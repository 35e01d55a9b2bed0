"""The experiment flags read into an `ExperimentConfig`, and the report of one result.

`config_from_args` turns the flags of :mod:`fedfair.research.arguments` into an `ExperimentConfig`
(each default one that just works, each mistake refused naming the fix); `fedfair simulate`,
`reference`, `sweep` and `reproduce` build on the same flags.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core import server
from fedfair.core.errors import ConfigError
from fedfair.datasets import DATASETS
from fedfair.privacy.flags import privacy_config_from_args
from fedfair.privacy.learner import PrivacyReport
from fedfair.research import dro
from fedfair.research.arguments import DEFAULT_BASELINE_LR, add_experiment_arguments
from fedfair.research.experiment import ExperimentConfig
from fedfair.research.method_names import MOMENTUM_METHODS, RHO_FREE_METHODS
from fedfair.research.methods import MethodSettings, method_named, settings_for
from fedfair.runtime.new_federation import default_max_colluding
from fedfair.simulation.rounds import SimulationOptions

DEFAULT_TRADE_OFF = 0.1
"""RCVaR's trade-off when --epsilon is not given (BPF's default is 0: see `config_from_args`)."""


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


METHOD_FLAGS = (
    "local_epochs",
    "mixture_lr",
    "q",
    "adversary_lr",
    "groups",
    "loss_rows",
    "ceiling",
    "tilt",
    "client_level",
)
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
    own_momentum = method_named(args.method).server_momentum
    if args.server_momentum is not None and own_momentum is None:
        raise ConfigError(
            f"--server-momentum sets the server step of {', '.join(MOMENTUM_METHODS)}; --method {args.method} "
            "takes the plain averaging step its publication describes, so drop the flag"
        )
    if args.server_adam_lr is not None and args.method != "fedsrcvar":
        raise ConfigError(f"--server-adam-lr sets FedSRCVaR's server step; --method {args.method} takes none")
    momentum = 0.0
    if own_momentum is not None:
        default_momentum = own_momentum if args.server_adam_lr is None else 0.0
        momentum = default_momentum if args.server_momentum is None else args.server_momentum
    # Under momentum every method's default step keeps the same effective step (1 without momentum).
    scale = momentum_step_scale(momentum)
    step = default_step_size(objective.epsilon, objective.rho) * scale
    if args.baseline_lr is not None and args.method not in RHO_FREE_METHODS:
        raise ConfigError(
            f"--baseline-lr sets the step size of {', '.join(RHO_FREE_METHODS)}; --method {args.method} scales its "
            "default with epsilon and rho, so set --lr instead"
        )
    if args.method in RHO_FREE_METHODS:
        step_theta = args.baseline_lr if args.baseline_lr is not None else DEFAULT_BASELINE_LR * scale
    elif args.method == "dro":
        # DRO weighs sample i by C (l_i - eta)_+ / s, up to about C times CVaR's 1 / rho: the step shrinks with C.
        step_theta = default_step_size(0.0, objective.rho) / dro.chi_square_constant(objective.rho)
    else:
        step_theta = step
    if args.data is None and args.dataset not in DATASETS:
        raise ConfigError(f"unknown dataset '{args.dataset}'; choose one of: {', '.join(DATASETS)} or pass --data FILE")
    privacy = privacy_config_from_args(args)
    colluders = args.dp_colluders
    if privacy.enabled and privacy.mode == "distributed" and colluders is None:
        # What `fedfair init` writes into a new federation's plan for as many sites.
        colluders = default_max_colluding(args.clients)
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
            average_from=args.average_from,
            server_momentum=momentum,
            server_adam=None if args.server_adam_lr is None else server.Adam(args.server_adam_lr),
        ),
        simulation=SimulationOptions(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            record_every=args.record_every or max(args.rounds // 20, 1),
        ),
        privacy=privacy,
        secure_aggregation=args.secure_aggregation,
        settings=method_settings(args),
        colluders=colluders,
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
            f"  epsilon={objective['epsilon']} rho={objective['rho']} model={config['simulation']['model']} "
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
    lines.extend(noise_lines(result.get("distributed_noise") or {}))
    return "\n".join(lines)


def privacy_lines(reports: dict[str, dict[str, Any]]) -> list[str]:
    """The epsilon each collaborator spent under DP-SGD (nothing when privacy is off)."""
    if not reports:
        return []
    lines = ["  privacy spent (DP-SGD, per collaborator):"]
    lines.extend(f"    {name:<14}{PrivacyReport(**report).describe()}" for name, report in reports.items())
    return lines


def noise_lines(noise: dict[str, Any]) -> list[str]:
    """The noise the secure sums carried under distributed DP (`SecureSum.noise_report`; nothing without)."""
    if not noise:
        return []
    return [
        "  distributed DP (Skellam noise inside the secure sum):",
        f"    noise std     {noise['noise_std']:.4g} per coordinate of the decoded weighted sum "
        f"({noise['noise_multiplier']:.3f} x one record's move of it)",
        f"    colluders     {noise['colluders']} of {noise['parties']} sites: the others carry the whole noise, so the "
        f"sum holds {noise['noise_excess']:.3g} x the target's",
        f"    accounted     epsilon {noise['epsilon']:.3f} at delta {noise['delta']:g} after {noise['rounds']} rounds, "
        f"every site sampling its records at rate {noise['sample_rate']:.4g}",
    ]


def write_json(path: Path | None, payload: dict[str, Any]) -> None:
    """Write `payload` as indented JSON to `path`, creating its folder; nothing when `path` is None."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, default=str))
