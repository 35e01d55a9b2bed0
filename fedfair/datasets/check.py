"""`fedfair data check`: a table against the plan's [schema], every problem at once, with the schema edits.

An institution runs it before its collaborator ever dials: it reads only the plan file (or
the manifest that pins it) and the table, so the aggregator need not be up. What it reports
is what the collaborator would refuse (:func:`fedfair.datasets.values.check_table`'s
problems), and beside each kind of problem the edit to the [schema] that would accept the
table, to weigh against fixing the table instead: more categories, ``missing = "impute"``,
another type, a larger ``max_abs``, more classes. An edited schema changes the plan, which
every institution must then pin again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedfair.core.errors import ConfigError
from fedfair.core.tables import closest, parse_json_object, read_toml
from fedfair.datasets.agreement import batch_shortfall, proposed_mapping, site_problems, site_warnings, training_rows
from fedfair.datasets.schema import FLOAT_EXACT_BITS, LEARN, Schema, several_spellings, toml_value
from fedfair.datasets.suspects import Dialect, id_like_columns, near_match, spellings
from fedfair.datasets.tabular import as_text, is_numeric
from fedfair.datasets.values import table_problems


@dataclass(frozen=True)
class TableCheck:
    """What ``fedfair data check`` found: the collaborator's refusals and the [schema] edits that avoid them."""

    source: str
    rows: int
    problems: tuple[str, ...]
    edits: tuple[str, ...]
    imputed: tuple[str, ...] = ()
    """Under ``missing = "impute"``: each column with empty cells and their count, e.g. "hours (179)"."""
    dialect: str = ""
    """How the CSV was read when that is not plain comma-separated UTF-8, e.g. "';'-separated, cp1252 text"."""
    ignored: tuple[str, ...] = ()
    """Table columns the [schema] does not name (the model never sees them), each with "(ID-like: why)" if so."""
    identifiers: tuple[str, ...] = ()
    """[schema] feature columns that look like row identifiers, each with why."""
    pinned: bool = True
    """Whether the schema came from a manifest (an edit then needs a new pin) or from a plan not yet pinned."""
    spellings: tuple[str, ...] = ()
    """Label or category values written several ways (case, surrounding spaces), a line a column."""
    warnings: tuple[str, ...] = ()
    """What the table may legitimately hold but the operator should know (a label of one class only)."""

    def render(self) -> str:
        """The check as the operator reads it: that the table fits, or each problem and its fix."""
        lines = []
        if not self.problems:
            fits = f"{self.source} fits the plan's [schema]: {self.rows:,} rows, every column and value accepted"
            lines.append(fits + (f"; empty cells to be imputed: {', '.join(self.imputed)}" if self.imputed else ""))
        else:
            count = len(self.problems)
            noun = "problem" if count == 1 else "problems"
            lines.append(f"{self.source} does not fit the plan's [schema] ({count} {noun}, {self.rows:,} rows):")
            lines += [f"  {number}. {problem}" for number, problem in enumerate(self.problems, start=1)]
            if any(" at line" in problem for problem in self.problems):
                lines.append("  (line numbers are the file's, the header being line 1)")
        lines += [f"Warning: {warning}" for warning in self.warnings]
        if self.dialect:
            lines.append(f"Read as {self.dialect} (detected).")
        if self.spellings:
            lines.append(
                "Written several ways (only case or surrounding spaces differ): make each one spelling in the "
                "table (trim spaces, one case) rather than listing every spelling in the [schema]:"
            )
            lines += [f"  {line}" for line in self.spellings]
        if self.identifiers:
            lines.append(
                f"ID-like columns the [schema] uses as features: {', '.join(self.identifiers)}. A model learns "
                "nothing general from an identifier, and it can help re-identify people: remove their "
                "[[schema.columns]] entries."
            )
        if self.ignored:
            lines.append(f"Not in the [schema], so never used: {', '.join(self.ignored)}.")
        if self.problems and self.edits:
            then = (
                "then pin the plan again: `fedfair plan pin`, and `fedfair plan diff OLD NEW` for every institution "
                "to review"
                if self.pinned
                else "before the plan is pinned, so no new pin is needed"
            )
            lines.append(f"Either fix the table, or edit the plan's [schema] ({then}):")
            lines += [f"  {edit}" for edit in self.edits]
        return "\n".join(lines)


def pins_plan(path: Path) -> bool:
    """Whether `path` is a manifest pinning a plan (its [schema] is agreed) rather than a plan file."""
    try:
        _, document = read_toml(path)
    except ConfigError:
        return False
    return "schema" not in document and isinstance(document.get("plan"), Mapping)


def pinned_settings(path: Path) -> str:
    """The plan settings a manifest pins (its ``[plan] settings``, JSON), or a ConfigError naming the fix."""
    _, document = read_toml(path)
    pinned = document.get("plan")
    if not (isinstance(pinned, Mapping) and isinstance(pinned.get("settings"), str)):
        raise ConfigError(f"{path} pins no plan settings ([plan] settings); pin the plan again")
    return str(pinned["settings"])


def schema_from_file(path: Path) -> Schema:
    """The [schema] of a plan file, or of the plan a manifest pins (its ``[plan] settings``)."""
    _, document = read_toml(path)
    section: Any = document.get("schema")
    if section is None and pins_plan(path):
        section = parse_json_object(pinned_settings(path), f"{path} [plan] settings", "pin the plan again").get(
            "schema"
        )
    if section is None:
        raise ConfigError(
            f"{path} has no [schema]: the plan reads the built-in dataset, so there is no table to check; "
            "draft one with `fedfair data schema --csv TABLE --label COLUMN`"
        )
    return Schema.from_mapping(section, str(path))


