"""``fedfair reference``: the centralized optimum the federation must reach (:mod:`fedfair.research.reference`).

The flags come from :mod:`fedfair.research.arguments` (no PyTorch); the solver is imported when the
command runs, so ``fedfair reference --help`` answers at once.
"""

from __future__ import annotations

import argparse

from fedfair.research.arguments import add_experiment_arguments


def _reference_command(args: argparse.Namespace) -> int:
    from fedfair.research.experiment import load_federation, reference
    from fedfair.research.flags import config_from_args, format_report, write_json

    config = config_from_args(args)
    result = reference(config, load_federation(config))
    print(format_report({**result, "config": {**result["config"], "method": "reference"}}))
    write_json(args.json, result)
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair reference`, taking the experiment flags but those of federated training."""
    reference_parser = subparsers.add_parser(
        "reference",
        help="the centralized optimum the federation must reach",
        description="The centralized optimum the federation must reach: L-BFGS-B on the pooled training data. "
        "It trains nothing federated, so it takes no rounds, step sizes, --secure-aggregation or --dp-* flags.",
    )
    add_experiment_arguments(reference_parser, federated=False)
    reference_parser.set_defaults(handler=_reference_command)
