"""The exact evaluation's loss histogram as a tree: what one collaborator sends, and range sums over it.

Exact only: a plan without [privacy] report_epsilon (a noised one answers :mod:`fedfair.fairness.tail`).

Leaves. The plan's K thresholds t_0 = 0 < t_1 < ... < t_{K-1} (K a power of two) cut the
losses, clipped to [t_0, t_{K-1}], into K leaves: leaf 0 holds the losses equal to t_0, leaf
i >= 1 those in (t_{i-1}, t_i]. Every loss lies in exactly one leaf.

Why: docs/design.md, "Inside the fairness library".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ConfigError


def levels(thresholds: int) -> int:
    """H + 1, the tree's levels for K thresholds; K must be a power of two (at least 2)."""
    if thresholds < 2 or thresholds & (thresholds - 1):
        raise ConfigError(f"the evaluation's thresholds must be a power of two in number, got {thresholds}")
    return thresholds.bit_length()


def node_count(thresholds: int) -> int:
    """Nodes of the tree over K leaves: 2 K - 1."""
    levels(thresholds)
    return 2 * thresholds - 1


def record_sensitivity(thresholds: int) -> tuple[float, float]:
    """(L1, L2): how far one held-out record moves the vector of :func:`local_histogram`, in real units."""
    moved = 2 * levels(thresholds) + 1
    return float(moved), math.sqrt(moved)


@dataclass(frozen=True)
class Layout:
    """The tree over a grid: per level, each node's lowest value `lo` and width `hi - lo`."""

    thresholds: np.ndarray
    lows: tuple[np.ndarray, ...]
    widths: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, thresholds: np.ndarray) -> Layout:
        """The tree over the sorted grid `thresholds` of K values: level h has K / 2^h nodes.

        Raises:
            ConfigError: K is not a power of two of at least 2.
        """
        grid = np.asarray(thresholds, dtype=np.float64)
        height = levels(grid.size)
        lows, widths = [], []
        for level in range(height):
            span = 1 << level
            starts = np.arange(0, grid.size, span)
            low = grid[np.maximum(starts - 1, 0)]
            lows.append(low)
            widths.append(grid[starts + span - 1] - low)
        return cls(grid, tuple(lows), tuple(widths))

    @property
    def height(self) -> int:
        """H + 1 = log2(K) + 1, the number of levels."""
        return len(self.lows)

    def split(self, flat: np.ndarray) -> list[np.ndarray]:
        """One flat per-node array (levels 0 to H in turn) as one array per level."""
        cuts = np.cumsum([low.size for low in self.lows])[:-1]
        return np.split(np.asarray(flat, dtype=np.float64), cuts)


def local_histogram(layout: Layout, losses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(counts, offset sums) of every node, levels 0 to H in turn, for non-negative losses.

    Losses above the grid's top count as the top: the tree holds min(l, t_{K-1}).
    """
    grid = layout.thresholds
    values = np.minimum(losses, grid[-1])
    leaf = np.searchsorted(grid, values, side="left")
    counts, offsets = [], []
    for level in range(layout.height):
        node = leaf >> level
        width = layout.widths[level][node]
        share = np.divide(values - layout.lows[level][node], width, out=np.zeros_like(values), where=width > 0)
        size = layout.lows[level].size
        counts.append(np.bincount(node, minlength=size).astype(np.float64))
        # Rounding may put an offset a hair outside [0, 1]; the sensitivity is stated for [0, 1].
        offsets.append(np.bincount(node, weights=np.clip(share, 0.0, 1.0), minlength=size))
    return np.concatenate(counts), np.concatenate(offsets)


@dataclass(frozen=True)
class RangeSums:
    """Per range of leaves (one per start or stop asked for), sums over its canonical nodes.

    nodes: how many; low, low2, width2: the sums of lo, lo^2 and (hi - lo)^2 over them; width:
    the sum of their widths; count: of their counts; low_count: of lo * count; width_offset:
    of (hi - lo) * offsets. Ranges of leaves above the first are the ones whose losses exceed a
    threshold; the noise of each sum is a sum of the nodes' noises.
    """

    nodes: np.ndarray
    low: np.ndarray
    low2: np.ndarray
    width: np.ndarray
    width2: np.ndarray
    count: np.ndarray
    low_count: np.ndarray
    width_offset: np.ndarray


def range_nodes(
    layout: Layout, counts: list[np.ndarray], offsets: list[np.ndarray], starts: np.ndarray, stops: np.ndarray
) -> RangeSums:
    """Sums over the canonical nodes of each leaf range [starts[r], stops[r]) (empty when start >= stop).

    The classic bottom-up walk: at each level a range's odd left end and odd right end are
    nodes of it, then both ends halve; at most two nodes per level.
    """
    left = np.array(starts, dtype=np.int64)
    right = np.array(stops, dtype=np.int64)
    total = {name: np.zeros(left.size) for name in RangeSums.__dataclass_fields__}
    for level in range(layout.height):
        active = left < right
        if not active.any():
            break
        ends = [(active & (left & 1 == 1), left.copy()), (active & (right & 1 == 1), right - 1)]
        for taken, node in ends:
            index = np.where(taken, node, 0)
            low, width = layout.lows[level][index], layout.widths[level][index]
            parts = {
                "nodes": np.ones(left.size),
                "low": low,
                "low2": low * low,
                "width": width,
                "width2": width * width,
                "count": counts[level][index],
                "low_count": low * counts[level][index],
                "width_offset": width * offsets[level][index],
            }
            for name, value in parts.items():
                total[name] += np.where(taken, value, 0.0)
        left = (left + (left & 1)) >> 1
        right = (right - (right & 1)) >> 1
    return RangeSums(**total)
