"""Who is in the worst-off group, from secure sums: the final evaluation's composition counts.

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fedfair.core.errors import ConfigError
from fedfair.core.tables import closest
from fedfair.datasets.schema import MISSING_LEVEL, Schema, categorical_levels
from fedfair.datasets.statistics import suppress_small_cells
from fedfair.datasets.values import column_values, label_codes
from fedfair.fairness.composition import above_threshold_weights
from fedfair.fairness.noisy import NOISE_FAILURE


TOTALS = 2
"""The counts before the columns': rows above c, then all rows."""


@dataclass(frozen=True)
class CompositionColumn:
    """A column the worst group is described by: its name, its levels in order, whether it is the label."""

    name: str
    levels: tuple[str, ...]
    label: bool = False


def composition_columns(schema: Schema | None, names: Sequence[str]) -> tuple[CompositionColumn, ...]:
    """The plan's composition columns, checked against its [schema]; a ConfigError naming the column and the fix.

    Each name must be the schema's label or one of its categorical columns with listed
    categories: a numeric column has no categories to count, and a learnt column's are
    hash buckets nobody can name.
    """
    if not names:
        return ()
    if schema is None:
        raise ConfigError(
            "[evaluation] composition needs a [schema]: the worst group is described by the columns of the "
            "institutions' own tables; add a [schema] or remove composition"
        )
    fix = f"name categorical columns with listed categories or the label {schema.label!r}"
    columns = {column.name: column for column in schema.columns}
    chosen: list[CompositionColumn] = []
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"[evaluation] composition lists {name!r} twice; list each column once")
        if name == schema.label:
            chosen.append(CompositionColumn(name, schema.classes, label=True))
            continue
        column = columns.get(name)
        if column is None:
            guess = closest(name, [schema.label, *columns])
            hint = f" (did you mean {guess!r}?)" if guess else ""
            raise ConfigError(
                f"[evaluation] composition names {name!r}, which is not a column of the [schema]{hint}; {fix}"
            )
        if column.kind == "numeric":
            raise ConfigError(
                f"[evaluation] composition names {name!r}, a numeric column, which has no categories to count; "
                f"remove it, or bin it into a categorical column with listed categories in the tables and the [schema]"
            )
        if column.categories is None:
            raise ConfigError(
                f'[evaluation] composition names {name!r}, whose categories are learnt ("learn", hashed buckets '
                f"nobody can name); list its categories in the [schema] (categories = [...]) or remove it"
            )
        chosen.append(CompositionColumn(name, categorical_levels(schema, column, ())))
    return tuple(chosen)


def suggested_composition(schema: Schema, count: int = 2) -> tuple[str, ...]:
    """Up to `count` columns of `schema` that composition can count, the fewest categories first.

    Categorical columns with listed categories (two or more), in the schema's order on a tie: a
    column of few values describes a group in a line, and every one :func:`composition_columns`
    accepts. The label when no such column exists.
    """
    counted = [column for column in schema.columns if column.categories is not None and len(column.categories) >= 2]
    counted.sort(key=lambda column: len(column.categories or ()))
    return tuple(column.name for column in counted[:count]) or (schema.label,)


def composition_length(columns: Sequence[CompositionColumn]) -> int:
    """Length of :func:`local_counts` for these columns (0 for none: no composition counts are sent)."""
    return TOTALS + 2 * sum(len(column.levels) for column in columns) if columns else 0


def held_out_levels(
    schema: Schema, columns: Sequence[CompositionColumn], table: pd.DataFrame, source: str
) -> np.ndarray:
    """Each held-out row's level index in each column (rows x columns, int64).

    A checked table's codes, a missing cell at the ``<missing>`` level (the last).
    """
    features = {column.name: column for column in schema.columns}
    levels = np.empty((len(table), len(columns)), dtype=np.int64)
    for position, column in enumerate(columns):
        series = table[column.name]
        if column.label:
            codes = label_codes(schema, series, source)
        else:
            codes = column_values(schema, features[column.name], series, source)
        # Only an imputed gap has code -1, and then <missing> is the last level.
        levels[:, position] = np.where(codes < 0, len(column.levels) - 1, codes)
    return levels


def local_counts(
    columns: Sequence[CompositionColumn], levels: np.ndarray, losses: np.ndarray, threshold: float, minimum: int
) -> np.ndarray:
    """One site's composition counts (the layout of the module doc), as float64, suppressed before they leave.

    Each column's counts are suppressed jointly (:func:`joint_suppression`) with ``minimum`` (the schema's
    ``min_category_count``). `levels` is :func:`held_out_levels` of the rows `losses` are of, in the same order.

    Raises:
        ConfigError: `levels` is not one row per loss and one column per composition column.
    """
    above = above_threshold_weights(losses, threshold).astype(bool)
    if levels.shape != (above.size, len(columns)):
        raise ConfigError(
            f"the held-out levels have shape {levels.shape} for {above.size} losses and {len(columns)} columns; "
            "give one row of levels per held-out row"
        )
    vector = [int(above.sum()), above.size]
    for position, column in enumerate(columns):
        width = len(column.levels)
        worst = np.bincount(levels[above, position], minlength=width)
        everyone = np.bincount(levels[:, position], minlength=width)
        sent = joint_suppression(worst, everyone, minimum)
        vector += np.where(sent, worst, 0).tolist() + np.where(sent, everyone, 0).tolist()
    return np.array(vector, dtype=np.float64)


