"""`fedfair evaluate --composition COLUMN[,COLUMN]`: who is in a bundle's worst-off group on a table.

Cells are listed in each column's own order: numbers by value, the label by class, text
alphabetically, ``<missing>`` last.

Why: docs/design.md, "Inside the model bundle".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from fedfair.core.errors import ConfigError
from fedfair.core.tables import closest
from fedfair.datasets.schema import MISSING_LEVEL, Schema
from fedfair.datasets.tabular import MAX_CATEGORIES, as_text, is_numeric
from fedfair.datasets.values import label_codes
from fedfair.fairness.composition import CellShare, composition, format_composition, worst_fraction_weights

MAX_NUMERIC_VALUES = 20
"""A numeric column with more distinct values than this is a quantity, not a group: it is refused."""
MAX_TEXT_VALUES = MAX_CATEGORIES
"""A text column with more distinct values than this is an identifier or free text: it is refused."""


def composition_columns(spec: str) -> list[str]:
    """The column names of ``--composition race,income``: split at commas, outer spaces stripped.

    Raises:
        ConfigError: an empty name (``race,,income``) or a name given twice.
    """
    names = [name.strip() for name in spec.split(",")]
    if not all(names):
        raise ConfigError(
            f"--composition {spec!r} has an empty column name; separate names with single commas, "
            "e.g. --composition race,income"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"--composition names {', '.join(map(repr, repeated))} twice; name each column once")
    return names


def composition_values(
    table: pd.DataFrame, columns: Sequence[str], schema: Schema, source: str
) -> tuple[dict[str, np.ndarray], dict[str, list[str]]]:
    """Each named column's value per row as text (one per table row, in order), and its values in display order.

    ``table`` is the raw table the evaluation scored (column names are read as text, as the
    encoder reads them). The label column gives class names; a missing cell gives ``<missing>``.
    Raises ConfigError naming every column the table lacks (with the table's columns and the
    fix), and for a column with too many distinct values to be a group.
    """
    table = table.rename(columns=str)
    present = [str(name) for name in table.columns]
    unknown = [name for name in columns if name not in present]
    if unknown:
        hints = [f" (did you mean {close!r}?)" if (close := closest(name, present)) else "" for name in unknown]
        named = ", ".join(f"{name!r}{hint}" for name, hint in zip(unknown, hints, strict=True))
        listed = ", ".join(present[:40]) + (f", ... ({len(present)} columns)" if len(present) > 40 else "")
        raise ConfigError(
            f"{source} has no column{'s' if len(unknown) > 1 else ''} {named} to describe the worst group by; "
            f"name columns of the table in --composition (names are case-sensitive; table columns: {listed})"
        )
    values: dict[str, np.ndarray] = {}
    orders: dict[str, list[str]] = {}
    for name in columns:
        values[name], orders[name] = _column(table, name, schema, source)
    return values, orders


def _column(table: pd.DataFrame, name: str, schema: Schema, source: str) -> tuple[np.ndarray, list[str]]:
    series = table[name]
    if isinstance(series, pd.DataFrame):
        raise ConfigError(f"{source} has the column {name!r} twice; keep one")
    if name == schema.label:
        classes = list(schema.classes)
        return np.asarray(classes, dtype=object)[label_codes(schema, series, source)], classes
    numeric = is_numeric(series)
    distinct = pd.unique(series.dropna())
    limit = MAX_NUMERIC_VALUES if numeric else MAX_TEXT_VALUES
    if len(distinct) > limit:
        fix = (
            f"it does not bin numbers: the bands are yours to choose; add a column of bands to the table, e.g. "
            f"{name}_band with values such as '<30', '30-49', '50+'"
            if numeric
            else f"add a column to the table that groups its values into fewer, e.g. {name}_group"
        )
        raise ConfigError(
            f"{source}: column {name!r} is {'numeric' if numeric else 'text'} with {len(distinct):,} distinct "
            f"values, more than the {limit} --composition lists as cells ({fix}), and name that instead "
            "(columns the model does not use are ignored by the evaluation)"
        )
    text = as_text(series)
    missing = pd.isna(text)
    # Each shown value with the value it shows, so numbers are ordered as numbers (9 before 10).
    shown = dict(zip(text[~missing], series.to_numpy()[~missing]))
    order = sorted(shown, key=shown.__getitem__) if numeric else sorted(shown)
    text[missing] = MISSING_LEVEL
    return text, order + ([MISSING_LEVEL] if missing.any() else [])


def worst_group_composition(
    losses: np.ndarray, rho: float, table: pd.DataFrame, columns: Sequence[str], schema: Schema, source: str
) -> list[CellShare]:
    """Every cell of ``columns``' cross product present in ``table``: its share of the worst group and of all rows.

    The worst group is the worst ``rho``-fraction of rows by loss (:func:`worst_fraction_weights`).
    ``losses`` are the per-sample losses of ``table``'s rows, in order (what the evaluation
    computed on it). Cells come in each column's display order (see the module's docstring);
    each share column sums to 1.

    Raises:
        ConfigError: an unknown or ungroupable column, or losses that do not number the table's rows.
    """
    if len(losses) != len(table):
        raise ConfigError(
            f"{len(losses):,} losses for the {len(table):,} rows of {source}: the losses must be the evaluation "
            "of this table's rows, in order"
        )
    values, orders = composition_values(table, columns, schema, source)
    shares = composition(worst_fraction_weights(losses, rho), values)
    return sorted(shares, key=lambda share: _position(share.cell, columns, orders))


def _position(cell: tuple[str, ...], columns: Sequence[str], orders: Mapping[str, list[str]]) -> tuple[int, ...]:
    return tuple(orders[column].index(value) for column, value in zip(columns, cell, strict=True))


def composition_title(rho: float, rows: int, columns: Sequence[str]) -> str:
    """The text table's title: which rows the worst group is and the columns it is described by."""
    size = f"{rho * rows:,.1f}".removesuffix(".0")
    described = " x ".join(columns)
    return f"worst-off group: the worst {100 * rho:g}% of rows by loss ({size} of {rows:,} rows), by {described}"


def composition_text(shares: Sequence[CellShare], columns: Sequence[str], rho: float, rows: int) -> str:
    """The plain-text table ``fedfair evaluate --composition`` prints: one line per cell, each once."""
    return format_composition(shares, columns, composition_title(rho, rows, columns))


def composition_json(shares: Sequence[CellShare], columns: Sequence[str], rho: float, rows: int) -> dict[str, object]:
    """The ``composition`` entry of ``fedfair evaluate --json``.

    The columns, the worst group's size in rows (rho x rows, fractional at the boundary) and one object per
    cell.
    """
    return {
        "columns": list(columns),
        "rho": rho,
        "worst_rows": rho * rows,
        "cells": [share.to_dict(columns) for share in shares],
    }
