"""The `--dp-*` flags of `fedfair simulate`: DP-SGD on every collaborator, read into a PrivacyConfig."""

from __future__ import annotations

import argparse

from fedfair.core.errors import ConfigError
from fedfair.privacy.config import ACCOUNTANTS, PrivacyConfig

# ---------------------------------------------------------------- flags


def add_privacy_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--dp-*` flags of `fedfair simulate`: DP-SGD on every collaborator, off unless a noise level is given."""
    # The defaults shown are PrivacyConfig's own, so that the help cannot drift from what runs.
    defaults = PrivacyConfig()
    group = parser.add_argument_group("differential privacy (DP-SGD on every collaborator; off by default)")
    group.add_argument("--dp-noise-multiplier", type=float, help="noise std over the clip bound (sigma), e.g. 1.0")
    group.add_argument("--dp-target-epsilon", type=float, help="calibrate sigma so the whole run spends this epsilon")
    group.add_argument(
        "--dp-max-grad-norm", type=float, help=f"per-sample clip bound C (default {defaults.max_grad_norm:g})"
    )
    group.add_argument(
        "--dp-delta", type=float, help=f"delta of the (epsilon, delta) guarantee (default {defaults.delta:g})"
    )
    group.add_argument("--dp-budget", type=float, help="epsilon after which a collaborator stops contributing")
    group.add_argument(
        "--dp-accountant",
        choices=ACCOUNTANTS,
        help=f"prv (tight) or rdp (fast) (default {defaults.accountant})",
    )


def privacy_config_from_args(args: argparse.Namespace) -> PrivacyConfig:
    """The PrivacyConfig the `--dp-*` flags ask for; enabled when a noise level or target is given."""
    enabled = args.dp_noise_multiplier is not None or args.dp_target_epsilon is not None
    extras = {
        "--dp-max-grad-norm": args.dp_max_grad_norm,
        "--dp-delta": args.dp_delta,
        "--dp-budget": args.dp_budget,
        "--dp-accountant": args.dp_accountant,
    }
    given = [flag for flag, value in extras.items() if value is not None]
    if not enabled and given:
        raise ConfigError(f"{given[0]} needs --dp-noise-multiplier or --dp-target-epsilon to turn privacy on")
    defaults = PrivacyConfig()
    return PrivacyConfig(
        enabled=enabled,
        noise_multiplier=args.dp_noise_multiplier,
        target_epsilon=args.dp_target_epsilon,
        max_grad_norm=args.dp_max_grad_norm if args.dp_max_grad_norm is not None else defaults.max_grad_norm,
        delta=args.dp_delta if args.dp_delta is not None else defaults.delta,
        budget_epsilon=args.dp_budget,
        accountant=args.dp_accountant or defaults.accountant,
    )
