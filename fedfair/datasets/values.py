"""A site's table read under the federation's schema: checked, then each column's values.

:func:`check_table` refuses a table that does not fit the schema, naming the column and
the fix; the statistics and the encoder read the same values through
:func:`named_columns`, :func:`column_values` and :func:`label_codes`, so a table that
passes the check is read the same way everywhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import partial

import numpy as np
import pandas as pd

from fedfair.core.errors import ConfigError
from fedfair.core.tables import closest, shown
from fedfair.datasets.agreement import coding_advice
from fedfair.datasets.schema import FLOAT_EXACT_BITS, LEARN, Column, Schema
from fedfair.datasets.suspects import at_rows, near_match, offenders
from fedfair.datasets.tabular import as_text, is_numeric

# Checking and reading a site's table


def check_table(schema: Schema, table: pd.DataFrame, source: str, *, label_required: bool = True) -> None:
    """Refuse a table that does not fit the schema, naming every problem at once.

    Each column, its offending values with their counts, and the fix, so that one run shows everything to
    correct.

    Checks: every schema column (and the label, unless ``label_required`` is False, as
    for prediction) is present; numeric columns hold numbers within ``max_abs``; listed
    categorical columns hold only their categories; label values are among the
    classes; no cell is missing under ``missing = "refuse"``. Extra columns are ignored.
    """
    problems = table_problems(schema, table, source, label_required=label_required)
    if len(problems) == 1:
        # A missing column reads "TABLE has no column ...", every other problem "TABLE: column ...".
        raise ConfigError(f"{source} {problems[0]}" if problems[0].startswith("has ") else f"{source}: {problems[0]}")
    if problems:
        listed = "; ".join(f"({number}) {problem}" for number, problem in enumerate(problems, start=1))
        raise ConfigError(f"{source} does not fit the plan's [schema] in {len(problems)} ways: {listed}")


def table_problems(schema: Schema, table: pd.DataFrame, source: str, *, label_required: bool = True) -> list[str]:
    """:func:`check_table`'s problems, each one line without the table's name.

    Missing columns first, then every present column's own (a table without rows, or with a column twice, is one
    problem).
    """
    problems: list[str] = []
    try:
        table = named_columns(schema, table, source, label_required)
    except ConfigError as error:
        if len(table) == 0 or "twice" in str(error):
            return [str(error).removeprefix(f"{source} ")]
        problems.append(str(error).removeprefix(f"{source} "))
        table = table.rename(columns=str)
    if schema.label in table.columns:
        _collect(problems, source, lambda: label_codes(schema, table[schema.label], source))
    for column in schema.columns:
        if column.name in table.columns:
            _collect(problems, source, partial(column_values, schema, column, table[column.name], source))
    return problems


def _collect(problems: list[str], source: str, check: Callable[[], object]) -> None:
    """Run one column's check, keeping its refusal (without the table's name) instead of stopping."""
    try:
        check()
    except ConfigError as error:
        problems.append(str(error).removeprefix(f"{source}: "))


def named_columns(schema: Schema, table: pd.DataFrame, source: str, label_required: bool) -> pd.DataFrame:
    """The table with text column names, once it has rows and every column the schema needs.

    ``label_required`` says whether the schema's label column is needed too.

    Raises:
        ConfigError: naming ``source``, for a table without rows, a needed column given twice, or
            missing columns (all named at once, each with its closest match).
    """
    if len(table) == 0:
        raise ConfigError(f"{source} has no data rows; give the table at least one row")
    table = table.rename(columns=str)
    present = list(table.columns)
    needed = ([schema.label] if label_required else []) + [column.name for column in schema.columns]
    for name in needed:
        if present.count(name) > 1:
            raise ConfigError(f"{source} has the column {name!r} twice; keep one")
    missing = [name for name in needed if name not in present]
    if len(missing) == 1:
        name = missing[0]
        close = closest(name, present)
        hint = f"did you mean {close!r}? " if close else ""
        role = "label column" if name == schema.label else "column"
        raise ConfigError(
            f"{source} has no {role} {name!r}, which the plan's [schema] requires; {hint}"
            f"rename that column in the table, or fix the [schema] (table columns: {', '.join(present[:30])})"
        )
    if missing:
        described = []
        for name in missing:
            close = closest(name, present)
            role = "label column" if name == schema.label else "column"
            described.append(f"{role} {name!r}" + (f" (did you mean {close!r}?)" if close else ""))
        raise ConfigError(
            f"{source} has no {', '.join(described)}, which the plan's [schema] requires; rename those "
            f"columns in the table, or fix the [schema] (table columns: {', '.join(present[:30])})"
        )
    return table


def column_values(schema: Schema, column: Column, series: pd.Series, source: str) -> np.ndarray:
    """Numbers (float64, NaN where missing) or category codes (int64: listed index, bucket, -1 where missing)."""
    if column.kind == "numeric":
        return _numbers(schema, column.name, series, source)
    text = as_text(series)
    missing = pd.isna(text)
    _check_missing(schema, column.name, missing, source)
    if column.categories is None:
        values = pd.unique(text[~missing])
        # The -1 appended last is what a missing cell's position (-1) picks.
        buckets = np.array(
            [category_bucket(column.name, value, schema.hash_buckets) for value in values] + [-1], dtype=np.int64
        )
        bucket_codes: np.ndarray = buckets[pd.Index(values).get_indexer(text)]
        return bucket_codes
    codes: np.ndarray = pd.Index(column.categories).get_indexer(text)
    unknown = (codes < 0) & ~missing
    if unknown.any() and not (codes >= 0).any():
        advice = _another_coding(column.name, text[~missing], column.categories, certain_only=True)
        if advice:
            raise ConfigError(f"{source}: column {column.name!r} {advice}")
    if unknown.any():
        typos = _typos(text, unknown, column.categories)
        if typos:
            raise ConfigError(f"{source}: column {column.name!r} has {typos}")
        raise ConfigError(
            f"{source}: column {column.name!r} has values not among its [schema] categories: "
            f"{offenders(text, unknown)}; fix those cells, add the values to its categories, "
            f'or set categories = "{LEARN}"'
        )
    return codes


def _numbers(schema: Schema, name: str, series: pd.Series, source: str) -> np.ndarray:
    if pd.api.types.is_bool_dtype(series):
        series = series.astype(np.float64)
    converted = pd.to_numeric(series, errors="coerce") if not is_numeric(series) else series
    values: np.ndarray = converted.to_numpy(dtype=np.float64, na_value=np.nan)
    text = np.isnan(values) & series.notna().to_numpy()
    if text.any():
        numbers = int((~np.isnan(values)).sum())
        # A type change is suggested only where most values fit it: a stray word among numbers is a typo.
        fix = (
            f"fix those cells (the other {numbers:,} values are numbers)"
            if numbers > int(text.sum())
            else 'fix those cells, or declare the column type = "categorical"'
        )
        raise ConfigError(
            f"{source}: column {name!r} is numeric in the plan's [schema] but holds text: "
            f"{offenders(series.to_numpy(dtype=object), text)}; {fix}"
        )
    _check_missing(schema, name, np.isnan(values), source)
    finite = values[~np.isnan(values)]
    if finite.size and not (np.all(np.isfinite(finite)) and np.abs(finite).max() <= schema.max_abs):
        largest = float(np.abs(finite).max())
        raise ConfigError(
            f"{source}: column {name!r} has a value of absolute size {largest:g}, above the [schema] max_abs = "
            f"{schema.max_abs:g}; rescale the column (e.g. to thousands) or raise max_abs (lowering fraction_bits "
            f"so that max_abs * 2^fraction_bits <= 2^{FLOAT_EXACT_BITS})"
        )
    return values


def _check_missing(schema: Schema, name: str, missing: np.ndarray, source: str) -> None:
    if schema.missing == "refuse" and missing.any():
        where = at_rows(np.flatnonzero(missing))
        raise ConfigError(
            f"{source}: column {name!r} has {int(missing.sum()):,} missing values ({where}) and the plan's "
            '[schema] says missing = "refuse"; fill or drop those rows, or set missing = "impute"'
        )


def label_codes(schema: Schema, series: pd.Series, source: str) -> np.ndarray:
    """Class indices (into ``schema.classes``) of a label column; every value must be a listed class."""
    text = as_text(series)
    missing = pd.isna(text)
    if missing.any():
        raise ConfigError(
            f"{source}: label column {schema.label!r} has {int(missing.sum()):,} missing values; drop those rows"
        )
    codes: np.ndarray = pd.Index(schema.classes).get_indexer(text)
    if (codes < 0).all():
        advice = _another_coding(schema.label, text, schema.classes, certain_only=False)
        if advice:
            raise ConfigError(f"{source}: label column {schema.label!r} {advice}")
    if (codes < 0).any():
        typos = _typos(text, codes < 0, schema.classes)
        if typos:
            raise ConfigError(f"{source}: label column {schema.label!r} has {typos}")
        raise ConfigError(
            f"{source}: label column {schema.label!r} has values not among the [schema] classes "
            f"{shown(list(schema.classes))}: {offenders(text, codes < 0)}; fix those cells or add them to classes"
        )
    return codes


def _another_coding(column: str, text: np.ndarray, listed: tuple[str, ...], *, certain_only: bool) -> str:
    """When a column shares no value with the plan's list: its coding beside the plan's and the mapping; else "".

    (:func:`fedfair.datasets.agreement.coding_advice`; `certain_only` for a category column, whose values
    may be new places rather than new spellings.)
    """
    present = sorted({str(value) for value in text if value is not None})
    advice = coding_advice(column, present, listed, certain_only=certain_only)
    if advice is None:
        return ""
    return (
        f"writes {', '.join(map(repr, present))} where the plan's [schema] says {shown(list(listed))}: the same "
        f"values in another coding; {advice}"
    )


def _typos(text: np.ndarray, unknown: np.ndarray, listed: tuple[str, ...]) -> str:
    """The problem's text naming each misspelt value with its match and lines; "" unless all are misspelt.

    Misspelt means every unlisted value is a near match of a listed one (:func:`near_match`);
    otherwise the values are new, not misspelt, and the text is "".
    """
    present = pd.Series(text, dtype=object).dropna().value_counts()
    counts = {str(value): int(count) for value, count in present.items()}
    offending = pd.Series(text[unknown], index=np.flatnonzero(unknown), dtype=object)
    matches = {str(value): near_match(str(value), listed, counts) for value in offending.unique()}
    if not matches or None in matches.values():
        return ""
    fixes = [
        f"{value!r} where {match!r} is meant ({counts[value]:,} row{'s' if counts[value] != 1 else ''} "
        f"{at_rows(offending.index[offending == value])})"
        for value, match in matches.items()
    ]
    return f"{', '.join(fixes)}: misspellings of listed values; correct those cells in the table"


def category_bucket(column: str, value: str, buckets: int) -> int:
    """The hash bucket of a learnt column's value: SHA-256 of (column, value), so every site agrees without names."""
    digest = hashlib.sha256(json.dumps([column, value], ensure_ascii=False).encode()).digest()
    return int.from_bytes(digest[:8], "big") % buckets
