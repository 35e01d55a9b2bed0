"""The command lines of `fedfair predict` and `fedfair evaluate` (their work is :mod:`fedfair.bundle.commands`).

This module imports neither PyTorch nor pandas: the handlers import the bundle's modules when a
command runs, so ``fedfair predict --help`` answers at once.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair predict` and `fedfair evaluate`."""
    model_help = "model bundle file written by the aggregator (and sent to every collaborator that finished)"
    data_help = "CSV or Parquet table with the federation schema's feature columns"
    allow_help = (
        "a model factory 'package.module:function' you trust to be imported and called with the bundle's "
        "arguments; needed for a bundle whose model a factory builds, repeat it for several (default: none)"
    )

    predicting = subparsers.add_parser("predict", help="predict each row of a table with a model bundle")
    predicting.add_argument("--model", type=Path, required=True, help=model_help)
    predicting.add_argument("--data", type=Path, required=True, help=data_help)
    predicting.add_argument(
        "--out", type=Path, required=True,
        help="CSV to write: the predicted class and each class's probability, one line per input row, in order",
    )  # fmt: skip
    predicting.add_argument(
        "--keep", action="append", default=[], metavar="COLUMN",
        help="copy this column of the table (an id, say) into the predictions, first, as it is; repeat it or "
        "give A,B for several (default: none)",
    )  # fmt: skip
    predicting.add_argument("--allow-factory", action="append", default=[], metavar="NAME", help=allow_help)
    predicting.set_defaults(handler=_predict)

    evaluating = subparsers.add_parser(
        "evaluate", help="group risks of a model bundle on a labelled table: worst rho-fraction, mean, disparity"
    )
    evaluating.add_argument("--model", type=Path, required=True, help=model_help)
    evaluating.add_argument("--data", type=Path, required=True, help=data_help + " and the label column")
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
    evaluating.add_argument("--allow-factory", action="append", default=[], metavar="NAME", help=allow_help)
    evaluating.set_defaults(handler=_evaluate)


def kept_columns(flags: list[str], present: list[str]) -> list[str]:
    """The columns ``--keep`` names (repeated or comma-separated), each once, in order.

    ConfigError naming the closest column for one the table lacks.
    """
    import difflib

    names = list(dict.fromkeys(name.strip() for flag in flags for name in flag.split(",") if name.strip()))
    for name in names:
        if name not in present:
            close = difflib.get_close_matches(name, present, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"--keep {name}: the table has no such column; {hint}keep one of: {', '.join(present[:30])}"
            )
    return names


def _predict(args: argparse.Namespace) -> int:
    from fedfair.bundle.commands import allowed_bundle, predictions
    from fedfair.datasets.tabular import read_table

    bundle = allowed_bundle(args.model, args.allow_factory)
    table = read_table(args.data).rename(columns=str)
    keep = kept_columns(args.keep, list(table.columns))
    frame = predictions(bundle, table, str(args.data), allowed=args.allow_factory)
    taken = [name for name in keep if name in frame.columns]
    if taken:
        raise ConfigError(f"--keep {', '.join(taken)}: the predictions have a column of that name; keep another")
    if keep:
        frame = table[keep].reset_index(drop=True).join(frame)
    atomic_write(args.out, lambda stream: frame.to_csv(stream, index=False))
    print(f"wrote {len(frame)} predictions to {args.out}")
    return 0


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
