"""What a table's own bytes and values suggest before any schema judges them.

- :func:`sniff_dialect`: a CSV's delimiter, text encoding and number format (decimal comma,
  thousands separators), so a spreadsheet export from another locale reads as the table it is.
- :func:`id_like_columns`: columns that identify rows, by name or by content.
- :func:`spellings`: one value written several ways ("yes", "Yes", "Yes "), to draft it once.
- :func:`near_match`: the listed value an unlisted one is most likely a typo of.
- :func:`polarity`: whether a value spells yes or no (``Y``, ``false``, ``0``), to see two codings of one fact.
- :func:`text_cells`: the few words in a column of numbers, which are cells to fix.
- :func:`offenders` and :func:`at_rows`: a column's offending values, counts and CSV line numbers.

Why: docs/design.md, "Inside the datasets library".
"""

from __future__ import annotations

import codecs
import csv
import difflib
import gzip
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

DELIMITERS = (",", ";", "\t", "|")
"""The delimiters tried, the first winning a tie (the CSV default)."""

ENCODINGS = ("utf-8", "cp1252", "latin-1")
"""Tried in order: UTF-8 (strict, so a Windows-1252 byte fails it), Windows-1252, then Latin-1, which
decodes any byte."""

SAMPLE_BYTES = 1 << 16
"""How much of a file the sniffing reads."""

ID_NAME = re.compile(r"(^|[_\s.-])(id|uuid|guid|mrn|ssn)$|^(id|uuid|guid|mrn|ssn)([_\s.-]|$)", re.IGNORECASE)
"""Column names that say "identifier": patient_id, ID, mrn, uuid, record-id."""

MIN_ROWS_FOR_DISTINCT = 50
"""All values distinct means "identifier" only in a table with at least this many rows (ages, say, repeat
well before that)."""

CODE_DIGITS = 5
"""The fewest digits of a whole-number code: narrower distinct numbers (ages, years) are too often real values."""

TYPO_SIMILARITY = 0.85
"""difflib's ratio above which an unlisted value may be a typo of a listed one ..."""

TYPO_SHARE = 0.05
"""... when it is also at most this share of the listed value's rows (a typo is rare beside the real spelling)."""


DECIMAL_COMMA = re.compile(r"^[-+]?(\d{1,3}(\.\d{3})+|\d+),\d+$")
"""A number written with a decimal comma ("66,7", "1.234,5")."""

DECIMAL_POINT = re.compile(r"^[-+]?\d*\.\d+$")
"""A number written with a decimal point ("66.7"); "1.200" is also a thousands-separated 1200."""

POINT_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(\.\d{3})+$")
"""Whole numbers grouped by points ("1.200", "12.345.678"): thousands where the decimal mark is a comma."""

COMMA_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d+)?$")
"""Numbers grouped by commas ("1,200", "12,345.5"): thousands where the decimal mark is a point."""


@dataclass(frozen=True)
class Dialect:
    """How a CSV is written: its delimiter, text encoding, decimal mark and thousands separator (None: none)."""

    delimiter: str = ","
    encoding: str = "utf-8"
    decimal: str = "."
    thousands: str | None = None

    def describe(self) -> str:
        """E.g. "';'-separated, cp1252 text, decimal commas, '.' between thousands", for a line of a report."""
        shown = "tab" if self.delimiter == "\t" else repr(self.delimiter)
        parts = [f"{shown}-separated, {self.encoding} text"]
        if self.decimal != ".":
            parts.append("decimal commas")
        if self.thousands is not None:
            parts.append(f"{self.thousands!r} between thousands")
        return ", ".join(parts)


def sniff_dialect(path: Path, *, tab_separated: bool = False) -> Dialect:
    """The delimiter and encoding of the CSV at `path` (.gz read through), from its first bytes.

    The delimiter is the candidate that splits the header into the most fields and every
    sampled line into as many (a comma on a tie); `tab_separated` (a .tsv name) fixes it to
    a tab. The encoding is the first of :data:`ENCODINGS` that decodes the sample; a file that
    fails it past the sample is read again with the next (:func:`fedfair.datasets.tabular.read_table`).
    The number format is :func:`number_format`'s reading of the sampled fields.
    """
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as stream:
        sample: bytes = stream.read(SAMPLE_BYTES)
    encoding = "utf-8-sig" if sample.startswith(codecs.BOM_UTF8) else _encoding(sample)
    text = sample.decode(encoding, errors="replace")
    lines = [line for line in text.splitlines()[:50] if line.strip()]
    if len(text) >= SAMPLE_BYTES and len(lines) > 1:
        lines = lines[:-1]  # the sample may end inside a line
    best, best_fields = ("\t", 0) if tab_separated else (",", 1)
    for delimiter in () if tab_separated else DELIMITERS:
        counts = [_fields(line, delimiter) for line in lines]
        if not counts or counts[0] < 2:
            continue
        steady = sum(count == counts[0] for count in counts) >= 0.9 * len(counts)
        if steady and counts[0] > best_fields:
            best, best_fields = delimiter, counts[0]
    fields = [field for line in lines[1:] for field in next(csv.reader([line], delimiter=best), [])]
    decimal, thousands = number_format(fields, best)
    return Dialect(best, encoding, decimal, thousands)


