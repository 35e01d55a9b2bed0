"""A federation's table schema: the label, the feature columns in model order, how to treat gaps.

Every site must turn its own table into the same feature vector: the same columns in
the same order, the same one-hot levels (even for a category it never saw), and the
same scaling. The plan's ``[schema]`` (:class:`Schema`) fixes the first two; the scaling
comes from statistics of all sites together (:mod:`fedfair.datasets.statistics`), which
every site turns into the same :class:`~fedfair.datasets.encoder.Encoder`. A site checks
its table against the schema with :func:`fedfair.datasets.values.check_table`;
:func:`draft_schema` writes a first schema from one table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import pandas as pd

from fedfair.core.errors import ConfigError
from fedfair.core.tables import Table, finite_number, shown
from fedfair.datasets.suspects import holds_two_codings, offenders, text_cells
from fedfair.datasets.tabular import MAX_CATEGORIES, as_text, is_numeric

ColumnKind = Literal["numeric", "categorical"]
MissingPolicy = Literal["refuse", "impute"]
COLUMN_KINDS: tuple[ColumnKind, ...] = ("numeric", "categorical")
MISSING_POLICIES: tuple[MissingPolicy, ...] = ("refuse", "impute")

LEARN = "learn"
"""Spelling of ``categories`` in the plan for a column whose categories are learnt from hash-bucket counts."""

DEFAULT_MAX_ABS = 1e9
DEFAULT_FRACTION_BITS = 20
DEFAULT_HASH_BUCKETS = 1024
DEFAULT_MIN_CATEGORY_COUNT = 10
MAX_CATEGORY_COUNT = 2**40
"""The largest min_category_count: the rows one site may hold (fedfair.datasets.statistics.MAX_SITE_ROWS)."""

FLOAT_EXACT_BITS = 52
"""x * 2^F must be an integer that float64 holds exactly, so max_abs * 2^F <= 2^52."""

MISSING_LEVEL = "<missing>"
OTHER_LEVEL = "<other>"


@dataclass(frozen=True)
class Column:
    """One feature column: numeric, or categorical with listed categories (None: learn them from hash buckets).

    ``range`` is a numeric column's public bound [low, high]: under the plan's ``[privacy]`` each value is
    clipped into it before it enters the noised statistics, which bounds what one record can move them
    (:func:`fedfair.datasets.statistics.noised_statistics_vector`). It should come from what the field can
    hold (an age within [0, 120]), not from a site's rows. None: no bound stated.
    """

    name: str
    kind: ColumnKind
    categories: tuple[str, ...] | None = None
    range: tuple[float, float] | None = None

    @property
    def learned(self) -> bool:
        """Whether the column's categories are learnt from hash-bucket counts rather than listed in the plan."""
        return self.kind == "categorical" and self.categories is None