def joint_suppression(worst: np.ndarray, everyone: np.ndarray, minimum: int) -> np.ndarray:
    """Which categories of one column a site may send (True); `worst` and `everyone` are withheld together.

    `worst` counts the category's rows above c, `everyone` all its rows.

    The site also sends its totals above c and overall, so the aggregator can subtract: a category's
    rows at or below c are its all-rows count less its count above c, and the withheld categories'
    rows above c, at or below c, and overall are each a total less what was sent. So a category is
    sent only when its rows above c and at or below c are each 0 or at least `minimum`, and, while
    any of the three withheld totals is from 1 to `minimum` - 1, the smallest category still sent is
    withheld too. Whatever is left, every count the aggregator can form is 0 or at least `minimum`.
    """
    below = everyone - worst
    sent: np.ndarray = ~(((worst > 0) & (worst < minimum)) | ((below > 0) & (below < minimum)))
    while True:
        withheld = [int(part[~sent].sum()) for part in (worst, below, everyone)]
        if not any(0 < total < minimum for total in withheld):
            return sent
        counted = sent & (everyone > 0)
        if not counted.any():
            return sent
        sent[int(np.argmin(np.where(counted, everyone, np.iinfo(np.int64).max)))] = False


def composition_sensitivity(columns: Sequence[CompositionColumn]) -> tuple[float, float]:
    """(L1, L2).

    How far one held-out record (added or removed) moves the sum of :func:`local_counts`, in counts, when no
    site suppresses (``minimum`` 1).

    A record is one of all rows and at most one of the rows above c, and in each column in one level's
    all-rows count and at most one level's count above c: 2 + 2 * columns coordinates move by 1 each.
    A site's own suppression (:func:`joint_suppression`) voids this bound, since one record can carry a
    cell across ``minimum`` and the cell withheld with it can be any size; under noise the sites send
    their counts whole and the suppression happens on the noised sum (:func:`composition_from_sums`),
    which, being post-processing, costs no privacy.
    """
    moved = TOTALS + 2 * len(columns)
    return float(moved), math.sqrt(moved)


def _shown(count: int, minimum: int) -> int | None:
    """A decoded count as reported: None (suppressed) below ``minimum``."""
    return count if count >= minimum else None


def _share(count: int | None, total: int) -> float | None:
    return None if count is None or total <= 0 else count / total


