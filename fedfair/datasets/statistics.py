"""The statistics one site adds to a secure sum, and the encoder every site builds from the total.

Every site must turn its own table into the same feature vector: the same columns in
the same order, the same one-hot levels (even for a category it never saw), and the
same scaling. The plan's ``[schema]`` fixes the first two; the scaling comes from
statistics of all sites together, learnt by one secure-aggregation round. Two layouts:
exact (:func:`statistics_vector`: integers, small cells withheld at each site) when the
plan's reports are exact, and noised (:func:`noised_statistics_vector`: each numeric value
clipped into its column's public ``range``, so one record's move is bounded by
:func:`statistics_sensitivity`) when the plan's ``[privacy]`` noises what the aggregator decodes.

Why: docs/design.md, "Inside the datasets library".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pandas as pd

from fedfair.core.errors import ConfigError
from fedfair.datasets.encoder import ColumnEncoding, Encoder
from fedfair.datasets.schema import Column, Schema, categorical_levels
from fedfair.datasets.values import column_values, named_columns

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
NOISED_MAX_SITE_ROWS = 2**32
"""Rows one site may contribute to the noised statistics: every coordinate is then at most 2^32 in real units."""
NOISED_STATISTICS_FRACTIONAL_BITS = 12
"""f of the noised statistics' encoding: one record moves each coordinate by at most 2^12 units, well above the
rounding's inflation, and 2^32 rows times 2^12 leave 64-bit words room for 2^19 sites and the noise."""
SPURIOUS_BUCKETS = 0.05
"""The expected number of a learnt column's empty hash buckets that noise alone may make a level."""

# One site's statistics and their sum


def statistics_dimension(schema: Schema, *, noised: bool = False) -> int:
    """Length of :func:`statistics_vector` (`noised`: of :func:`noised_statistics_vector`) for this schema."""
    return 1 + sum(_width(schema, column, noised) for column in schema.columns)


def statistics_slices(schema: Schema, *, noised: bool = False) -> list[tuple[Column, slice]]:
    """Where each column's statistics lie in the vector, in schema order (the row count is at 0)."""
    slices: list[tuple[Column, slice]] = []
    position = 1
    for column in schema.columns:
        width = _width(schema, column, noised)
        slices.append((column, slice(position, position + width)))
        position += width
    return slices


def _width(schema: Schema, column: Column, noised: bool) -> int:
    if column.kind == "numeric":
        if noised:
            return 3  # count, sum u, sum u^2
        sum_limbs, square_limbs = _limb_counts(schema)
        return 1 + sum_limbs + square_limbs
    return _levels(schema, column) + 1


def _levels(schema: Schema, column: Column) -> int:
    """A categorical column's listed categories, or hash buckets when learnt."""
    return schema.hash_buckets if column.categories is None else len(column.categories)


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
    count still sent is withheld too (:func:`suppress_small_cells`). Why at the site:
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
    table = named_columns(schema, table, source, label_required=False)
    if len(table) > MAX_SITE_ROWS:
        raise ConfigError(f"{source} has {len(table):,} rows, more than the {MAX_SITE_ROWS:,} one site may send")
    sum_limbs, square_limbs = _limb_counts(schema)
    vector: list[int] = [len(table)]
    for column in schema.columns:
        values = column_values(schema, column, table[column.name], source)
        if column.kind == "numeric":
            present = values[~np.isnan(values)]
            quantised = np.rint(np.ldexp(present, schema.fraction_bits)).astype(np.int64).tolist()
            total = sum(quantised)
            squares = sum(value * value for value in quantised)  # Python integers: exact at any size.
            vector += [len(quantised), *split_limbs(total, sum_limbs), *split_limbs(squares, square_limbs)]
        else:
            vector += suppress_small_cells(_cells(schema, column, values), schema.min_category_count).tolist()
    return np.array(vector, dtype=np.float64)


def _cells(schema: Schema, column: Column, codes: np.ndarray) -> np.ndarray:
    """A categorical column's count per level code, then of missing cells (code -1)."""
    levels = _levels(schema, column)
    return np.bincount(np.where(codes < 0, levels, codes), minlength=levels + 1)


