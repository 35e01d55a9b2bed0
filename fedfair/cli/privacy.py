"""``fedfair privacy epsilon | plan``: DP-SGD accounting from the command line."""

from __future__ import annotations

import argparse

from fedfair.core.errors import ConfigError
from fedfair.privacy.config import ACCOUNTANTS


def _epsilon_command(args: argparse.Namespace) -> int:
    # Opacus's accountants load PyTorch: imported to run a command, never for its --help.
    from fedfair.privacy.accounting import compute_epsilon

    epsilon = compute_epsilon(args.noise_multiplier, args.sample_rate, args.steps, args.delta, args.accountant)
    print(
        f"{epsilon:.3f}  (epsilon at delta {args.delta:g} after {args.steps} steps, noise multiplier "
        f"{args.noise_multiplier:g}, sample rate {args.sample_rate:g}, {args.accountant} accountant)"
    )
    return 0


def _plan_command(args: argparse.Namespace) -> int:
    from fedfair.privacy.accounting import compute_epsilon, plan_noise_multiplier

    for flag, value in (
        ("--rounds", args.rounds),
        ("--local-steps", args.local_steps),
        ("--dataset-size", args.dataset_size),
    ):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if not 1 <= args.batch_size <= args.dataset_size:
        raise ConfigError(f"--batch-size must be in [1, --dataset-size = {args.dataset_size}], got {args.batch_size}")
    sample_rate = args.batch_size / args.dataset_size
    steps = args.rounds * args.local_steps
    noise = plan_noise_multiplier(args.target_epsilon, args.delta, sample_rate, steps, args.accountant)
    epsilon = compute_epsilon(noise, sample_rate, steps, args.delta, args.accountant)
    print(
        f"{noise:.4f}  (noise multiplier: epsilon {epsilon:.3f} at delta {args.delta:g} after {args.rounds} rounds x "
        f"{args.local_steps} local steps at sample rate {sample_rate:.4g}, {args.accountant} accountant)"
    )
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair privacy epsilon` and `fedfair privacy plan`."""
    privacy = subparsers.add_parser("privacy", help="DP-SGD accounting: epsilon of a run, noise for a target epsilon")
    actions = privacy.add_subparsers(dest="privacy_command", required=True, metavar="ACTION")

    epsilon = actions.add_parser("epsilon", help="epsilon spent by DP-SGD steps (Poisson sampling)")
    epsilon.add_argument("--noise-multiplier", type=float, required=True, help="sigma: noise std over the clip bound")
    epsilon.add_argument("--sample-rate", type=float, required=True, help="q: batch size / dataset size")
    epsilon.add_argument("--steps", type=int, required=True, help="number of DP-SGD steps (rounds x local steps)")
    epsilon.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    epsilon.add_argument("--accountant", choices=ACCOUNTANTS, default="prv", help="prv (default) or rdp")
    epsilon.set_defaults(handler=_epsilon_command)

    plan = actions.add_parser("plan", help="the noise multiplier that spends a target epsilon over a training run")
    plan.add_argument("--target-epsilon", type=float, required=True)
    plan.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    plan.add_argument("--rounds", type=int, required=True, help="federation rounds")
    plan.add_argument("--local-steps", type=int, default=1, help="tau: local steps per round (default 1)")
    plan.add_argument("--batch-size", type=int, required=True, help="this collaborator's batch size b_k")
    plan.add_argument("--dataset-size", type=int, required=True, help="this collaborator's training samples n_k")
    plan.add_argument("--accountant", choices=ACCOUNTANTS, default="prv", help="prv (default) or rdp")
    plan.set_defaults(handler=_plan_command)
