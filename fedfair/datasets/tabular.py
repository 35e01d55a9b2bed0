"""Turning tables into model-ready arrays, for the built-in tables and a user's own CSV or Parquet file."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fedfair.core.errors import ConfigError
from fedfair.datasets.dataset import Dataset
from fedfair.datasets.suspects import ENCODINGS, Dialect, sniff_dialect

logger = logging.getLogger("fedfair.datasets")

# More distinct text values than this is an identifier or free text, not a category.
MAX_CATEGORIES = 100
# A label with more values than this is a quantity or an identifier, not a class.
MAX_CLASSES = 50
# Shown in place of a missing categorical value, so missingness is its own category.
MISSING = "missing"


def is_numeric(column: pd.Series) -> bool:
    """True for a numeric or boolean column (booleans encode as 0/1), False for text and objects."""
    return bool(pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column))


def as_strings(column: pd.Series) -> np.ndarray:
    """A column's values as a numpy str array with missing values spelled ``missing``."""
    strings: np.ndarray = column.astype(object).where(column.notna(), MISSING).astype(str).to_numpy(dtype=str)
    return strings


def encode_features(
    train: pd.DataFrame, test: pd.DataFrame, categorical: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """One-hot the ``categorical`` columns, keep the rest as numbers, standardise all of them.

    Categories, means and standard deviations come from ``train`` only: a test value
    never seen in training gets all zeros in its column's one-hot block (before
    scaling), and test rows are not exactly mean 0 / std 1. A missing categorical
    value is its own category; a missing number becomes the training mean (0 after
    standardising). One-hot blocks keep every level, so a model with an intercept
    sees collinear columns. Returns float32 train and test matrices and the feature
    names (``col=value``).
    """
    feature_names: list[str] = []
    # Per column: its (train, test) level codes or numbers, and the training mean and std of its features.
    columns: list[tuple[bool, list[np.ndarray], np.ndarray, np.ndarray]] = []
    for name in train.columns:
        if name in categorical:
            levels, has_missing = _levels(train[name])
            feature_names += [f"{name}={level}" for level in levels] + ([f"{name}={MISSING}"] if has_missing else [])
            codes = [_codes(frame[name], levels, has_missing) for frame in (train, test)]
            frequency = np.bincount(codes[0][codes[0] >= 0], minlength=len(levels) + has_missing) / len(train)
            columns.append((True, codes, frequency, np.sqrt(frequency * (1.0 - frequency))))
        else:
            feature_names.append(name)
            values = [frame[name].to_numpy(dtype=np.float64, na_value=np.nan) for frame in (train, test)]
            columns.append((False, values, np.array([np.nanmean(values[0])]), np.array([np.nanstd(values[0])])))
    x_train, x_test = (np.empty((len(frame), len(feature_names)), dtype=np.float32) for frame in (train, test))
    offset = 0
    for one_hot, data, mean, std in columns:
        # A constant training column carries no information; leave it centred rather than divide by 0.
        std = np.where(std > 0, std, 1.0)
        for x, column in zip((x_train, x_test), data):
            block = x[:, offset : offset + len(mean)]
            if one_hot:
                # Written once: (0 - mean) / std everywhere, then (1 - mean) / std at each row's level.
                block[:] = -mean / std
                rows = np.flatnonzero(column >= 0)
                block[rows, column[rows]] = ((1.0 - mean) / std)[column[rows]]
            else:
                block[:, 0] = np.nan_to_num((column - mean[0]) / std[0], nan=0.0)
        offset += len(mean)
    return x_train, x_test, feature_names


def _levels(column: pd.Series) -> tuple[list[object], bool]:
    """The column's distinct training values in natural order, and whether any are missing."""
    key = None if is_numeric(column) else str
    return sorted(column.dropna().unique(), key=key), bool(column.isna().any())


def _codes(column: pd.Series, levels: list[object], has_missing: bool) -> np.ndarray:
    """Each row's level index; missing values get the extra "missing" level, unseen values -1."""
    codes: np.ndarray = pd.Categorical(column, categories=levels).codes.astype(np.int64)
    if has_missing:
        codes[column.isna().to_numpy()] = len(levels)
    return codes


def encode_labels(column: pd.Series, label: str, source: str) -> tuple[np.ndarray, list[str]]:
    """Class indices (int64, sorted class order) and class names of a categorical label column."""
    if column.isna().any():
        raise ConfigError(
            f"label column {label!r} in {source} has {int(column.isna().sum()):,} missing values; drop those rows first"
        )
    if pd.api.types.is_float_dtype(column):
        if not np.all(np.mod(column.to_numpy(dtype=np.float64), 1) == 0):
            raise ConfigError(
                f"label column {label!r} in {source} is continuous ({column.nunique():,} distinct decimal values); "
                "pass a categorical column, or binarise it first (e.g. income > 50000)"
            )
        # Whole-number floats (1.0, 2.0) are class codes; name the classes 1, 2.
        column = column.astype(np.int64)
    values = column.unique()
    if len(values) > MAX_CLASSES:
        raise ConfigError(
            f"label column {label!r} in {source} has {len(values):,} distinct values, more than the "
            f"{MAX_CLASSES} classes a label may have; pass a categorical column or bin it first"
        )
    if len(values) < 2:
        raise ConfigError(
            f"label column {label!r} in {source} has only the value {values[0]!r}; "
            "a classifier needs at least two classes"
        )
    classes = sorted(values) if is_numeric(column) else sorted(str(value) for value in values)
    codes = pd.Categorical(column if is_numeric(column) else column.astype(str), categories=classes).codes
    return codes.astype(np.int64), [str(value) for value in classes]


def split_rows(groups: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random train/test row indices, split within each group so every group keeps held-out rows.

    A group of one row stays in training. Indices are sorted, so row order is kept.
    """
    rng = np.random.default_rng(seed)
    train_parts, test_parts = [], []
    for group in np.unique(groups):
        rows = rng.permutation(np.flatnonzero(groups == group))
        n_test = min(round(test_fraction * len(rows)), len(rows) - 1)
        test_parts.append(rows[:n_test])
        train_parts.append(rows[n_test:])
    return np.sort(np.concatenate(train_parts)), np.sort(np.concatenate(test_parts))


def load_csv(
    path: str | Path,
    label: str,
    split_by: str | None = None,
    features: list[str] | None = None,
    test_fraction: float = 0.25,
    seed: int = 0,
) -> Dataset:
    """Load an institution's own table (.csv, .csv.gz, .parquet) as a Dataset.

    ``label`` is a categorical column (text, integers or booleans; at most 50 classes).
    ``split_by`` names a group column (e.g. site, hospital, race): the train/test split is
    drawn within each group so each group has held-out rows, and the column is exposed
    in ``attributes_*`` for ``partition(dataset, split_by, ...)``. ``features`` defaults
    to every column except the label (the split-by column included, one-hot); text
    columns are one-hot encoded, numbers standardised. Raises ConfigError, naming the
    column and the fix, for anything it cannot use.
    """
    path = Path(path)
    table = read_table(path)
    columns = [str(name) for name in table.columns]
    table.columns = columns
    source = path.name
    if label not in columns:
        raise ConfigError(f"column {label!r} not found in {source}; pass --label with one of: {_listing(columns)}")
    if split_by is not None and split_by not in columns:
        raise ConfigError(
            f"split-by column {split_by!r} not found in {source}; pass --split-by with one of: {_listing(columns)}"
        )
    if features is None:
        features = [name for name in columns if name != label]
    else:
        unknown = [name for name in features if name not in columns]
        if unknown:
            raise ConfigError(
                f"feature column {unknown[0]!r} not found in {source}; choose features from: {_listing(columns)}"
            )
        if label in features:
            raise ConfigError(f"label {label!r} cannot also be a feature; remove it from --features")
    if not features:
        raise ConfigError(f"{source} has no columns besides the label {label!r}; a model needs features")
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test fraction must be between 0 and 1 (exclusive), got {test_fraction}")

    y, class_names = encode_labels(table[label], label, source)
    if len(class_names) == 2 and not is_numeric(table[label]):
        # Sorted order decides which text value is 1; say so, since "no" < "yes" but "died" < "survived" too.
        logger.warning(
            "label %r in %s: %r is the positive class (1) and %r the negative class (0), in sorted order",
            label, source, class_names[1], class_names[0],
        )  # fmt: skip
    categorical = [name for name in features if not is_numeric(table[name])]
    for name in features:
        gaps = int(table[name].isna().sum())
        if name not in categorical and gaps:
            logger.warning(
                "column %r in %s has %s missing values; each is replaced by the training mean "
                "(fill them in, or leave the column out with --features)",
                name, source, f"{gaps:,}",
            )  # fmt: skip
    for name in categorical:
        distinct = table[name].nunique()
        if distinct > MAX_CATEGORIES:
            raise ConfigError(
                f"column {name!r} in {source} has {distinct:,} distinct text values, too many to one-hot "
                f"encode (limit {MAX_CATEGORIES}); drop it by passing --features without it"
            )
    groups = as_strings(table[split_by]) if split_by is not None else np.zeros(len(table), dtype=str)
    train_rows, test_rows = split_rows(groups, test_fraction, seed)
    if len(train_rows) == 0 or len(test_rows) == 0:
        raise ConfigError(f"{source} has {len(table)} rows, too few to split into train and test")
    x_train, x_test, feature_names = encode_features(
        table[features].iloc[train_rows], table[features].iloc[test_rows], categorical
    )
    attributes = {split_by: groups} if split_by is not None else {}
    return Dataset(
        name=path.stem.split(".")[0],
        x_train=x_train,
        y_train=y[train_rows],
        x_test=x_test,
        y_test=y[test_rows],
        num_classes=len(class_names),
        feature_names=feature_names,
        class_names=class_names,
        attributes_train={key: values[train_rows] for key, values in attributes.items()},
        attributes_test={key: values[test_rows] for key, values in attributes.items()},
    )


def read_table(path: Path) -> pd.DataFrame:
    """A CSV (.csv, .tsv, .csv.gz) or Parquet table with at least one data row, or one line saying what is wrong.

    A CSV's delimiter and encoding are sniffed (:func:`fedfair.datasets.suspects.sniff_dialect`);
    ``table.attrs["dialect"]`` is the :class:`~fedfair.datasets.suspects.Dialect` it was read with.
    """
    table = _parse_table(path)
    if len(table) == 0:
        raise ConfigError(f"{path.name} has no data rows (only a header); add the data rows or check the file")
    return table


def _parse_table(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ConfigError(f"data file {path} not found; check the path (CSV or Parquet)")
    suffixes = [suffix.lower() for suffix in path.suffixes]
    try:
        if ".parquet" in suffixes or ".pq" in suffixes:
            return pd.read_parquet(path)
        if ".csv" in suffixes or ".tsv" in suffixes:
            return _read_csv(path, sniff_dialect(path, tab_separated=".tsv" in suffixes))
    except (ValueError, OSError, pd.errors.ParserError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"could not read {path.name}: {first_line}; is it a valid CSV or Parquet file?") from None
    raise ConfigError(f"{path.name} is neither CSV (.csv, .tsv, .csv.gz) nor Parquet (.parquet); convert it to one")


def _read_csv(path: Path, dialect: Dialect) -> pd.DataFrame:
    """The CSV in `dialect`; a file whose bytes past the sniffed sample fail its encoding is read in the next one."""
    known = dialect.encoding in ENCODINGS
    encodings = list(ENCODINGS[ENCODINGS.index(dialect.encoding) :]) if known else [dialect.encoding]
    for encoding in encodings:
        try:
            table = pd.read_csv(
                path, sep=dialect.delimiter, encoding=encoding, decimal=dialect.decimal, thousands=dialect.thousands
            )
        except UnicodeDecodeError:
            continue
        table.attrs["dialect"] = Dialect(dialect.delimiter, encoding, dialect.decimal, dialect.thousands)
        return table
    raise ValueError(f"its text is not {' or '.join(encodings)}")


def _listing(names: Sequence[str], limit: int = 30) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names)} columns)"


def as_text(series: pd.Series) -> np.ndarray:
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
