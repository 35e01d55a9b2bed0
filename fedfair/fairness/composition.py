"""Who is in the worst-off group: each cell's share of it beside the cell's share of everyone.

FedSRCVaR protects the worst rho-fraction of people without being told who they are; this
module describes them afterwards. Given per-sample losses and, per sample, its value in one
or more columns (race, sex, the label...), every cell of those columns' cross product gets

- ``worst_share``: the fraction of the worst group that falls in the cell, and
- ``overall_share``: the fraction of all rows in the cell,

Why: docs/design.md, "Inside the fairness library".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ConfigError


@dataclass(frozen=True)
class CellShare:
    """One cell of the columns' cross product: its values, its share of the worst group and of all rows."""

    cell: tuple[str, ...]
    """The cell's value in each column, in the order the columns were given."""
    worst_share: float
    overall_share: float
    worst_rows: float
    """Rows of the worst group in the cell (fractional where the boundary sample is)."""
    rows: int
    """All rows in the cell."""

    def to_dict(self, columns: Sequence[str]) -> dict[str, object]:
        """The row as JSON- and CSV-ready fields, one per column then the shares and counts."""
        return {
            **dict(zip(columns, self.cell, strict=True)),
            "worst_share": self.worst_share,
            "overall_share": self.overall_share,
            "worst_rows": self.worst_rows,
            "rows": self.rows,
        }


def _losses(losses: np.ndarray) -> np.ndarray:
    array = np.asarray(losses, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ConfigError(f"losses must be a non-empty 1-D array of per-sample losses, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ConfigError("losses contain NaN or Inf; evaluate a finite model (check the learning rate)")
    return array


def worst_fraction_weights(losses: np.ndarray, rho: float) -> np.ndarray:
    """Each sample's membership of the worst rho-fraction.

    1 for the floor(rho n) highest losses, rho n - floor(rho n) for the next one, 0 for the rest; the weights
    sum to rho n.

    Equal losses are ranked by position, so the result is the same for the same input.
    """
    if not 0.0 < rho <= 1.0:
        raise ConfigError(f"rho must be in (0, 1], got {rho}; it is the worst group's fraction, e.g. --rho 0.1")
    values = _losses(losses)
    order = np.argsort(-values, kind="stable")
    mass = rho * values.size
    whole = math.floor(mass)
    weights = np.zeros(values.size, dtype=np.float64)
    weights[order[:whole]] = 1.0
    if whole < values.size:
        weights[order[whole]] = mass - whole
    return weights


def above_threshold_weights(losses: np.ndarray, threshold: float) -> np.ndarray:
    """1 for each sample whose loss is above `threshold` (the trained c), else 0."""
    if not math.isfinite(threshold):
        raise ConfigError(f"the threshold must be a finite number, got {threshold}")
    return (_losses(losses) > threshold).astype(np.float64)


def composition(weights: np.ndarray, columns: Mapping[str, np.ndarray]) -> list[CellShare]:
    """Every cell present in the data, sorted by its values, with its share of the worst group and of all rows.

    A cell's share of the worst group is the weights' sum in the cell over their total.
    `weights` is per-sample membership of the worst group (:func:`worst_fraction_weights` or
    :func:`above_threshold_weights`); `columns` maps each column's name to its value per sample.

    Raises:
        ConfigError: no column, a column without one value per sample, or an empty worst group.
    """
    membership = np.asarray(weights, dtype=np.float64)
    if not columns:
        raise ConfigError("name at least one column to describe the worst group by, e.g. --composition race")
    values = []
    for name, column in columns.items():
        array = np.asarray(column).astype(str)
        if array.shape != membership.shape:
            raise ConfigError(
                f"column {name!r} has {array.shape[0] if array.ndim else 0} values for {membership.size} samples; "
                "give one value per sample"
            )
        values.append(array)
    total = float(membership.sum())
    if not total > 0:
        raise ConfigError("the worst group is empty: no loss is above the threshold, so it has no composition")
    cells = np.stack(values, axis=1) if len(values) > 1 else values[0][:, None]
    unique, inverse = np.unique(cells, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    worst_rows = np.bincount(inverse, weights=membership, minlength=len(unique))
    rows = np.bincount(inverse, minlength=len(unique))
    return [
        CellShare(
            cell=tuple(str(value) for value in unique[index]),
            worst_share=float(worst_rows[index] / total),
            overall_share=float(rows[index] / membership.size),
            worst_rows=float(worst_rows[index]),
            rows=int(rows[index]),
        )
        for index in range(len(unique))
    ]


def format_composition(shares: Sequence[CellShare], columns: Sequence[str], title: str) -> str:
    """A plain-text table: one line per cell, its share of the worst group beside its share of all rows."""
    widths = [max(len(column), *(len(share.cell[index]) for share in shares)) for index, column in enumerate(columns)]
    header = "  ".join(column.ljust(width) for column, width in zip(columns, widths, strict=True))
    lines = [title, f"{header}  {'worst group':>12}  {'everyone':>9}  {'rows':>8}"]
    for share in shares:
        cell = "  ".join(value.ljust(width) for value, width in zip(share.cell, widths, strict=True))
        lines.append(f"{cell}  {100 * share.worst_share:>11.1f}%  {100 * share.overall_share:>8.1f}%  {share.rows:>8,}")
    return "\n".join(lines)