def column_ranges(schema: Schema) -> dict[str, tuple[float, float]]:
    """Every numeric column's public range; a ConfigError naming the columns without one, and the fix."""
    missing = [column.name for column in schema.columns if column.kind == "numeric" and column.range is None]
    if missing:
        raise ConfigError(
            f"[schema] numeric column(s) {', '.join(missing)} state no range, and the plan's [privacy] noises the "
            "statistics before round 1, which needs a public bound on each value: add range = [low, high] to each "
            "(what the field can hold, e.g. [0, 120] for an age; values outside are clipped into it)"
        )
    return {column.name: column.range for column in schema.columns if column.range is not None}


def noised_statistics_vector(schema: Schema, table: pd.DataFrame, source: str = "the table") -> np.ndarray:
    """What this site adds to the noised preprocessing sum, in real units (float64).

    Layout: the row count; per numeric column its count of values, sum u and sum u^2 with
    u = (x - m) / h, x clipped into the column's ``range`` [m - h, m + h], so |u| <= 1; per
    categorical column the count of each listed category (or hash bucket) and of missing cells.
    Nothing is withheld: the noise added inside the secure sum protects every cell, small ones
    included, and withholding would let one record move a count by more than 1
    (:func:`statistics_sensitivity` is the bound the noise is calibrated to).
    """
    ranges = column_ranges(schema)
    table = named_columns(schema, table, source, label_required=False)
    if len(table) > NOISED_MAX_SITE_ROWS:
        raise ConfigError(
            f"{source} has {len(table):,} rows, more than the {NOISED_MAX_SITE_ROWS:,} one site may send to the "
            "noised statistics; split the institution"
        )
    vector: list[float] = [float(len(table))]
    for column in schema.columns:
        values = column_values(schema, column, table[column.name], source)
        if column.kind == "numeric":
            low, high = ranges[column.name]
            middle, half = (low + high) / 2.0, (high - low) / 2.0
            u = (np.clip(values[~np.isnan(values)], low, high) - middle) / half
            vector += [float(u.size), math.fsum(u), math.fsum(u * u)]
        else:
            vector += _cells(schema, column, values).astype(np.float64).tolist()
    return np.array(vector, dtype=np.float64)


def statistics_sensitivity(schema: Schema) -> tuple[float, float]:
    """(L1, L2): how far one record (added or removed) moves :func:`noised_statistics_vector`, in real units.

    The row count by 1; per numeric column its count by at most 1, sum u by |u| <= 1 and sum u^2 by
    u^2 <= 1 (the value clipped into the column's range), so 3 in L1 and sqrt(3) in L2 (1 + u^2 + u^4 <= 3);
    per categorical column exactly one cell (a level or missing) by 1. So L1 = 1 + 3 numeric + categorical
    and L2 = sqrt(L1). Nothing is withheld in this layout, so no cell can cross a threshold and take
    another with it; the exact layout (:func:`statistics_vector`) has no such bound and is never noised.
    """
    numeric = sum(column.kind == "numeric" for column in schema.columns)
    l1 = 1.0 + 3.0 * numeric + (len(schema.columns) - numeric)
    return l1, math.sqrt(l1)