def composition_from_sums(
    columns: Sequence[CompositionColumn],
    summed: np.ndarray,
    threshold: float,
    minimum: int,
    noise_std: float = 0.0,
    failure: float = NOISE_FAILURE,
) -> dict[str, Any]:
    """The federation's worst-group composition from the secure sum of every site's :func:`local_counts`.

    Returns JSON-ready values: ``threshold`` (c), ``min_category_count``, the totals
    ``worst_rows`` and ``rows``, ``suppressed`` (how many of the cells' counts are None),
    and ``columns``: per column a list of cells, one per level in the column's order, each
    with the fields of :class:`fedfair.fairness.composition.CellShare` (``level``,
    ``worst_share``, ``overall_share``, ``worst_rows``, ``rows``), every count below
    ``minimum`` and every share resting on one None.

    The ``<missing>`` level an imputing [schema] adds to every categorical column is listed only where
    some held-out row may be missing that column: exact, unless the column's counts account for every row
    without it; noised, only when its all-rows count is beyond ``count_error_bound`` (else the noise
    cannot tell it from none). A group nobody is in is otherwise reported as "suppressed", or, noised, as
    a group of the noise's size.

    ``noise_std`` 0: exact sums; a sum that no honest sites' counts add up to (a negative count,
    a column holding more rows than the total) is refused. ``noise_std`` > 0: the standard
    deviation of the noise on each decoded count. Counts are rounded and clipped at 0, then
    suppressed below ``minimum`` as exact ones are (a noised count below it is reported as
    suppressed, whatever the truth); nothing is refused for being inconsistent, and the result
    says what the noise allows: ``noise_std``, ``confidence`` (1 - ``failure``),
    ``count_error_bound`` (every reported count within it of the true sum, all at once with that
    probability: z sigma + 1/2 for the rounding, z from the union bound over the counts) and
    ``share_error_bound`` (every reported share within it of the share of the true counts, on the
    same event).
    """
    vector = np.asarray(summed, dtype=np.float64)
    if vector.shape != (composition_length(columns),):
        raise ConfigError(
            f"the composition sum has shape {vector.shape}, but the plan's columns make "
            f"({composition_length(columns)},); every site must use the same plan"
        )
    if not (math.isfinite(noise_std) and noise_std >= 0.0):
        raise ConfigError(f"noise_std must be finite and non-negative, got {noise_std}")
    noised = noise_std > 0.0
    # Counts are sums of integers; rounding removes any encoding error (and, noised, reports whole rows).
    counts = np.rint(vector).astype(np.int64)
    if noised:
        counts = np.maximum(counts, 0)
    worst_total, total = int(counts[0]), int(counts[1])
    bound = _count_bound(noise_std, failure, vector.size) if noised else 0.0
    report: dict[str, list[dict[str, object]]] = {}
    shares: list[tuple[int, int]] = []
    position = TOTALS
    for column in columns:
        width = len(column.levels)
        parts = []
        for part_total in (worst_total, total):
            part = counts[position : position + width]
            position += width
            if not noised and (part.min() < 0 or part.sum() > part_total):
                raise ConfigError(
                    f"the composition counts of {column.name!r} are inconsistent (negative, or more rows than the "
                    "total); a contributor sent broken sums"
                )
            parts.append(part)
        listed = width - 1 if _nobody_missing(column, parts[1], total, bound) else width
        # The rule again, on the sums: it leaves honest sums as they are and keeps a faulty site's
        # small count from being read off the reported figures by subtraction.
        worst, everyone = (
            [_shown(int(count), minimum) for count in suppress_small_cells(part, minimum)] for part in parts
        )
        report[column.name] = [
            {
                "level": level,
                "worst_share": _share(worst[index], worst_total),
                "overall_share": _share(everyone[index], total),
                "worst_rows": worst[index],
                "rows": everyone[index],
            }
            for index, level in enumerate(column.levels[:listed])
        ]
        worst, everyone = worst[:listed], everyone[:listed]
        shares += [(count, worst_total) for count in worst if count is not None]
        shares += [(count, total) for count in everyone if count is not None]
    suppressed = sum(cell[key] is None for cells in report.values() for cell in cells for key in ("worst_rows", "rows"))
    result: dict[str, Any] = {
        "threshold": float(threshold),
        "min_category_count": minimum,
        "worst_rows": _shown(worst_total, minimum),
        "rows": _shown(total, minimum),
        "suppressed": suppressed,
        "columns": report,
    }
    if noised:
        result.update(_noise_statement(noise_std, failure, vector.size, shares))
    return result


def _nobody_missing(column: CompositionColumn, everyone: np.ndarray, total: int, bound: float) -> bool:
    """Whether the sums show no held-out row in `column`'s ``<missing>`` level (see :func:`composition_from_sums`).

    `everyone` is the column's summed all-rows counts (rounded), `total` the rows in all and `bound` the noise's
    bound on every count (0: exact sums). Exact: nothing in the level and the listed categories hold every row
    (a site withholds a small count, so a 0 alone may be a few rows kept back). Noised: its count within the
    bound of 0.
    """
    if column.label or column.levels[-1] != MISSING_LEVEL:
        return False
    if bound > 0.0:
        return int(everyone[-1]) <= bound
    return int(everyone[-1]) == 0 and int(everyone[:-1].sum()) == total


def _count_bound(noise_std: float, failure: float, counts: int) -> float:
    """The bound every one of `counts` noised counts is within of its truth, all at once with 1 - `failure`.

    Sub-Gaussian tails (Gaussian or Skellam noise) and a union bound over every decoded count, plus half a
    row for the rounding.
    """
    if not 0.0 < failure < 1.0:
        raise ConfigError(f"the failure probability of a noised report must be in (0, 1), got {failure}")
    return math.sqrt(2.0 * math.log(2.0 * counts / failure)) * noise_std + 0.5


def _noise_statement(noise_std: float, failure: float, counts: int, shares: list[tuple[int, int]]) -> dict[str, float]:
    """What the noise allows a reader of noised counts to conclude (see :func:`composition_from_sums`).

    On the event that every count is within b of its truth, a share x / T of true counts and the
    reported x' / T' differ by at most (b + b x' / T') / (T' - b) (for T' > b; else nothing is known).
    """
    bound = _count_bound(noise_std, failure, counts)
    share_bound = max(
        ((bound + bound * count / total) / (total - bound) if total > bound else 1.0 for count, total in shares),
        default=0.0,
    )
    return {
        "noise_std": noise_std,
        "confidence": 1.0 - failure,
        "count_error_bound": bound,
        "share_error_bound": min(share_bound, 1.0),
    }