@dataclass(frozen=True)
class Schema:
    """The federation's table: label and classes, feature columns in model order, and how to treat gaps.

    ``missing``: "refuse" rejects a table with an empty feature cell; "impute" turns a
    missing number into the global mean (0 after scaling) and a missing category into
    its own ``<missing>`` level. ``max_abs`` bounds every number (larger ones are
    refused, not clipped, so nothing is silently changed) and ``fraction_bits`` is F, the
    binary digits kept after the point (resolution 2^-F). A learnt categorical column is
    hashed into ``hash_buckets`` buckets. ``min_category_count`` is the smallest
    categorical count a site lets out: each site withholds its smaller counts (see
    :func:`statistics_vector`), so a learnt column's buckets that no site lets out are
    merged into ``<other>``, and rare values neither become features of their own nor
    can be counted by the aggregator.
    """

    label: str
    classes: tuple[str, ...]
    columns: tuple[Column, ...]
    missing: MissingPolicy = "refuse"
    max_abs: float = DEFAULT_MAX_ABS
    fraction_bits: int = DEFAULT_FRACTION_BITS
    hash_buckets: int = DEFAULT_HASH_BUCKETS
    min_category_count: int = DEFAULT_MIN_CATEGORY_COUNT

    def __post_init__(self) -> None:
        if not self.label:
            raise ConfigError('[schema] label must name a column; set label = "<column>"')
        if len(self.classes) < 2 or len(set(self.classes)) != len(self.classes):
            raise ConfigError(
                f"[schema] classes must list at least two distinct label values, got {shown(list(self.classes))}; "
                "fix classes"
            )
        if holds_two_codings(self.classes):
            raise ConfigError(
                f"[schema] classes = {shown(list(self.classes))} hold two codings of one yes/no label; keep one "
                "(e.g. the one most sites use) and have each site that writes the other map it with a "
                "[data.recode] line in its collaborator.toml (or fix its table)"
            )
        if not self.columns:
            raise ConfigError("[schema] has no feature columns; add [[schema.columns]] entries")
        names = [column.name for column in self.columns]
        for column in self.columns:
            if names.count(column.name) > 1:
                raise ConfigError(f"[schema] column {column.name!r} is listed twice; keep one entry per column")
            if column.name == self.label:
                raise ConfigError(f"[schema] the label {self.label!r} cannot also be a feature column; remove it")
            if column.kind not in COLUMN_KINDS:
                raise ConfigError(
                    f"[schema] column {column.name!r} has type {column.kind!r}; use numeric or categorical"
                )
            if column.kind == "numeric" and column.categories is not None:
                raise ConfigError(f"[schema] numeric column {column.name!r} cannot list categories; remove them")
            if column.range is not None:
                low, high = column.range
                if column.kind != "numeric":
                    raise ConfigError(f"[schema] categorical column {column.name!r} cannot have a range; remove it")
                if not (math.isfinite(low) and math.isfinite(high) and low < high):
                    raise ConfigError(
                        f"[schema] column {column.name!r} range = [{low:g}, {high:g}] must be two finite numbers, "
                        "low < high; fix the range"
                    )
                if max(abs(low), abs(high)) > self.max_abs:
                    # Values above max_abs are refused anyway; a wider bound would only hide them in the noise.
                    raise ConfigError(
                        f"[schema] column {column.name!r} range = [{low:g}, {high:g}] reaches past max_abs = "
                        f"{self.max_abs:g}; narrow the range to what the field can hold"
                    )
            if column.categories is not None and (
                not column.categories or len(set(column.categories)) != len(column.categories)
            ):
                raise ConfigError(
                    f"[schema] column {column.name!r} must list distinct categories, got "
                    f'{shown(list(column.categories))}; fix the list or write categories = "{LEARN}"'
                )
        if self.missing not in MISSING_POLICIES:
            raise ConfigError(f'[schema] missing = {self.missing!r} is not known; use "refuse" or "impute"')
        if not 0 <= self.fraction_bits <= FLOAT_EXACT_BITS:
            raise ConfigError(f"[schema] fraction_bits must be from 0 to {FLOAT_EXACT_BITS}, got {self.fraction_bits}")
        if not (
            # Scaled down, not max_abs up: a served 1e308 would overflow the product.
            math.isfinite(self.max_abs) and 0 < self.max_abs <= math.ldexp(2.0**FLOAT_EXACT_BITS, -self.fraction_bits)
        ):
            raise ConfigError(
                f"[schema] max_abs = {self.max_abs:g} with fraction_bits = {self.fraction_bits} must satisfy "
                f"0 < max_abs * 2^fraction_bits <= 2^{FLOAT_EXACT_BITS}; lower fraction_bits or max_abs"
            )
        if not 2 <= self.hash_buckets <= 2**20:
            raise ConfigError(f"[schema] hash_buckets must be from 2 to {2**20}, got {self.hash_buckets}")
        if not 1 <= self.min_category_count <= MAX_CATEGORY_COUNT:
            raise ConfigError(
                f"[schema] min_category_count must be from 1 to {MAX_CATEGORY_COUNT}, got {shown(self.min_category_count)}"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], source: str) -> Schema:
        """Read the plan's ``[schema]`` table (TOML or JSON); every error is one line naming ``source`` and the fix."""
        section = Table(source, "schema", data, _SCHEMA_KEYS)
        columns = []
        for table in section.entries("columns", ("name", "type", "categories", "range")):
            name = table.string("name")
            kind = cast(ColumnKind, table.string("type", choices=COLUMN_KINDS))
            categories: tuple[str, ...] | None = None
            bounds: tuple[float, float] | None = None
            if table.given("range"):
                pair = table.items("range", finite_number, "[low, high], two numbers, e.g. [0, 120]")
                if len(pair) != 2:
                    table.bad("range", pair, "[low, high], two numbers, e.g. [0, 120]")
                bounds = (float(pair[0]), float(pair[1]))
            if kind == "categorical":
                if table.data.get("categories") != LEARN:
                    categories = table.strings("categories", f'a list of strings or "{LEARN}"')
            elif "categories" in table.data:
                table.fail(
                    f"{table.where} numeric column {name!r} cannot have categories; "
                    'remove them or set type = "categorical"'
                )
            columns.append(Column(name, kind, categories, bounds))
        label = section.string("label")
        classes = section.strings("classes", "a list of at least two label values")
        missing = cast(MissingPolicy, section.string("missing", "refuse", choices=MISSING_POLICIES))
        max_abs = section.number("max_abs", DEFAULT_MAX_ABS, expected="a finite number")
        fraction_bits = section.integer("fraction_bits", DEFAULT_FRACTION_BITS)
        hash_buckets = section.integer("hash_buckets", DEFAULT_HASH_BUCKETS)
        min_category_count = section.integer("min_category_count", DEFAULT_MIN_CATEGORY_COUNT)
        try:
            return cls(
                label, classes, tuple(columns), missing, max_abs, fraction_bits, hash_buckets, min_category_count
            )
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}") from None

    def to_mapping(self) -> dict[str, object]:
        """The schema as JSON- and TOML-ready plain values; ``from_mapping`` reads it back unchanged."""
        columns: list[dict[str, object]] = []
        for column in self.columns:
            entry: dict[str, object] = {"name": column.name, "type": column.kind}
            if column.kind == "categorical":
                entry["categories"] = LEARN if column.categories is None else list(column.categories)
            if column.range is not None:
                entry["range"] = list(column.range)
            columns.append(entry)
        return {
            "label": self.label,
            "classes": list(self.classes),
            "missing": self.missing,
            "max_abs": self.max_abs,
            "fraction_bits": self.fraction_bits,
            "hash_buckets": self.hash_buckets,
            "min_category_count": self.min_category_count,
            "columns": columns,
        }

    def to_toml(self, *, commented: bool = False) -> str:
        """The ``[schema]`` section to paste into a plan; ``commented`` adds each key's options as comments."""
        mapping = self.to_mapping()
        columns = cast(list[dict[str, object]], mapping.pop("columns"))
        lines = ["[schema]"]
        for key, value in mapping.items():
            line = f"{key} = {toml_value(value)}"
            lines += [f"{line}  # {_KEY_NOTES[key]}" if commented and key in _KEY_NOTES else line]
        if commented:
            lines.append(
                f'# each column: type = "numeric" | "categorical"; categories = [...] or "{LEARN}"; a numeric '
                "column's range = [low, high] is public (values are clipped into it for the noised statistics): "
                "widen it to what the field can hold, not what one table holds"
            )
        for column in columns:
            lines += ["", "[[schema.columns]]"] + [f"{key} = {toml_value(value)}" for key, value in column.items()]
        return "\n".join(lines) + "\n"


