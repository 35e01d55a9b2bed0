"""``fedfair predict``: each row of a table predicted with a model bundle (:mod:`fedfair.bundle.commands`).

This module imports neither PyTorch nor pandas: the handlers import the bundle's modules when a
command runs, so ``fedfair predict --help`` answers at once.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write


MODEL_HELP = "model bundle file written by the aggregator (and sent to every collaborator that finished)"
DATA_HELP = "CSV or Parquet table with the federation schema's feature columns"
ALLOW_HELP = (
    "a model factory 'package.module:function' you trust to be imported and called with the bundle's "
    "arguments; needed for a bundle whose model a factory builds, repeat it for several (default: none)"
)
"""The help of the options `fedfair predict` and `fedfair evaluate` share."""


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair predict`."""
    predicting = subparsers.add_parser("predict", help="predict each row of a table with a model bundle")
    predicting.add_argument("--model", type=Path, required=True, help=MODEL_HELP)
    predicting.add_argument("--data", type=Path, required=True, help=DATA_HELP)
    predicting.add_argument(
        "--out", type=Path, required=True,
        help="CSV to write: the predicted class and each class's probability, one line per input row, in order",
    )  # fmt: skip
    predicting.add_argument(
        "--keep", action="append", default=[], metavar="COLUMN",
        help="copy this column of the table (an id, say) into the predictions, first, as it is; repeat it or "
        "give A,B for several (default: none)",
    )  # fmt: skip
    predicting.add_argument("--allow-factory", action="append", default=[], metavar="NAME", help=ALLOW_HELP)
    predicting.set_defaults(handler=_predict)


def kept_columns(flags: list[str], present: list[str]) -> list[str]:
    """The columns ``--keep`` names (repeated or comma-separated), each once, in order.

    Raises:
        ConfigError: naming the closest column, for a name not among ``present`` (the table's columns).
    """
    from fedfair.core.tables import closest

    names = list(dict.fromkeys(name.strip() for flag in flags for name in flag.split(",") if name.strip()))
    for name in names:
        if name not in present:
            close = closest(name, present)
            hint = f"did you mean {close!r}? " if close is not None else ""
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