def suppress_small_cells(cells: np.ndarray, minimum: int) -> np.ndarray:
    """A column's cell counts (they add up to the site's rows) with every count below ``minimum`` set to 0.

    The row count is sent too, so the aggregator learns the withheld total (rows minus
    the counts sent); when only one cell was withheld that total is its count. So while
    the withheld total is from 1 to ``minimum`` - 1, the smallest count still sent
    (the first, on a tie) is withheld as well: being at least ``minimum``, one is
    enough. Only when every cell is withheld can the total stay below ``minimum``, and
    then it is the site's row count, which is sent anyway.

    The federation's one small-cell rule: the statistics aggregation applies it here, and
    every other count a site sends by category goes through it too (the runtime's
    worst-group composition). `cells` is an integer array of non-negative counts; the
    result is a new array of the same dtype and shape.
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
        # Suppressed sums hold no bucket from 1 to min_category_count - 1; keeping only larger ones
        # still keeps a faulty site's unsuppressed small bucket from becoming a level.
        encodings.append(_categorical_encoding(schema, column, [float(count) for count in part], rows, 0.0))
    return Encoder(schema, rows, tuple(encodings))


def _categorical_encoding(
    schema: Schema, column: Column, part: list[float], rows: float, noise_std: float
) -> ColumnEncoding:
    """One categorical column's levels and frequencies from its summed cells (`part`: levels, then missing).

    A count counts only from ``min_category_count`` rows on, and under noise of standard deviation
    `noise_std` only from where noise alone would reach it in fewer than :data:`SPURIOUS_BUCKETS` of the
    column's empty cells on average: below that it is taken as 0, so a level noise made out of nothing (or
    of a few rows) gets frequency 0 and standard deviation 1, not a tiny one that would blow its one-hot
    feature up. A learnt column keeps as levels the buckets that count; every other row goes into ``<other>``.
    """
    least = float(schema.min_category_count)
    if noise_std > 0:
        cells = _levels(schema, column) + 1
        least = max(least, noise_std * NormalDist().inv_cdf(1.0 - SPURIOUS_BUCKETS / cells))
    *level_counts, missing = [count if count >= least else 0.0 for count in part]
    buckets: tuple[int, ...] = ()
    if column.categories is None:
        buckets = tuple(b for b, rows_in in enumerate(level_counts) if rows_in > 0)
        kept = [level_counts[b] for b in buckets]
        level_counts = kept + [max(rows - sum(kept) - missing, 0.0)]
    if schema.missing == "impute":
        level_counts.append(missing)
    levels = categorical_levels(schema, column, buckets)
    frequencies = tuple(min(max(count / rows, 0.0), 1.0) for count in level_counts)
    stds = tuple(math.sqrt(f * (1.0 - f)) or 1.0 for f in frequencies)
    return ColumnEncoding(column.name, levels, frequencies, stds, buckets)


def encoder_from_noised_statistics(schema: Schema, summed: np.ndarray, noise_std: float) -> Encoder:
    """The encoder every site shares, from the noised sum of all sites' :func:`noised_statistics_vector`.

    `noise_std` is the standard deviation of each coordinate's noise. Noise can make any count or variance
    nonsensical, so each estimate is kept where it can be: a column's mean of u within [-1, 1], its mean of u^2
    within [0, 1], and its variance of u no smaller than noise_std / count, the noise's own size in the mean of
    u^2 (a smaller variance cannot be told from 0, and dividing by it would blow features up); a numeric column
    whose noised count is below 1 gets the middle of its range and the standard deviation of a uniform value
    over it; a categorical cell counts only from where noise alone would not reach it (:func:`_categorical_encoding`).
    Only a noised row count below 1 is refused: it says the sites hold too few rows for the noise.
    """
    vector = np.asarray(summed, dtype=np.float64)
    expected = statistics_dimension(schema, noised=True)
    if vector.shape != (expected,) or not np.all(np.isfinite(vector)):
        raise ConfigError(
            f"the noised statistics have shape {vector.shape} (or a value that is not finite), but this schema's "
            f"are ({expected},); every site must use the same [schema]"
        )
    if not (math.isfinite(noise_std) and noise_std >= 0):
        raise ConfigError(f"noise_std must be finite and non-negative, got {noise_std!r}")
    rows = float(vector[0])
    if rows < 1:
        raise ConfigError(
            f"the noised statistics count {rows:.1f} rows (noise standard deviation {noise_std:.3g}): the sites "
            "hold too few rows for the plan's [privacy]; add rows or raise report_epsilon"
        )
    ranges = column_ranges(schema)
    encodings = []
    for column, where in statistics_slices(schema, noised=True):
        part = [float(value) for value in vector[where]]
        if column.kind == "categorical":
            encodings.append(_categorical_encoding(schema, column, part, rows, noise_std))
            continue
        low, high = ranges[column.name]
        middle, half = (low + high) / 2.0, (high - low) / 2.0
        count, total, squares = part
        if count < 1:
            mean_u, variance_u = 0.0, 1.0 / 3.0
        else:
            mean_u = min(max(total / count, -1.0), 1.0)
            variance_u = max(min(max(squares / count, 0.0), 1.0) - mean_u * mean_u, noise_std / count)
        std = half * math.sqrt(variance_u) or 1.0
        encodings.append(ColumnEncoding(column.name, (), (middle + half * mean_u,), (std,)))
    return Encoder(schema, round(rows), tuple(encodings))


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