_KEY_NOTES = {
    "missing": '"refuse": a site with an empty feature cell stops; "impute": mean for numbers, "<missing>" level',
    "max_abs": "numbers above this (absolute) are refused, never clipped",
    "fraction_bits": "binary digits kept after the point; max_abs * 2^fraction_bits <= 2^52",
    "hash_buckets": f'buckets for a column with categories = "{LEARN}"',
    "min_category_count": "smaller counts stay at each site (a category rarer everywhere becomes <other>)",
}
"""What each [schema] key means, for the drafted schema's comments."""

_SCHEMA_KEYS = (
    "label", "classes", "missing", "max_abs", "fraction_bits", "hash_buckets", "min_category_count", "columns",
)  # fmt: skip


def toml_value(value: object) -> str:
    """A schema value (text, number, list of text) as TOML."""
    # JSON strings, numbers and arrays of strings are valid TOML, except that TOML also wants DEL escaped.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def categorical_levels(schema: Schema, column: Column, buckets: tuple[int, ...]) -> tuple[str, ...]:
    """A categorical column's levels: its categories (or kept buckets and ``<other>``), then ``<missing>`` if imputed."""
    if column.categories is None:
        levels = [f"<bucket {b}>" for b in buckets] + [OTHER_LEVEL]
    else:
        levels = list(column.categories)
    if schema.missing == "impute":
        levels.append(MISSING_LEVEL)
    return tuple(levels)


