"""A federation's table schema, the statistics one site adds to a secure sum, and the encoder built from the total.

Every site must turn its own table into the same feature vector: the same columns in
the same order, the same one-hot levels (even for a category it never saw), and the
same scaling. The plan's ``[schema]`` fixes the first two; the scaling comes from
statistics of all sites together, learnt by one secure-aggregation round:

1. each site checks its table (:func:`check_table`) and computes
   :func:`statistics_vector`: its row count, per numeric column the count, sum and
   sum of squares of its values, per categorical column the count of each category
   (or of each hash bucket, for a column whose categories are learnt) and of missing
   cells, with every small categorical count withheld (sent as 0) so that no sum of
   sites' vectors reveals one;
2. secure aggregation adds the sites' vectors, revealing only the total;
3. every site (and the aggregator, for the model bundle) turns the total into the
   same :class:`Encoder` with :func:`encoder_from_statistics`.

Why exact integers: the secure sum is a sum of integers modulo 2^64. Numbers are
quantised to x_q = round(x * 2^F) (F = ``fraction_bits``) and every coordinate a site
sends is an integer of absolute value below 2^47, so up to 64 sites add up below 2^53:
no wraparound, no float rounding, no clipping (``STATISTICS_CLIP`` and the constants beside it
are the secure-aggregation settings that guarantee it). Sums that may be larger (sum x_q,
sum x_q^2) travel as 24-bit limbs and are put back together with Python integers, so
the pooled mean and standard deviation are those of the quantised values, exactly.
Each value moves by at most 2^-(F+1) when quantised; the mean moves by at most that
much, and so does the population standard deviation (centring and the root mean
square are both 1-Lipschitz in the largest change of one value).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, NoReturn, cast

import numpy as np
import pandas as pd

from fedfair.core.errors import ConfigError
from fedfair.datasets.tabular import MAX_CATEGORIES, is_numeric

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

FLOAT_EXACT_BITS = 52
"""x * 2^F must be an integer that float64 holds exactly, so max_abs * 2^F <= 2^52."""
LIMB_BITS = 24
COORDINATE_BITS = 47
"""Every coordinate a site sends has absolute value below 2^47."""
STATISTICS_MAX_SITES = 64
"""64 sites of coordinates below 2^47 add up below 2^53: exact in float64, far from 2^63."""
# Secure-aggregation settings for statistics vectors, each site sending with weight 1:
# EncodingConfig(STATISTICS_CLIP, STATISTICS_MAX_WEIGHT, STATISTICS_FRACTIONAL_BITS, STATISTICS_MODULUS_BITS)
# passes check_no_wraparound for up to STATISTICS_MAX_SITES parties and encodes integer
# coordinates below the clip exactly (no rounding, no clipping), whatever the schema.
STATISTICS_CLIP = float(2**COORDINATE_BITS)
STATISTICS_MAX_WEIGHT = 1.0
STATISTICS_FRACTIONAL_BITS = 0
STATISTICS_MODULUS_BITS = 64
MAX_SITE_ROWS = 2**40
"""Rows one site may contribute; bounds the sums the limbs must carry."""

MISSING_LEVEL = "<missing>"
OTHER_LEVEL = "<other>"


@dataclass(frozen=True)
class Column:
    """One feature column: numeric, or categorical with listed categories (None: learn them from hash buckets)."""

    name: str
    kind: ColumnKind
    categories: tuple[str, ...] | None = None

    @property
    def learned(self) -> bool:
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
            raise ConfigError("[schema] label must name a column; set label = \"<column>\"")
        if len(self.classes) < 2 or len(set(self.classes)) != len(self.classes):
            raise ConfigError(
                f"[schema] classes must list at least two distinct label values, got {_shown(list(self.classes))}; "
                "fix classes"
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
                raise ConfigError(f"[schema] column {column.name!r} has type {column.kind!r}; use numeric or categorical")
            if column.kind == "numeric" and column.categories is not None:
                raise ConfigError(f"[schema] numeric column {column.name!r} cannot list categories; remove them")
            if column.categories is not None and (
                not column.categories or len(set(column.categories)) != len(column.categories)
            ):
                raise ConfigError(
                    f"[schema] column {column.name!r} must list distinct categories, got "
                    f'{_shown(list(column.categories))}; fix the list or write categories = "{LEARN}"'
                )
        if self.missing not in MISSING_POLICIES:
            raise ConfigError(f"[schema] missing = {self.missing!r} is not known; use \"refuse\" or \"impute\"")
        if not 0 <= self.fraction_bits <= FLOAT_EXACT_BITS:
            raise ConfigError(f"[schema] fraction_bits must be from 0 to {FLOAT_EXACT_BITS}, got {self.fraction_bits}")
        if not (math.isfinite(self.max_abs) and 0 < math.ldexp(self.max_abs, self.fraction_bits) <= 2.0**FLOAT_EXACT_BITS):
            raise ConfigError(
                f"[schema] max_abs = {self.max_abs:g} with fraction_bits = {self.fraction_bits} must satisfy "
                f"0 < max_abs * 2^fraction_bits <= 2^{FLOAT_EXACT_BITS}; lower fraction_bits or max_abs"
            )
        if not 2 <= self.hash_buckets <= 2**20:
            raise ConfigError(f"[schema] hash_buckets must be from 2 to {2**20}, got {self.hash_buckets}")
        if self.min_category_count < 1:
            raise ConfigError(f"[schema] min_category_count must be at least 1, got {self.min_category_count}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], source: str) -> Schema:
        """Read the plan's ``[schema]`` table (TOML or JSON); every error is one line naming ``source`` and the fix."""
        section = _Section(source, "[schema]", data, _SCHEMA_KEYS)
        entries = section.value("columns")
        if not isinstance(entries, list) or not entries:
            section.fail("needs a non-empty list of columns; add [[schema.columns]] entries with name and type")
        columns = []
        for position, entry in enumerate(entries, start=1):
            table = _Section(source, f"[[schema.columns]] #{position}", entry, ("name", "type", "categories"))
            name = table.text("name")
            kind = cast(ColumnKind, table.choice("type", COLUMN_KINDS))
            categories: tuple[str, ...] | None = None
            if kind == "categorical":
                listed = table.value("categories")
                if listed != LEARN:
                    categories = table.texts("categories", f'a list of strings or "{LEARN}"')
            elif "categories" in table.data:
                table.fail(f"numeric column {name!r} cannot have categories; remove them or set type = \"categorical\"")
            columns.append(Column(name, kind, categories))
        label = section.text("label")
        classes = section.texts("classes", "a list of at least two label values")
        missing = cast(MissingPolicy, section.choice("missing", MISSING_POLICIES, default="refuse"))
        max_abs = section.number("max_abs", DEFAULT_MAX_ABS)
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

    def to_toml(self) -> str:
        """The ``[schema]`` section to paste into a plan."""
        mapping = self.to_mapping()
        columns = cast(list[dict[str, object]], mapping.pop("columns"))
        lines = ["[schema]"] + [f"{key} = {_toml_value(value)}" for key, value in mapping.items()]
        for column in columns:
            lines += ["", "[[schema.columns]]"] + [f"{key} = {_toml_value(value)}" for key, value in column.items()]
        return "\n".join(lines) + "\n"


