"""What a table's own bytes and values suggest before any schema judges them.

- :func:`sniff_dialect`: the delimiter (``,`` ``;`` tab ``|``) and the text encoding of a CSV, so a
  semicolon-separated export from a spreadsheet in another locale, or a Windows-1252 file, reads
  as the table it is instead of one column of garbled names.
- :func:`id_like_columns`: columns that identify rows (every value distinct, or named like an
  id): a model learns nothing general from them, and they may re-identify people.
- :func:`near_match`: the listed value an unlisted one is most likely a typo of ('Readmit' for
  'readmit'), so a check suggests fixing the cell rather than adding a near-duplicate class.
- :func:`at_rows`: "at lines 4, 9, 17 and 12 more", the rows of a problem as a CSV's line numbers.
"""

from __future__ import annotations

import codecs
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

TYPO_SIMILARITY = 0.85
"""difflib's ratio above which an unlisted value may be a typo of a listed one ..."""

TYPO_SHARE = 0.05
"""... when it is also at most this share of the listed value's rows (a typo is rare beside the real spelling)."""


@dataclass(frozen=True)
class Dialect:
    """How a CSV is written: its delimiter and text encoding."""

    delimiter: str = ","
    encoding: str = "utf-8"

    def describe(self) -> str:
        """E.g. "';'-separated, cp1252 text", for a line of a report."""
        shown = "tab" if self.delimiter == "\t" else repr(self.delimiter)
        return f"{shown}-separated, {self.encoding} text"


def sniff_dialect(path: Path, *, tab_separated: bool = False) -> Dialect:
    """The delimiter and encoding of the CSV at `path` (.gz read through), from its first bytes.

    The delimiter is the candidate that splits the header into the most fields and every
    sampled line into as many (a comma on a tie); `tab_separated` (a .tsv name) fixes it to
    a tab. The encoding is the first of :data:`ENCODINGS` that decodes the sample; a file that
    fails it past the sample is read again with the next (:func:`fedfair.datasets.tabular.read_table`).
    """
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as stream:
        sample: bytes = stream.read(SAMPLE_BYTES)
    encoding = "utf-8-sig" if sample.startswith(codecs.BOM_UTF8) else _encoding(sample)
    if tab_separated:
        return Dialect("\t", encoding)
    text = sample.decode(encoding, errors="replace")
    lines = [line for line in text.splitlines()[:50] if line.strip()]
    if len(text) >= SAMPLE_BYTES and len(lines) > 1:
        lines = lines[:-1]  # the sample may end inside a line
    best, best_fields = ",", 1
    for delimiter in DELIMITERS:
        counts = [_fields(line, delimiter) for line in lines]
        if not counts or counts[0] < 2:
            continue
        steady = sum(count == counts[0] for count in counts) >= 0.9 * len(counts)
        if steady and counts[0] > best_fields:
            best, best_fields = delimiter, counts[0]
    return Dialect(best, encoding)


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
    distinct is one, and so is a column of distinct whole numbers spanning at most twice as many
    values as there are rows (a counter); decimals and spread-out numbers (amounts, measurements)
    are not, as they are often all distinct.
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
            if not (np.all(np.mod(values, 1) == 0) and values.max() - values.min() < 2 * len(series)):
                continue
        found[name] = f"all {len(series):,} values distinct"
    return found


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