def number_format(fields: Sequence[str], delimiter: str) -> tuple[str, str | None]:
    """The decimal mark and thousands separator (None: none) the CSV fields `fields` are written with.

    A decimal comma is only possible where the comma does not separate fields; it is taken when
    some field is a decimal-comma number ("66,7") and none a decimal-point one ("66.7", while
    "1.200" may be either), and points then group thousands. Otherwise a field like "1,200" or
    "12,345.5" (quoted, in a comma-separated file) means commas group thousands. A file with no
    such field keeps pandas' defaults (decimal point, no grouping), as before.
    """
    stripped = [field.strip() for field in fields]
    if delimiter != ",":
        commas = any(DECIMAL_COMMA.match(field) for field in stripped)
        points = any(DECIMAL_POINT.match(field) and not POINT_THOUSANDS.match(field) for field in stripped)
        if commas and not points:
            return ",", "."
    if any(COMMA_THOUSANDS.match(field) for field in stripped):
        return ".", ","
    return ".", None


def _encoding(sample: bytes) -> str:
    for encoding in ENCODINGS:
        try:
            # Not final: the sample may end inside a multi-byte character.
            codecs.getincrementaldecoder(encoding)().decode(sample, final=False)
        except UnicodeDecodeError:
            continue
        return encoding
    return ENCODINGS[-1]


def _fields(line: str, delimiter: str) -> int:
    """Fields of one CSV line, delimiters inside double quotes not counted."""
    return len(re.sub(r'"[^"]*"', '""', line).split(delimiter))


def id_like_columns(table: pd.DataFrame, names: Sequence[str]) -> dict[str, str]:
    """Those of `names` that look like row identifiers, each with why (its name, or every value distinct).

    In a table of at least :data:`MIN_ROWS_FOR_DISTINCT` rows, a text column whose values are all
    distinct is one, and so is a column of distinct whole numbers that either span at most twice
    as many values as there are rows (a counter) or look like codes (:data:`CODE_DIGITS`); decimals,
    whole numbers of varying width and round amounts (incomes in thousands) are not, as they are
    often all distinct.
    """
    found: dict[str, str] = {}
    for name in names:
        series = table[name]
        present = series.dropna()
        if ID_NAME.search(str(name)):
            found[name] = "named like an identifier"
            continue
        if len(series) < MIN_ROWS_FOR_DISTINCT or present.nunique() != len(series):
            continue
        if pd.api.types.is_numeric_dtype(present) and not pd.api.types.is_bool_dtype(present):
            values = present.to_numpy(dtype=np.float64)
            if not np.all(np.mod(values, 1) == 0):
                continue
            counter = values.max() - values.min() < 2 * len(series)
            if not (counter or _codes(values)):
                continue
        found[name] = f"all {len(series):,} values distinct"
    return found


def _codes(values: np.ndarray) -> bool:
    """Whether distinct whole numbers look like codes (encounter or record numbers).

    Codes are non-negative, all of one width of at least :data:`CODE_DIGITS` digits, and not all
    multiples of ten (a round amount).
    """
    widths = np.unique(np.floor(np.log10(np.maximum(values, 1))))
    return bool(values.min() >= 0 and len(widths) == 1 and widths[0] + 1 >= CODE_DIGITS and np.any(values % 10))