# ---------------------------------------------------------------------------------------------------------------------
# A first schema from one table


def drafted_features(
    table: pd.DataFrame, label: str, features: Sequence[str] | None
) -> tuple[list[str] | None, dict[str, str]]:
    """The features to draft a schema with.

    `features` as given, or (None) every column but the label and the ID-like ones
    (:func:`fedfair.datasets.suspects.id_like_columns`); and those left out, with why.

    None stands for "every column but the label" when nothing is left out, so the draft is unchanged.
    """
    from fedfair.datasets.suspects import id_like_columns

    if features is not None:
        return list(features), {}
    table = table.rename(columns=str)
    others = [name for name in table.columns if name != label]
    left_out = id_like_columns(table, others)
    return ([name for name in others if name not in left_out] if left_out else None), left_out


def left_out_note(left_out: Mapping[str, str]) -> str:
    """The draft's comment naming the ID-like columns it left out ("" when none)."""
    if not left_out:
        return ""
    listed = ", ".join(f"{name} ({why})" for name, why in left_out.items())
    return f"# Left out as ID-like: {listed}; name the features with --features to keep one.\n"


def several_spellings(table: pd.DataFrame, schema: Schema) -> list[str]:
    """The schema's text columns (label first) holding a value written several ways, one line each.

    E.g. "readmitted_30d: 'yes' also as 'Yes ', 'YES'": only case or surrounding spaces differ
    (:func:`fedfair.datasets.suspects.spellings`). The fix is the table's cells, never more classes.
    """
    from fedfair.datasets.suspects import spellings

    table = table.rename(columns=str)
    names = [column.name for column in schema.columns if column.kind == "categorical" and column.name in table]
    if schema.label in table and not is_numeric(table[schema.label].dropna()):
        names.insert(0, schema.label)
    lines = []
    for name in names:
        found = spellings(list(as_text(table[name])))
        if found:
            shown = "; ".join(f"{kept!r} also as {', '.join(map(repr, others))}" for kept, others in found.items())
            lines.append(f"{name}: {shown}")
    return lines


def spellings_note(table: pd.DataFrame, schema: Schema) -> str:
    """The draft's comment naming the values it lists once though written several ways ("" when none)."""
    lines = several_spellings(table, schema)
    if not lines:
        return ""
    return (
        "# Written several ways, drafted once (a collaborator refuses the other spellings: make the cells one\n"
        "# spelling in every site's table, trimming spaces and choosing one case):\n"
        + "".join(f"#   {line}\n" for line in lines)
    )


def _distinct_text(series: pd.Series) -> list[str]:
    """A text column's values in sorted order, a value written several ways once (its kept spelling)."""
    from fedfair.datasets.suspects import spellings

    text = list(as_text(series))
    others = {other for variants in spellings(text).values() for other in variants}
    return sorted({value for value in text if value is not None and value not in others})