def check_against(
    schema: Schema,
    table: pd.DataFrame,
    source: str,
    *,
    pinned: bool = True,
    batch_fraction: float | None = None,
    test_fraction: float | None = None,
) -> TableCheck:
    """Every problem of ``table`` under ``schema``, with the schema edits that would accept it.

    Also the table as a whole (:mod:`fedfair.datasets.agreement`): a feature column empty in every row,
    and, given the plan's ``batch_fraction`` and this site's ``test_fraction``, too few rows for its
    batch (problems); a label of one class (a warning). And what the model will not use (columns
    outside the schema) or should not (ID-like feature columns).
    """
    dialect = table.attrs.get("dialect")
    read_as = dialect.describe() if isinstance(dialect, Dialect) and dialect != Dialect() else ""
    problems = [*table_problems(schema, table, source), *site_problems(schema, table)]
    if batch_fraction is not None and test_fraction is not None:
        short = batch_shortfall(training_rows(len(table), test_fraction), batch_fraction, test_fraction)
        problems += [short] if short else []
    named = table.rename(columns=str)
    used = {schema.label, *(column.name for column in schema.columns)}
    outside = [str(name) for name in named.columns if str(name) not in used]
    features = [column.name for column in schema.columns if column.name in named.columns]
    outside_ids = id_like_columns(named, outside)
    return TableCheck(
        source,
        len(table),
        tuple(problems),
        tuple(schema_edits(schema, table)),
        _imputed(schema, table),
        read_as,
        tuple(name + (f" (ID-like: {outside_ids[name]})" if name in outside_ids else "") for name in outside),
        tuple(f"{name} ({why})" for name, why in id_like_columns(named, features).items()),
        pinned,
        tuple(several_spellings(table, schema)),
        tuple(site_warnings(schema, table)),
    )


def _imputed(schema: Schema, table: pd.DataFrame) -> tuple[str, ...]:
    if schema.missing != "impute":
        return ()
    table = table.rename(columns=str)
    counts = [(column.name, int(table[column.name].isna().sum())) for column in schema.columns if column.name in table]
    return tuple(f"{name} ({count:,})" for name, count in counts if count)


def schema_edits(schema: Schema, table: pd.DataFrame) -> list[str]:
    """The [schema] lines that would accept ``table``, one per column that needs one (plus ``missing``)."""
    table = table.rename(columns=str)
    present = [str(name) for name in table.columns]
    edits: list[str] = []
    gaps: list[str] = []
    if schema.label in present:
        labels = as_text(table[schema.label])
        extra = (
            [] if _recoded_instead(labels, schema.classes, certain_only=False) else _unlisted(labels, schema.classes)
        )
        if extra:
            edits.append(f"classes = {toml_value([*schema.classes, *extra])}")
    for column in schema.columns:
        where = f'[[schema.columns]] name = "{column.name}":'
        if column.name not in present:
            close = closest(column.name, present)
            edits.append(f'{where} name = "{close}" (the table\'s name)' if close else f"{where} remove the entry")
            continue
        series = table[column.name]
        missing = int(series.isna().sum())
        if missing:
            gaps.append(f"{column.name} ({missing:,})")
        if column.kind == "categorical":
            cells, categories = as_text(series), column.categories
            recode = categories is None or _recoded_instead(cells, categories, certain_only=True)
            extra = [] if recode else _unlisted(cells, categories)
            if extra:
                edits.append(f'{where} categories = {toml_value([*(categories or ()), *extra])} (or "{LEARN}")')
            continue
        numbers = series if is_numeric(series) else pd.to_numeric(series, errors="coerce")
        text = int(numbers.isna().sum()) - missing
        if text:
            # Only when most values are text: a few words among numbers are cells to fix, not a new type.
            if text > len(series) - missing - text:
                edits.append(f'{where} type = "categorical"')
            continue
        largest = float(np.nanmax(np.abs(numbers.to_numpy(dtype=np.float64)))) if len(numbers.dropna()) else 0.0
        if largest > schema.max_abs:
            bound = 10.0 ** math.ceil(math.log10(largest))
            bits = min(schema.fraction_bits, FLOAT_EXACT_BITS - math.ceil(math.log2(bound)))
            edits.append(f"max_abs = {bound:g}" + (f", fraction_bits = {bits}" if bits != schema.fraction_bits else ""))
    if gaps and schema.missing == "refuse":
        edits.append(f'missing = "impute" (missing cells: {", ".join(gaps)})')
    return edits


def _recoded_instead(values: np.ndarray, listed: tuple[str, ...], *, certain_only: bool) -> bool:
    """Whether the column is another coding of `listed`: no value in common, and a mapping seen.

    Its fix is the site's [data.recode], never a list holding both codings
    (:func:`fedfair.datasets.agreement.proposed_mapping`; `certain_only` for a category column).
    """
    held = sorted({str(value) for value in values if value is not None})
    if not held or not set(held).isdisjoint(listed):
        return False
    proposal = proposed_mapping(held, listed)
    return proposal is not None and (proposal[1] or not certain_only)


def _unlisted(values: np.ndarray, listed: tuple[str, ...] | None) -> list[str]:
    """The distinct non-missing values (as text) not in ``listed``, most frequent first.

    Misspellings of a listed value (:func:`near_match`) and other spellings of one value
    (:func:`spellings`: case, surrounding spaces) are left out: their fix is the cell, never a
    near-duplicate class or category.
    """
    known = set(listed or ()) | {other for others in spellings(list(values)).values() for other in others}
    counts = pd.Series(values, dtype=object).dropna().value_counts()
    rows = {str(value): int(count) for value, count in counts.items()}
    return [
        str(value)
        for value in counts.index
        if str(value) not in known and near_match(str(value), tuple(listed or ()), rows) is None
    ]