def near_match(value: str, listed: Sequence[str], counts: dict[str, int] | None = None) -> str | None:
    """The listed value `value` is most likely a misspelling of, or None.

    The same text but for case, spaces or punctuation is always one; otherwise a close spelling
    (difflib ratio >= :data:`TYPO_SIMILARITY`) is one only when `counts` (rows per value of the
    table) shows `value` rare beside it, so a real new class that merely looks alike ('>50K'
    beside '<=50K', each a large share of the rows) is not taken for a typo.
    """
    folded = _fold(value)
    for candidate in listed:
        if _fold(candidate) == folded:
            return candidate
    if counts is None:
        return None
    close = difflib.get_close_matches(value, list(listed), n=1, cutoff=TYPO_SIMILARITY)
    if close and counts.get(value, 0) <= TYPO_SHARE * counts.get(close[0], 0):
        return close[0]
    return None


def spellings(text: Sequence[str | None]) -> dict[str, tuple[str, ...]]:
    """Each distinct value of `text` that differs from others only in case or surrounding spaces.

    Keyed by the spelling a draft keeps (one without surrounding spaces whenever there is one, since
    the fix asks for trimmed cells; among those the most frequent, then the first in sorted order),
    mapped to the other spellings of it; values written one way only are left out.
    """
    counts: dict[str, int] = {}
    for value in text:
        if value is not None:
            counts[value] = counts.get(value, 0) + 1
    groups: dict[str, list[str]] = {}
    for value in counts:
        groups.setdefault(value.strip().casefold(), []).append(value)
    found: dict[str, tuple[str, ...]] = {}
    for members in groups.values():
        if len(members) > 1:
            kept, *others = sorted(members, key=lambda value: (value != value.strip(), -counts[value], value))
            found[kept] = tuple(others)
    return found


def _fold(text: str) -> str:
    return re.sub(r"[\s_.-]+", "", text).casefold()


def at_rows(rows: np.ndarray, limit: int = 5) -> str:
    """The table rows (0-based positions) as CSV line numbers, the header being line 1.

    "at line 4", "at lines 4, 9, 17, 20, 31 and 12 more".
    """
    lines = [int(row) + 2 for row in rows[:limit]]
    if not lines:
        return ""
    more = f" and {len(rows) - limit:,} more" if len(rows) > limit else ""
    return f"at line{'s' if len(rows) > 1 else ''} {', '.join(str(line) for line in lines)}{more}"


NEGATIVE_WORDS = frozenset({"0", "no", "n", "false", "f", "negative", "neg", "absent", "off"})
POSITIVE_WORDS = frozenset({"1", "yes", "y", "true", "t", "positive", "pos", "present", "on"})
"""The spellings of a yes/no fact whose meaning is unambiguous, compared trimmed and case-folded."""


def polarity(value: str) -> bool | None:
    """True for a spelling of yes, False for one of no (:data:`POSITIVE_WORDS`), None for anything else."""
    folded = value.strip().casefold()
    if folded in POSITIVE_WORDS:
        return True
    if folded in NEGATIVE_WORDS:
        return False
    return None


def holds_two_codings(classes: Sequence[str]) -> bool:
    """Whether `classes` are all yes/no spellings with two of one meaning (``["0", "1", "no", "yes"]``)."""
    meanings = [polarity(value) for value in classes]
    return None not in meanings and max(meanings.count(True), meanings.count(False)) >= 2


def text_cells(series: pd.Series) -> np.ndarray | None:
    """The mask of a text column's cells that are not numbers, when most of its values are numbers; else None.

    Six words among ages are cells to fix, not a categorical column (the rule :mod:`fedfair.datasets.check` and the
    collaborator's check use before suggesting a type).
    """
    present: np.ndarray = series.notna().to_numpy()
    numbers: np.ndarray = pd.to_numeric(series, errors="coerce").notna().to_numpy()
    text: np.ndarray = present & ~numbers
    if not text.any() or int(numbers.sum()) <= int(text.sum()):
        return None
    return text


def offenders(values: np.ndarray, mask: np.ndarray, limit: int = 5) -> str:
    """The ``limit`` most frequent offending values (``values[mask]``) with their row counts and first lines.

    E.g. 'n/a' (12 rows at lines 4, 9, 17, 20, 31 and 7 more), 'x' (1 row at line 8).
    """
    offending = pd.Series(values[mask], index=np.flatnonzero(mask), dtype=object)
    counts = offending.value_counts()
    shown = [
        f"{value!r} ({count:,} row{'s' if count != 1 else ''} {at_rows(offending.index[offending == value])})"
        for value, count in counts.iloc[:limit].items()
    ]
    more = f" and {len(counts) - limit:,} other values" if len(counts) > limit else ""
    return ", ".join(shown) + more
