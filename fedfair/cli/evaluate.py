"""``fedfair evaluate``: the group risks of a model bundle on a labelled table (:mod:`fedfair.bundle.commands`).

Imports neither PyTorch nor pandas until the command runs, so ``fedfair evaluate --help`` answers at once.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedfair.cli.predict import ALLOW_HELP, DATA_HELP, MODEL_HELP


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair evaluate`."""
    evaluating = subparsers.add_parser(
        "evaluate", help="group risks of a model bundle on a labelled table: worst rho-fraction, mean, disparity"
    )
    evaluating.add_argument("--model", type=Path, required=True, help=MODEL_HELP)
    evaluating.add_argument("--data", type=Path, required=True, help=DATA_HELP + " and the label column")
    evaluating.add_argument(
        "--rho", type=float, default=None,
        help="protected group fraction in (0, 1] (default: the rho of the plan the model was trained with)",
    )  # fmt: skip
    evaluating.add_argument(
        "--composition", metavar="COLUMN[,COLUMN]", default=None,
        help="also list who is in the worst rho-fraction of rows: each cell of these table columns (any column, "
        "the label included) with its share of the worst group beside its share of the table, e.g. race,income",
    )  # fmt: skip
    evaluating.add_argument("--json", action="store_true", help="print the report as one JSON object")
    evaluating.add_argument("--allow-factory", action="append", default=[], metavar="NAME", help=ALLOW_HELP)
    evaluating.set_defaults(handler=_evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    from fedfair.bundle.commands import allowed_bundle, evaluate_composition, evaluate_table
    from fedfair.bundle.composition import composition_columns, composition_json, composition_text
    from fedfair.datasets.tabular import read_table
    from fedfair.fairness.composition import CellShare

    columns = composition_columns(args.composition) if args.composition is not None else None
    bundle = allowed_bundle(args.model, args.allow_factory)
    table = read_table(args.data)
    source = str(args.data)
    shares: list[CellShare] = []
    if columns is None:
        report = evaluate_table(bundle, table, source, args.rho, allowed=args.allow_factory)
    else:
        report, shares = evaluate_composition(bundle, table, source, columns, args.rho, allowed=args.allow_factory)
    if args.json:
        extra = {} if columns is None else {"composition": composition_json(shares, columns, report.rho, len(table))}
        print(json.dumps({"rows": len(table), **report.to_dict(), **extra}))
        return 0
    print(f"{len(table)} rows of {args.data}, rho = {report.rho:g}")
    print(f"  worst-group risk  {report.worst_risk:.6f}  (mean loss of the worst {report.rho:.0%} of rows)")
    print(f"  mean risk         {report.mean_risk:.6f}")
    print(f"  disparity         {report.disparity:.6f}  (worst {report.rho:.0%} minus the other rows' risk)")
    print(f"  worst minus best  {report.worst_minus_best:.6f}  (worst minus best {report.rho:.0%} of rows)")
    print(f"  accuracy          {report.accuracy:.6f}")
    if columns is not None:
        print()
        print(composition_text(shares, columns, report.rho, len(table)))
    return 0