_SCHEMA_KEYS = (
    "label", "classes", "missing", "max_abs", "fraction_bits", "hash_buckets", "min_category_count", "columns",
)  # fmt: skip


def _toml_value(value: object) -> str:
    # JSON strings, numbers and arrays of strings are valid TOML, except that TOML also wants DEL escaped.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _shown(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class _Section:
    """One table of the plan's schema, read key by key; unknown keys are refused with the closest known one."""

    def __init__(self, source: str, section: str, data: object, keys: tuple[str, ...]) -> None:
        self.source, self.section = source, section
        if not isinstance(data, Mapping):
            self.fail(f"must be a table of key = value lines, got {_shown(data)}")
        self.data: Mapping[str, object] = data
        for key in data:
            if key not in keys:
                close = _closest(str(key), keys)
                hint = f"did you mean '{close}'?" if close else f"known: {', '.join(keys)}"
                self.fail(f"unknown key {str(key)!r}; {hint}")

    def fail(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.source}: {self.section} {message}")

    def value(self, key: str, default: object = None) -> object:
        if key in self.data:
            return self.data[key]
        if default is None:
            self.fail(f"is missing key '{key}'; add it")
        return default

    def bad(self, key: str, value: object, expected: str) -> NoReturn:
        self.fail(f"{key} must be {expected}, got {_shown(value)}; fix the value")

    def text(self, key: str) -> str:
        value = self.value(key)
        if not isinstance(value, str) or not value:
            self.bad(key, value, "a non-empty string")
        return value

    def texts(self, key: str, expected: str) -> tuple[str, ...]:
        value = self.value(key)
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            self.bad(key, value, expected)
        return tuple(value)

    def choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        value = self.value(key, default)
        if not isinstance(value, str) or value not in choices:
            self.bad(key, value, "one of " + ", ".join(f'"{choice}"' for choice in choices))
        return value

    def integer(self, key: str, default: int) -> int:
        value = self.value(key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            self.bad(key, value, "an integer")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.value(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            self.bad(key, value, "a finite number")
        return float(value)


def _closest(word: str, choices: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return close[0] if close else None


# ---------------------------------------------------------------------------------------------------------------------
# Checking and reading a site's table


def check_table(schema: Schema, table: pd.DataFrame, source: str, *, label_required: bool = True) -> None:
    """Refuse a table that does not fit the schema, naming the column, the offending values and the fix.

    Checks: every schema column (and the label, unless ``label_required`` is False, as
    for prediction) is present; numeric columns hold numbers within ``max_abs``; listed
    categorical columns hold only their categories; label values are among the
    classes; no cell is missing under ``missing = "refuse"``. Extra columns are ignored.
    """
    table = _named(schema, table, source, label_required)
    if schema.label in table.columns:
        _label_codes(schema, table[schema.label], source)
    for column in schema.columns:
        _column_values(schema, column, table[column.name], source)


def _named(schema: Schema, table: pd.DataFrame, source: str, label_required: bool) -> pd.DataFrame:
    """The table with text column names, after checking it has rows and every column the schema needs."""
    if len(table) == 0:
        raise ConfigError(f"{source} has no data rows; give the table at least one row")
    table = table.rename(columns=str)
    present = list(table.columns)
    needed = ([schema.label] if label_required else []) + [column.name for column in schema.columns]
    for name in needed:
        if name not in present:
            close = _closest(name, present)
            hint = f"did you mean {close!r}? " if close else ""
            role = "label column" if name == schema.label else "column"
            raise ConfigError(
                f"{source} has no {role} {name!r}, which the plan's [schema] requires; {hint}"
                f"rename that column in the table, or fix the [schema] (table columns: {', '.join(present[:30])})"
            )
        if present.count(name) > 1:
            raise ConfigError(f"{source} has the column {name!r} twice; keep one")
    return table


def _column_values(schema: Schema, column: Column, series: pd.Series, source: str) -> np.ndarray:
    """Numbers (float64, NaN where missing) or category codes (int64: listed index, bucket, -1 where missing)."""
    if column.kind == "numeric":
        return _numbers(schema, column.name, series, source)
    text = _as_text(series)
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
    if unknown.any():
        raise ConfigError(
            f"{source}: column {column.name!r} has values not among its [schema] categories: "
            f"{_offenders(text[unknown])}; fix those cells, add the values to its categories, "
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
        raise ConfigError(
            f"{source}: column {name!r} is numeric in the plan's [schema] but holds text: "
            f"{_offenders(series.to_numpy(dtype=object)[text])}; fix those cells, or declare the column "
            'type = "categorical"'
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
        raise ConfigError(
            f"{source}: column {name!r} has {int(missing.sum()):,} missing values and the plan's [schema] says "
            'missing = "refuse"; fill or drop those rows, or set missing = "impute"'
        )


def _label_codes(schema: Schema, series: pd.Series, source: str) -> np.ndarray:
    """Class indices (into ``schema.classes``) of a label column; every value must be a listed class."""
    text = _as_text(series)
    missing = pd.isna(text)
    if missing.any():
        raise ConfigError(
            f"{source}: label column {schema.label!r} has {int(missing.sum()):,} missing values; drop those rows"
        )
    codes: np.ndarray = pd.Index(schema.classes).get_indexer(text)
    if (codes < 0).any():
        raise ConfigError(
            f"{source}: label column {schema.label!r} has values not among the [schema] classes "
            f"{_shown(list(schema.classes))}: {_offenders(text[codes < 0])}; fix those cells or add them to classes"
        )
    return codes


def _as_text(series: pd.Series) -> np.ndarray:
    """A column's values as text (object array, None where missing); whole-number floats lose their '.0'.

    A CSV column of codes with a gap reads as floats (1.0, 2.0, NaN); as text they must
    still match the categories "1" and "2" that a gap-free site's table gives.
    """
    present = series.notna().to_numpy()
    values = series[present]
    if pd.api.types.is_float_dtype(values) and bool(np.all(np.mod(values, 1) == 0)):
        values = values.astype(np.int64)
    text = np.full(len(series), None, dtype=object)
    text[present] = values.astype(str).to_numpy(dtype=object)
    return text


def _offenders(values: np.ndarray, limit: int = 5) -> str:
    """The most frequent offending values with their row counts, e.g. 'n/a' (12 rows), 'x' (1 row)."""
    counts = pd.Series(values, dtype=object).value_counts()
    shown = [f"{value!r} ({count:,} row{'s' if count != 1 else ''})" for value, count in counts.iloc[:limit].items()]
    more = f" and {len(counts) - limit:,} other values" if len(counts) > limit else ""
    return ", ".join(shown) + more


def category_bucket(column: str, value: str, buckets: int) -> int:
    """The hash bucket of a learnt column's value: SHA-256 of (column, value), so every site agrees without names."""
    digest = hashlib.sha256(json.dumps([column, value], ensure_ascii=False).encode()).digest()
    return int.from_bytes(digest[:8], "big") % buckets


# ---------------------------------------------------------------------------------------------------------------------
# One site's statistics and their sum


def statistics_dimension(schema: Schema) -> int:
    """Length of :func:`statistics_vector` for this schema."""
    return 1 + sum(_width(schema, column) for column in schema.columns)


def statistics_slices(schema: Schema) -> list[tuple[Column, slice]]:
    """Where each column's statistics lie in :func:`statistics_vector`, in schema order (the row count is at 0)."""
    slices: list[tuple[Column, slice]] = []
    position = 1
    for column in schema.columns:
        width = _width(schema, column)
        slices.append((column, slice(position, position + width)))
        position += width
    return slices


def _width(schema: Schema, column: Column) -> int:
    if column.kind == "numeric":
        sum_limbs, square_limbs = _limb_counts(schema)
        return 1 + sum_limbs + square_limbs
    return (schema.hash_buckets if column.categories is None else len(column.categories)) + 1


def _limb_counts(schema: Schema) -> tuple[int, int]:
    """Limbs of sum x_q and of sum x_q^2 for the largest sums one site may have."""
    largest = math.ceil(math.ldexp(schema.max_abs, schema.fraction_bits))
    return limb_count(MAX_SITE_ROWS * largest), limb_count(MAX_SITE_ROWS * largest * largest)


def limb_count(bound: int) -> int:
    """Limbs needed to send any integer of absolute value at most ``bound`` with every limb below 2^47.

    All limbs but the last are the low 24-bit digits (0 <= limb < 2^24); the last holds
    the rest, with its sign.
    """
    count = 1
    while (bound >> (LIMB_BITS * (count - 1))) + 1 >= 1 << COORDINATE_BITS:
        count += 1
    return count


def split_limbs(value: int, count: int) -> list[int]:
    """``value`` as ``count`` limbs: low 24-bit digits, then the signed rest; :func:`join_limbs` inverts it."""
    limbs = []
    for _ in range(count - 1):
        limbs.append(value & ((1 << LIMB_BITS) - 1))
        value >>= LIMB_BITS
    limbs.append(value)
    return limbs


def join_limbs(limbs: Sequence[int]) -> int:
    """The integer that limbs (or a sum of several integers' limbs) stand for."""
    return sum(limb << (LIMB_BITS * position) for position, limb in enumerate(limbs))


def statistics_vector(schema: Schema, table: pd.DataFrame, source: str = "the table") -> np.ndarray:
    """What this site adds to the federated preprocessing sum: integers below 2^47, as float64.

    Layout: the row count; per numeric column its count of values, the limbs of
    sum x_q and of sum x_q^2; per categorical column the count of each listed category
    (or hash bucket) and of missing cells. The table is checked first (the label is
    not needed).

    Small cells are suppressed here, before anything leaves the site: every
    categorical count below ``schema.min_category_count`` is sent as 0, and if the
    counts so withheld add up to fewer than ``min_category_count`` rows, the smallest
    count still sent is withheld too (:func:`_suppress_small_cells`). Why at the site:
    the aggregator may learn a sum over any set of sites, and two sums whose sets differ
    by one site give that site's vector exactly, so only a vector safe on its own keeps
    every sum safe. Each count sent is then 0 or at least ``min_category_count``, and so
    is any sum of them; so is a column's withheld total, which the aggregator can read
    off as the row count minus the column's counts (a site with fewer rows than that
    sends no categorical count at all, and its withheld total is its row count). With
    the public bucket hash and a list of candidate values the aggregator thus learns of
    a value only that its count is 0 (absent, rare or withheld) or at least
    ``min_category_count``, never a smaller count. Row counts and numeric statistics
    are sent as they are (the encoder's means and standard deviations stay exact).
    """
    table = _named(schema, table, source, label_required=False)
    if len(table) > MAX_SITE_ROWS:
        raise ConfigError(f"{source} has {len(table):,} rows, more than the {MAX_SITE_ROWS:,} one site may send")
    sum_limbs, square_limbs = _limb_counts(schema)
    vector: list[int] = [len(table)]
    for column in schema.columns:
        values = _column_values(schema, column, table[column.name], source)
        if column.kind == "numeric":
            present = values[~np.isnan(values)]
            quantised = np.rint(np.ldexp(present, schema.fraction_bits)).astype(np.int64).tolist()
            total = sum(quantised)
            squares = sum(value * value for value in quantised)  # Python integers: exact at any size.
            vector += [len(quantised), *split_limbs(total, sum_limbs), *split_limbs(squares, square_limbs)]
        else:
            levels = schema.hash_buckets if column.categories is None else len(column.categories)
            # Missing cells (code -1) land in the last slot.
            cells = np.bincount(np.where(values < 0, levels, values), minlength=levels + 1)
            vector += _suppress_small_cells(cells, schema.min_category_count).tolist()
    return np.array(vector, dtype=np.float64)


def _suppress_small_cells(cells: np.ndarray, minimum: int) -> np.ndarray:
    """A column's cell counts (they add up to the site's rows) with every count below ``minimum`` set to 0.

    The row count is sent too, so the aggregator learns the withheld total (rows minus
    the counts sent); when only one cell was withheld that total is its count. So while
    the withheld total is from 1 to ``minimum`` - 1, the smallest count still sent
    (the first, on a tie) is withheld as well: being at least ``minimum``, one is
    enough. Only when every cell is withheld can the total stay below ``minimum``, and
    then it is the site's row count, which is sent anyway.
    """
    sent = np.where(cells < minimum, 0, cells)
    withheld = int(cells.sum() - sent.sum())
    if 0 < withheld < minimum and sent.any():
        sent[np.argmin(np.where(sent > 0, sent, np.iinfo(sent.dtype).max))] = 0
    return sent


def encoder_from_statistics(schema: Schema, summed: np.ndarray) -> Encoder:
    """The encoder every site shares, from the sum of all sites' :func:`statistics_vector`.

    Numbers: mean and population standard deviation of the pooled quantised values,
    computed exactly (Fractions) and rounded once to float64; a constant column gets
    standard deviation 1 (numeric statistics are never suppressed, so this is exact).
    Categories: each level's frequency is the rows the sum places in it over all rows.
    Sites withhold small counts (see :func:`statistics_vector`), so the counts may add
    up to fewer than the rows: a withheld cell counts in no listed level and in no
    ``<missing>`` level, whose frequencies are thus at most their true ones. A learnt
    column keeps as levels the buckets with at least ``min_category_count`` rows in the
    sum (after suppression, every bucket that arrived nonzero) and puts every other
    row, withheld ones included, into ``<other>``, where a row of a rare value lands.
    """
    counts = _integers(schema, summed)
    rows = counts[0]
    if rows <= 0:
        raise ConfigError("the summed statistics count no rows; every site's table was empty or the sum is wrong")
    sum_limbs, square_limbs = _limb_counts(schema)
    encodings = []
    for column, where in statistics_slices(schema):
        part = counts[where]
        if column.kind == "numeric":
            count = part[0]
            if count <= 0:
                raise ConfigError(
                    f"column {column.name!r} has no values at any site; fill it in or remove it from the [schema]"
                )
            total = join_limbs(part[1 : 1 + sum_limbs])
            squares = join_limbs(part[1 + sum_limbs : 1 + sum_limbs + square_limbs])
            scale = 1 << schema.fraction_bits
            variance = Fraction(count * squares - total * total, count * count * scale * scale)
            if variance < 0:
                raise ConfigError("the summed statistics are inconsistent (negative variance); the sum is corrupt")
            std = math.sqrt(variance) or 1.0
            encodings.append(ColumnEncoding(column.name, (), (float(Fraction(total, count * scale)),), (std,)))
            continue
        if min(part) < 0 or sum(part) > rows:
            raise ConfigError(
                f"the summed statistics are inconsistent (column {column.name!r} counts {sum(part):,} cells, some "
                f"negative or more than the {rows:,} rows); the sum is corrupt"
            )
        *level_counts, missing = part
        buckets: tuple[int, ...] = ()
        if column.categories is None:
            # Suppressed sums hold no bucket from 1 to min_category_count - 1; the test still
            # keeps a faulty site's unsuppressed small bucket from becoming a level.
            buckets = tuple(b for b, rows_in in enumerate(level_counts) if rows_in >= schema.min_category_count)
            kept = [level_counts[b] for b in buckets]
            level_counts = kept + [rows - sum(kept) - missing]
        if schema.missing == "impute":
            level_counts.append(missing)
        levels = _levels(schema, column, buckets)
        frequencies = tuple(count / rows for count in level_counts)
        stds = tuple(math.sqrt(f * (1.0 - f)) or 1.0 for f in frequencies)
        encodings.append(ColumnEncoding(column.name, levels, frequencies, stds, buckets))
    return Encoder(schema, rows, tuple(encodings))


def _levels(schema: Schema, column: Column, buckets: tuple[int, ...]) -> tuple[str, ...]:
    """A categorical column's levels: its categories (or kept buckets and ``<other>``), then ``<missing>`` if imputed."""
    if column.categories is None:
        levels = [f"<bucket {b}>" for b in buckets] + [OTHER_LEVEL]
    else:
        levels = list(column.categories)
    if schema.missing == "impute":
        levels.append(MISSING_LEVEL)
    return tuple(levels)


def _integers(schema: Schema, summed: np.ndarray) -> list[int]:
    vector = np.asarray(summed, dtype=np.float64)
    expected = statistics_dimension(schema)
    if vector.shape != (expected,):
        raise ConfigError(
            f"the summed statistics have shape {vector.shape}, but this schema's are ({expected},); "
            "every site must use the same [schema]"
        )
    limit = STATISTICS_MAX_SITES * 2.0**COORDINATE_BITS
    if not (np.all(np.isfinite(vector)) and np.all(np.abs(vector) < limit) and np.all(vector == np.rint(vector))):
        raise ConfigError("the summed statistics are not integers below 2^53; sum them with fractional_bits = 0")
    return [int(value) for value in vector]


# ---------------------------------------------------------------------------------------------------------------------
# The shared encoder


@dataclass(frozen=True)
class ColumnEncoding:
    """How one column becomes features: numeric (no levels, one mean and std) or one feature per level.

    For a categorical column, ``means`` are the levels' frequencies f over all sites, as
    the suppressed statistics give them (see :func:`encoder_from_statistics`), and ``stds``
    sqrt(f (1 - f)) (1 where that is 0). ``buckets`` are a learnt column's kept hash
    buckets, in level order.
    """

    name: str
    levels: tuple[str, ...]
    means: tuple[float, ...]
    stds: tuple[float, ...]
    buckets: tuple[int, ...] = ()

    @property
    def feature_names(self) -> list[str]:
        return [f"{self.name}={level}" for level in self.levels] if self.levels else [self.name]


@dataclass(frozen=True)
class Encoder:
    """A schema plus global statistics: turns any site's table into the same standardised features."""

    schema: Schema
    rows: int
    columns: tuple[ColumnEncoding, ...]

    @property
    def feature_names(self) -> list[str]:
        return [name for column in self.columns for name in column.feature_names]

    @property
    def class_names(self) -> list[str]:
        return list(self.schema.classes)

    @property
    def num_features(self) -> int:
        return sum(len(column.means) for column in self.columns)

    def encode(self, table: pd.DataFrame, source: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Float32 features in the schema's order and int64 class indices (None when the label column is absent).

        Numbers are standardised with the global mean and std (a missing one, under
        "impute", becomes 0); categories one-hot, each level standardised with its
        frequency over all sites, as ``tabular.encode_features`` does for one table.
        """
        table = _named(self.schema, table, source, label_required=False)
        labels = _label_codes(self.schema, table[self.schema.label], source) if self.schema.label in table else None
        features = np.empty((len(table), self.num_features), dtype=np.float32)
        offset = 0
        for column, encoding in zip(self.schema.columns, self.columns):
            values = _column_values(self.schema, column, table[column.name], source)
            mean, std = np.array(encoding.means), np.array(encoding.stds)
            block = features[:, offset : offset + len(mean)]
            if column.kind == "numeric":
                block[:, 0] = np.nan_to_num((values - mean[0]) / std[0], nan=0.0)
            else:
                levels = self._level_codes(column, encoding, values)
                block[:] = -mean / std
                block[np.arange(len(levels)), levels] = ((1.0 - mean) / std)[levels]
            offset += len(mean)
        return features, labels

    def _level_codes(self, column: Column, encoding: ColumnEncoding, codes: np.ndarray) -> np.ndarray:
        """Each row's level index; missing cells (code -1) get the ``<missing>`` level (last)."""
        if column.categories is None:
            other = len(encoding.buckets)
            lookup = np.full(self.schema.hash_buckets, other, dtype=np.int64)
            lookup[list(encoding.buckets)] = np.arange(other)
            return np.where(codes < 0, len(encoding.levels) - 1, lookup[np.maximum(codes, 0)])
        return np.where(codes < 0, len(encoding.levels) - 1, codes)

    def to_mapping(self) -> dict[str, object]:
        """JSON-safe form for the model bundle; :meth:`from_mapping` restores it exactly."""
        return {
            "schema": self.schema.to_mapping(),
            "rows": self.rows,
            "columns": [
                {
                    "name": column.name,
                    "levels": list(column.levels),
                    "means": list(column.means),
                    "stds": list(column.stds),
                    "buckets": list(column.buckets),
                }
                for column in self.columns
            ],
        }

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], source: str) -> Encoder:
        """Read an encoder back from :meth:`to_mapping`'s form, checking it fits its schema."""
        section = _Section(source, "encoder", data, ("schema", "rows", "columns"))
        schema_data = section.value("schema")
        if not isinstance(schema_data, Mapping):
            section.bad("schema", schema_data, "a table")
        schema = Schema.from_mapping(schema_data, source)
        rows = section.value("rows")
        entries = section.value("columns")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            section.bad("rows", rows, "a positive integer")
        if not isinstance(entries, list) or len(entries) != len(schema.columns):
            section.bad("columns", entries, f"a list of {len(schema.columns)} column encodings, one per schema column")
        columns = []
        for column, entry in zip(schema.columns, entries):
            table = _Section(source, f"encoder column {column.name!r}", entry, _ENCODING_KEYS)
            if table.value("name") != column.name:
                table.bad("name", table.value("name"), f"{column.name!r}, the schema's column at this position")
            levels = tuple(str(level) for level in _list_of(table, "levels", _is_text, "a list of strings"))
            means = tuple(float(mean) for mean in _list_of(table, "means", _is_number, "a list of numbers"))
            stds = tuple(float(std) for std in _list_of(table, "stds", _is_number, "a list of numbers"))
            buckets = tuple(int(b) for b in _list_of(table, "buckets", _is_bucket(schema), "a list of bucket numbers"))
            expected = () if column.kind == "numeric" else _levels(schema, column, buckets)
            width = max(len(expected), 1)
            if levels != expected or len(means) != width or len(stds) != width or not all(std > 0 for std in stds):
                table.fail(
                    f"does not fit its schema column (levels {_shown(list(expected))}, {width} means and positive "
                    "stds); the bundle is damaged, write it again"
                )
            columns.append(ColumnEncoding(column.name, levels, means, stds, buckets))
        return cls(schema, rows, tuple(columns))


_ENCODING_KEYS = ("name", "levels", "means", "stds", "buckets")


def _list_of(table: _Section, key: str, accept: Callable[[object], bool], expected: str) -> list[Any]:
    value = table.value(key)
    if not isinstance(value, list) or not all(accept(item) for item in value):
        table.bad(key, value, expected)
    return value


def _is_text(value: object) -> bool:
    return isinstance(value, str)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_bucket(schema: Schema) -> Callable[[object], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and 0 <= value < schema.hash_buckets


# ---------------------------------------------------------------------------------------------------------------------
# A first schema from one table


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
    classes = sorted(labels.unique()) if is_numeric(labels) else sorted(set(_as_text(labels)))
    schema_columns = []
    largest = 0.0
    for name in chosen:
        series = table[name]
        if is_numeric(series):
            magnitudes = np.abs(series.to_numpy(dtype=np.float64, na_value=np.nan))
            finite = magnitudes[np.isfinite(magnitudes)]
            largest = max(largest, float(finite.max()) if finite.size else 0.0)
            schema_columns.append(Column(name, "numeric"))
            continue
        values = sorted({value for value in _as_text(series) if value is not None})
        if not learn_categories and len(values) > MAX_CATEGORIES:
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
        classes=tuple(_as_text(pd.Series(classes))),
        columns=tuple(schema_columns),
        missing="impute" if gaps else "refuse",
        max_abs=max_abs,
        fraction_bits=fraction_bits,
    )