def drafted_range(values: np.ndarray) -> tuple[float, float] | None:
    """A public-looking bound around `values`: low and high rounded outward to the leading digit's place.

    Ages 18 to 90 give [10, 90]; 0.02 to 3.7 give [0, 4]. Coarse on purpose, and a draft: the operator
    widens it to what the field can hold before sharing the plan. None for a column with no value.
    """
    if values.size == 0:
        return None
    low, high = float(values.min()), float(values.max())
    magnitude = max(abs(low), abs(high))
    step = 10.0 ** math.floor(math.log10(magnitude)) if magnitude > 0 else 1.0
    low, high = math.floor(low / step) * step, math.ceil(high / step) * step
    return (low, high) if low < high else (low, low + step)


def draft_schema(
    table: pd.DataFrame, label: str, features: Sequence[str] | None = None, *, learn_categories: bool = False
) -> Schema:
    """A schema describing one table, to edit and paste into the plan.

    Numbers (and booleans) become numeric columns, anything else categorical with its
    values listed in sorted order (or learnt from hash buckets with
    ``learn_categories``). ``missing`` is "impute" when a feature has gaps, else
    "refuse". Very large numbers raise ``max_abs`` and lower ``fraction_bits`` to match.
    Other sites' tables may hold categories this one lacks: add them before sharing.
    """
    table = table.rename(columns=str)
    columns = list(table.columns)
    if label not in columns:
        raise ConfigError(f"column {label!r} not found; pass --label with one of: {', '.join(columns[:30])}")
    chosen = [name for name in columns if name != label] if features is None else list(features)
    for name in chosen:
        if name not in columns:
            raise ConfigError(f"feature column {name!r} not found; choose --features from: {', '.join(columns[:30])}")
    if label in chosen:
        raise ConfigError(f"label {label!r} cannot also be a feature; remove it from --features")
    labels = table[label].dropna()
    classes = sorted(labels.unique()) if is_numeric(labels) else _distinct_text(labels)
    schema_columns = []
    largest = 0.0
    for name in chosen:
        series = table[name]
        if is_numeric(series):
            magnitudes = np.abs(series.to_numpy(dtype=np.float64, na_value=np.nan))
            finite = magnitudes[np.isfinite(magnitudes)]
            largest = max(largest, float(finite.max()) if finite.size else 0.0)
            numbers = series.to_numpy(dtype=np.float64, na_value=np.nan)
            schema_columns.append(Column(name, "numeric", None, drafted_range(numbers[np.isfinite(numbers)])))
            continue
        values = _distinct_text(series)
        if not learn_categories and len(values) > MAX_CATEGORIES:
            cells = text_cells(series)
            if cells is not None:
                raise ConfigError(
                    f"column {name!r} holds numbers but for {int(cells.sum()):,} text cells: "
                    f"{offenders(series.to_numpy(dtype=object), cells)}; make each a number (or leave it empty), "
                    "or leave the column out with --features"
                )
            raise ConfigError(
                f"column {name!r} has {len(values):,} distinct text values, too many to list (limit {MAX_CATEGORIES}); "
                "pass --learn-categories, or leave it out with --features"
            )
        schema_columns.append(Column(name, "categorical", None if learn_categories else tuple(values)))
    max_abs, fraction_bits = DEFAULT_MAX_ABS, DEFAULT_FRACTION_BITS
    if largest > DEFAULT_MAX_ABS:
        max_abs = 10.0 ** math.ceil(math.log10(largest))
        fraction_bits = min(DEFAULT_FRACTION_BITS, FLOAT_EXACT_BITS - math.ceil(math.log2(max_abs)))
        if fraction_bits < 0:
            raise ConfigError(f"a feature reaches {largest:g}, too large to sum exactly; rescale it first")
    gaps = bool(table[chosen].isna().to_numpy().any())
    return Schema(
        label=label,
        classes=tuple(as_text(pd.Series(classes))),
        columns=tuple(schema_columns),
        missing="impute" if gaps else "refuse",
        max_abs=max_abs,
        fraction_bits=fraction_bits,
    )
