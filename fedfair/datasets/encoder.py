"""The encoder every site builds from the federation's statistics: one-hot levels and global scaling.

An :class:`Encoder` turns a table that fits the schema into the model's feature vector,
bit-identically at every site; it travels as JSON with every round, so a site that joins
later encodes alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedfair.core.tables import Table, finite_number, shown
from fedfair.datasets.schema import Column, Schema, categorical_levels
from fedfair.datasets.tabular import as_text
from fedfair.datasets.values import column_values, label_codes, named_columns

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
        """The column's features: ``NAME=LEVEL`` per level of a categorical column, else ``NAME``."""
        return [f"{self.name}={level}" for level in self.levels] if self.levels else [self.name]


@dataclass(frozen=True)
class Encoder:
    """A schema plus global statistics: turns any site's table into the same standardised features."""

    schema: Schema
    rows: int
    columns: tuple[ColumnEncoding, ...]

    @property
    def feature_names(self) -> list[str]:
        """Every column's feature names, in the schema's order: the columns of :meth:`encode`'s features."""
        return [name for column in self.columns for name in column.feature_names]

    @property
    def class_names(self) -> list[str]:
        """The schema's classes; class index i of :meth:`encode` names class_names[i]."""
        return list(self.schema.classes)

    @property
    def num_features(self) -> int:
        """The width of :meth:`encode`'s feature matrix."""
        return sum(len(column.means) for column in self.columns)

    def encode(
        self, table: pd.DataFrame, source: str, *, unseen: dict[str, dict[str, int]] | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Float32 features in the schema's order and int64 class indices (None when the label column is absent).

        Numbers are standardised with the global mean and std (a missing one, under
        "impute", becomes 0); categories one-hot, each level standardised with its
        frequency over all sites, as ``tabular.encode_features`` does for one table.

        A value outside a listed column's categories is refused, unless `unseen` is given (for
        prediction with a trained model): such a cell is then encoded as none of the known
        categories, and `unseen` records it, column -> value -> rows.
        """
        table = named_columns(self.schema, table, source, label_required=False)
        labels = label_codes(self.schema, table[self.schema.label], source) if self.schema.label in table else None
        features = np.empty((len(table), self.num_features), dtype=np.float32)
        offset = 0
        for column, encoding in zip(self.schema.columns, self.columns):
            series = table[column.name]
            known = np.ones(len(table), dtype=bool)
            if unseen is not None and column.categories is not None:
                text = as_text(series)
                known = pd.isna(text) | np.isin(text, np.array(column.categories, dtype=object))
                if not known.all():
                    counts = pd.Series(text[~known], dtype=object).value_counts()
                    unseen[column.name] = {str(value): int(count) for value, count in counts.items()}
                    # A listed stand-in lets the shared reader take the column; those rows get no level below.
                    series = series.where(known, other=column.categories[0])
            values = column_values(self.schema, column, series, source)
            mean, std = np.array(encoding.means), np.array(encoding.stds)
            block = features[:, offset : offset + len(mean)]
            if column.kind == "numeric":
                block[:, 0] = np.nan_to_num((values - mean[0]) / std[0], nan=0.0)
            else:
                levels = self._level_codes(column, encoding, values)
                block[:] = -mean / std
                rows = np.flatnonzero(known)
                block[rows, levels[rows]] = ((1.0 - mean) / std)[levels[rows]]
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
        section = Table(source, "encoder", data, ("schema", "rows", "columns"))
        schema_data = section.value("schema", expected="a table")
        if not isinstance(schema_data, Mapping):
            section.bad("schema", schema_data, "a table")
        schema = Schema.from_mapping(schema_data, source)
        rows = section.integer("rows", low=1)
        entries = section.entries("columns", _ENCODING_KEYS)
        if len(entries) != len(schema.columns):
            expected_columns = f"a list of {len(schema.columns)} column encodings, one per schema column"
            section.bad("columns", section.data["columns"], expected_columns)
        columns = []
        for column, table in zip(schema.columns, entries):
            if table.value("name", expected="a string") != column.name:
                table.bad("name", table.data["name"], f"{column.name!r}, the schema's column at this position")
            levels = tuple(str(level) for level in table.items("levels", _is_text, "a list of strings"))
            means = tuple(float(mean) for mean in table.items("means", finite_number, "a list of numbers"))
            stds = tuple(float(std) for std in table.items("stds", finite_number, "a list of numbers"))
            buckets = tuple(int(b) for b in table.items("buckets", _is_bucket(schema), "a list of bucket numbers"))
            expected = () if column.kind == "numeric" else categorical_levels(schema, column, buckets)
            width = max(len(expected), 1)
            if levels != expected or len(means) != width or len(stds) != width or not all(std > 0 for std in stds):
                table.fail(
                    f"{table.where} does not fit its schema column {column.name!r} (levels {shown(list(expected))}, "
                    f"{width} means and positive stds); the bundle is damaged, write it again"
                )
            columns.append(ColumnEncoding(column.name, levels, means, stds, buckets))
        return cls(schema, rows, tuple(columns))


_ENCODING_KEYS = ("name", "levels", "means", "stds", "buckets")


def _is_text(value: object) -> bool:
    return isinstance(value, str)


def _is_bucket(schema: Schema) -> Callable[[object], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and 0 <= value < schema.hash_buckets
