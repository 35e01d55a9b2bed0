"""The `--dp-*` flags of `fedfair simulate`: DP-SGD on every collaborator or inside the secure sum.

`--dp-mode local` (the default) is DP-SGD with each collaborator's own noise; `--dp-mode distributed`
clips every record's gradient locally and adds calibrated Skellam noise inside the secure sum
(`fedfair.privacy.distributed`), read into a PrivacyConfig of that mode.
"""

from __future__ import annotations

import argparse

from fedfair.core.errors import ConfigError
from fedfair.privacy.config import ACCOUNTANTS, MODES, PrivacyConfig

DISTRIBUTED_ACCOUNTANT = "rdp"
"""Distributed DP is accounted in RDP (the Skellam mechanism's bound), as a plan's `mode = "distributed"` is."""

# ---------------------------------------------------------------- flags


def add_privacy_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--dp-*` flags of `fedfair simulate`: off unless a noise level is given."""
    # The defaults shown are PrivacyConfig's own, so that the help cannot drift from what runs.
    defaults = PrivacyConfig()
    group = parser.add_argument_group(
        "differential privacy (DP-SGD on every collaborator or inside the secure sum; off by default)"
    )
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
        help=f"prv (tight) or rdp (fast) (default {defaults.accountant}); --dp-mode distributed is accounted in "
        f"{DISTRIBUTED_ACCOUNTANT} only",
    )
    group.add_argument(
        "--dp-mode",
        choices=MODES,
        help=f"local: each collaborator noises its own steps (DP-SGD); distributed: fedsrcvar or term with "
        "--secure-aggregation, records clipped locally and Skellam noise calibrated to --dp-target-epsilon "
        f"added inside the secure sum, every site sampling at the batch fraction (default {defaults.mode})",
    )
    group.add_argument(
        "--dp-colluders",
        type=int,
        help="--dp-mode distributed: sites that may collude with the aggregator; the other sites carry the "
        "whole noise (default 1, 0 with two sites: fedfair init's --max-colluding)",
    )


def privacy_config_from_args(args: argparse.Namespace) -> PrivacyConfig:
    """The PrivacyConfig the `--dp-*` flags ask for; enabled when a noise level or target is given.

    `--dp-colluders` is the secure sum's, not a collaborator's (`fedfair.research.flags` reads it); it is
    checked here only for needing distributed mode.
    """
    enabled = args.dp_noise_multiplier is not None or args.dp_target_epsilon is not None
    distributed = args.dp_mode == "distributed"
    if distributed and args.dp_target_epsilon is None:
        raise ConfigError(
            "--dp-mode distributed calibrates the secure sum's noise to a target epsilon; "
            "add --dp-target-epsilon, e.g. --dp-target-epsilon 1"
        )
    if args.dp_colluders is not None and not distributed:
        raise ConfigError(
            "--dp-colluders sets who carries the secure sum's noise under --dp-mode distributed; "
            "add --dp-mode distributed or drop --dp-colluders"
        )
    if distributed and args.dp_accountant not in (None, DISTRIBUTED_ACCOUNTANT):
        raise ConfigError(
            f"--dp-mode distributed is accounted by the Skellam mechanism's RDP bound; drop --dp-accountant "
            f"{args.dp_accountant}"
        )
    extras = {
        "--dp-max-grad-norm": args.dp_max_grad_norm,
        "--dp-delta": args.dp_delta,
        "--dp-budget": args.dp_budget,
        "--dp-accountant": args.dp_accountant,
        "--dp-mode": args.dp_mode,
    }
    given = [flag for flag, value in extras.items() if value is not None]
    if not enabled and given:
        raise ConfigError(f"{given[0]} needs --dp-noise-multiplier or --dp-target-epsilon to turn privacy on")
    defaults = PrivacyConfig()
    accountant = DISTRIBUTED_ACCOUNTANT if distributed else args.dp_accountant or defaults.accountant
    return PrivacyConfig(
        enabled=enabled,
        noise_multiplier=args.dp_noise_multiplier,
        target_epsilon=args.dp_target_epsilon,
        max_grad_norm=args.dp_max_grad_norm if args.dp_max_grad_norm is not None else defaults.max_grad_norm,
        delta=args.dp_delta if args.dp_delta is not None else defaults.delta,
        budget_epsilon=args.dp_budget,
        accountant=accountant,
        mode=args.dp_mode or defaults.mode,
    )
