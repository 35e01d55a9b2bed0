"""What makes two tables the same data for a privacy ledger: the same rows, whatever the file.

A SHA-256 over the rows as the collaborator reads them (:func:`fedfair.datasets.tabular.read_table`), with the
columns in name order, a missing cell empty, a cell that reads as a finite number as its float (1, 1.0, "1.00"
alike), other text stripped, and the rows sorted. A file moved, copied, converted between CSV and Parquet or
re-sorted is the same table; a row added, removed or corrected, or a column renamed, is another table, with a
ledger of its own that continues the spend of the ledgers it shares rows with (:mod:`fedfair.privacy.ledger_people`,
matched on :func:`table_rows`) in two spellings: as the fingerprint reads it, and its cells alone, sorted, case folded,
a date's midnight dropped (a column renamed, a category re-cased, dates parsed into Parquet: the same people).
Neither [data] recode (it renames values, not people) nor the row index pandas' ``to_csv`` writes by default counts.

Why: docs/security.md, "The privacy ledger".
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from fedfair.core.errors import ConfigError
from fedfair.datasets.tabular import read_table
from fedfair.privacy.ledger_people import TABLE_KEY


_SEEN: dict[tuple[str, int, int], tuple[str, list[tuple[str, str]]]] = {}
"""Fingerprints and rows already computed, by (resolved path, mtime in ns, size): a site opens its ledger often."""


def table_fingerprint(path: Path) -> str:
    """SHA-256 (hex) of the table at `path`'s canonical rows (the module's rules).

    Raises:
        ConfigError: the table cannot be read, naming the file.
    """
    return _read(path)[0]


def table_rows(path: Path) -> list[tuple[str, str]]:
    """The table at `path`'s rows in their two spellings (duplicates kept): what its people are matched on.

    Each row as the fingerprint reads it (columns in name order), and its cells alone, case folded and sorted: the
    second survives a column's new name and a category's new case, which every row would carry. Matching on the
    first too keeps the rows files of before (which hold the first alone) matched.

    Raises:
        ConfigError: the table cannot be read, naming the file.
    """
    return _read(path)[1]


def _read(path: Path) -> tuple[str, list[tuple[str, str]]]:
    try:
        status = path.stat()
    except OSError:
        raise ConfigError(f"data file {path} not found; check [data] csv in the config") from None
    key = (str(path.resolve()), status.st_mtime_ns, status.st_size)
    if key not in _SEEN:
        _SEEN[key] = _fingerprint(read_table(path))
    return _SEEN[key]


def _fingerprint(table: pd.DataFrame) -> tuple[str, list[tuple[str, str]]]:
    if _written_index(table):
        table = table.iloc[:, 1:]
    names = [str(name).strip() for name in table.columns]
    order = sorted(range(len(names)), key=lambda index: names[index])
    cells = [_canonical(table.iloc[:, index]) for index in order]
    rows = sorted(
        ("\x1f".join(row), "\x1f".join(sorted(_person(cell) for cell in row))) for row in zip(*cells, strict=True)
    )
    digest = hashlib.sha256("\x1e".join(names[index] for index in order).encode())
    for row, _ in rows:
        digest.update(b"\n" + row.encode())
    return digest.hexdigest(), rows


def _written_index(table: pd.DataFrame) -> bool:
    """Whether the first column is a row index pandas wrote (``to_csv``'s default): unnamed, the integers 0..n-1.

    pandas writes it with an empty header, read back as "Unnamed: 0", in the frame's row order (shuffled rows carry
    their numbers along); the rows are the same people whatever their numbers, and counting it would make the most
    common re-export another table, its spend starting at 0 in a fresh folder.
    """
    if table.shape[1] < 2 or str(table.columns[0]).strip() not in ("", "Unnamed: 0"):
        return False
    first = table.iloc[:, 0]
    return pd.api.types.is_integer_dtype(first) and np.array_equal(np.sort(first.to_numpy()), np.arange(len(table)))


def _canonical(column: pd.Series) -> list[str]:
    """One column's cells as canonical text, each distinct value canonicalised once."""
    codes, values = pd.factorize(column, use_na_sentinel=True)
    canonical = np.array([*(_cell(value) for value in values.tolist()), ""], dtype=object)  # code -1: missing
    return list(canonical[codes])


def _person(cell: str) -> str:
    """A canonical cell as the people's spelling matches it: case folded, a date's midnight dropped.

    A date column reads as text from a CSV ("2020-01-03") and as timestamps from a Parquet file written with dates
    ("2020-01-03 00:00:00"): the same people, whose spend must continue across the conversion.
    """
    return cell.removesuffix(" 00:00:00").casefold()


def _cell(value: object) -> str:
    """A present cell as canonical text: a finite number as its float's repr, else its text stripped."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        text = str(value).strip()
        try:
            number = float(text)
        except ValueError:
            return text
    return repr(number) if math.isfinite(number) else str(value).strip()


def was_same_data(former: Mapping[str, object], identity: Mapping[str, object]) -> bool:
    """Whether a ledger of before, keyed by `former` (a table's path, or a partition), was of `identity`'s data.

    A path that no longer holds a readable table was this site's table before it moved: taken as the same, so
    that its releases are counted, never lost (at worst twice).
    """
    csv = former.get("csv")
    if isinstance(csv, str) and TABLE_KEY in identity:
        try:
            return table_fingerprint(Path(csv)) == identity[TABLE_KEY]
        except ConfigError:
            return True
    return dict(former) == dict(identity)
