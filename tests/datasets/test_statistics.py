"""Per-site statistics: summed exactly, withholding small counts, and one encoder for every site from the total."""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.datasets import Dataset, Schema, draft_schema, encoder_from_statistics, statistics_vector
from fedfair.datasets.builtin import ADULT_COLUMNS
from fedfair.datasets.schema import Column
from fedfair.datasets.statistics import (
    MAX_SITE_ROWS,
    COORDINATE_BITS,
    STATISTICS_CLIP,
    STATISTICS_FRACTIONAL_BITS,
    STATISTICS_MAX_SITES,
    STATISTICS_MAX_WEIGHT,
    STATISTICS_MODULUS_BITS,
    join_limbs,
    limb_count,
    split_limbs,
    statistics_dimension,
    statistics_slices,
    suppress_small_cells,
)
from fedfair.datasets.values import category_bucket
from fedfair.secagg import EncodingConfig
from fedfair.secagg.encode import Encoder as SecureSumEncoder


# The largest |sum x_q^2| one site may have under the default schema: the limbs must carry it.
LARGEST_SQUARES = MAX_SITE_ROWS * math.ceil(math.ldexp(1e9, 20)) ** 2

ADULT_FEATURES = [name for name in ADULT_COLUMNS if name not in ("fnlwgt", "income")]


def adult_sites(table: pd.DataFrame) -> list[pd.DataFrame]:
    """Three sites by age band; every Amer-Indian-Eskimo person over 47 moves to the youngest site.

    So the sites' age distributions barely overlap, the oldest site has no
    Amer-Indian-Eskimo row at all, and together they are exactly the whole table.
    """
    absent = table["race"] == "Amer-Indian-Eskimo"
    oldest = table["age"] >= 48
    young = (table["age"] < 33) | (oldest & absent)
    middle = (table["age"] >= 33) & ~oldest
    return [table[young], table[middle], table[oldest & ~absent]]


def nonempty_subsets(count: int) -> list[tuple[int, ...]]:
    """Every set of sites whose sum the aggregator might see (dropouts choose which)."""
    return [subset for size in range(1, count + 1) for subset in itertools.combinations(range(count), size)]


def unsuppressed(schema: Schema) -> Schema:
    """The same schema with nothing withheld: min_category_count 1 lets every count out, the true counts."""
    return dataclasses.replace(schema, min_category_count=1)


def level_counts(schema: Schema, summed: np.ndarray) -> dict[str, int]:
    """Each categorical level's count in a (summed) statistics vector, by feature name, for listed columns."""
    counts: dict[str, int] = {}
    for column, where in statistics_slices(schema):
        if column.kind == "categorical":
            assert column.categories is not None
            levels = [*column.categories, "<missing>"]
            counts |= {f"{column.name}={level}": int(count) for level, count in zip(levels, summed[where])}
    return counts


def securely_summed(vectors: list[np.ndarray]) -> np.ndarray:
    """The sum secure aggregation reveals, through the real fixed-point encoding with the statistics settings."""
    config = EncodingConfig(STATISTICS_CLIP, STATISTICS_MAX_WEIGHT, STATISTICS_FRACTIONAL_BITS, STATISTICS_MODULUS_BITS)
    encoder = SecureSumEncoder(config, STATISTICS_MAX_SITES)
    words = sum(encoder.encode(vector, STATISTICS_MAX_WEIGHT) for vector in vectors)
    decoded = encoder.decode(np.asarray(words, dtype=np.uint64), len(vectors))
    assert decoded.total_weight == len(vectors)
    return decoded.weighted_sum


def test_shifted_sites_build_one_encoder_equal_to_pooled_standardisation_but_for_withheld_counts(
    adult_table: pd.DataFrame, adult: Dataset
) -> None:
    table = adult_table.assign(**{"hours-per-day": adult_table["hours-per-week"] / 7})  # not whole: quantised
    schema = draft_schema(table, "income", [*ADULT_FEATURES, "hours-per-day"])
    assert schema.missing == "impute" and schema.classes == ("<=50K", ">50K")
    sites = adult_sites(table)
    assert "Amer-Indian-Eskimo" not in set(sites[2]["race"])
    assert [site["age"].mean().round() for site in sites] == [25, 40, 57]
    vectors = [statistics_vector(schema, site, f"site {index}") for index, site in enumerate(sites)]
    assert all(np.abs(vector).max() < 2**COORDINATE_BITS for vector in vectors)
    summed = securely_summed(vectors)
    assert np.array_equal(summed, np.sum(vectors, axis=0))

    # Each site builds its encoder from the revealed sum alone: they agree to the bit.
    encoders = [encoder_from_statistics(schema, summed.copy()) for _ in sites]
    assert all(encoder == encoders[0] for encoder in encoders)
    encoder = encoders[0]
    assert encoder != encoder_from_statistics(schema, vectors[0])  # a site's own statistics would differ
    # Numbers are never suppressed: their encodings are those of the statistics with nothing withheld, bit for bit.
    everything = unsuppressed(schema)
    true_sum = np.sum([statistics_vector(everything, site) for site in sites], axis=0)
    numeric = {column.name: column for column in encoder.columns if not column.levels}
    assert numeric == {column.name: column for column in encoder_from_statistics(everything, true_sum).columns
                       if not column.levels}  # fmt: skip
    # Quantising moves each value, hence the mean and the population std, by at most 2^-(F+1);
    # float64 rounding of the exact results adds a relative 1e-15 or so.
    bound = 2.0 ** -(schema.fraction_bits + 1)
    assert set(numeric) == {"age", "education-num", "capital-gain", "capital-loss", "hours-per-week", "hours-per-day"}
    for name, column in numeric.items():
        pooled = table[name]
        assert abs(column.means[0] - pooled.mean()) <= bound + 1e-12 * abs(pooled.mean())
        assert abs(column.stds[0] - pooled.std(ddof=0)) <= bound + 1e-12 * pooled.std(ddof=0)

    # Encoding each site and putting the rows back in order gives the built-in Adult
    # training matrix, which encode_features standardised on the pooled table, in every
    # feature but the levels some site withheld a count of.
    encoded = [encoder.encode(site, f"site {index}") for index, site in enumerate(sites)]
    order = np.argsort(np.concatenate([site.index.to_numpy() for site in sites]))
    x = np.concatenate([features for features, _ in encoded])[order]
    y = np.concatenate([labels for _, labels in encoded if labels is not None])[order]
    assert np.array_equal(y, adult.y_train)
    names = encoder.feature_names
    builtin = [name.replace("=missing", "=<missing>") for name in adult.feature_names]
    assert set(builtin) <= set(names)
    arrived, true = level_counts(schema, summed), level_counts(schema, true_sum)
    withheld = [name for name in builtin if arrived.get(name) != true.get(name)]
    exact = [name for name in builtin if name not in withheld]
    # Below 10 rows at some site (Holand-Netherlands has 1 in all), or withheld beside one that was.
    assert {"native-country=Holand-Netherlands", "workclass=Never-worked", "occupation=Armed-Forces"} <= set(withheld)
    assert {"workclass=<missing>", "marital-status=Widowed", "workclass=Federal-gov"} <= set(withheld)
    assert len(exact) > 60 and all(name in exact for name in builtin if name not in arrived)  # numbers
    np.testing.assert_allclose(
        x[:, [names.index(name) for name in exact]],
        adult.x_train[:, [builtin.index(name) for name in exact]],
        rtol=1e-6,
        atol=1e-6,
    )
    # A withheld level's frequency is the rows that arrived over all rows: below the pooled one, and
    # the one-hot standardised with it.
    rows = len(table)
    for name in withheld:
        column_name, level = name.split("=", 1)
        column = encoder.columns[[each.name for each in encoder.columns].index(column_name)]
        frequency = column.means[column.levels.index(level)]
        assert frequency == arrived[name] / rows and arrived[name] < true[name]
        cells = table[column_name]
        hot = (cells.isna() if level == "<missing>" else cells == level).to_numpy()
        std = math.sqrt(frequency * (1 - frequency)) or 1.0
        np.testing.assert_allclose(x[:, names.index(name)], (hot - frequency) / std, rtol=1e-6, atol=1e-6)
    # The schema's remaining features: <missing> levels of columns without gaps (always 0), and hours-per-day.
    extra = [name for name in names if name not in builtin]
    assert all(name.endswith("=<missing>") for name in extra[:-1]) and extra[-1] == "hours-per-day"
    assert not x[:, [names.index(name) for name in extra[:-1]]].any()
    pooled = table["hours-per-day"]
    expected = (pooled - pooled.mean()) / pooled.std(ddof=0)
    np.testing.assert_allclose(x[:, names.index("hours-per-day")], expected, rtol=1e-6, atol=1e-6)


def test_learned_categories_keep_buckets_with_enough_rows_and_never_name_a_value(adult_table: pd.DataFrame) -> None:
    schema = Schema(
        label="income",
        classes=("<=50K", ">50K"),
        columns=(Column("age", "numeric"), Column("native-country", "categorical")),
        missing="impute",
        hash_buckets=64,
        min_category_count=30,
    )
    sites = adult_sites(adult_table)
    summed = np.sum([statistics_vector(schema, site) for site in sites], axis=0)
    encoder = encoder_from_statistics(schema, summed)
    countries = adult_table["native-country"]
    buckets = countries.dropna().map(lambda value: category_bucket("native-country", value, 64))
    pooled = buckets.value_counts()
    column = encoder.columns[1]
    # Sites withhold buckets below 30 rows, so the sum holds a bucket only where some site let out its count
    # (30 rows or more): those are the levels, fewer than the buckets with 30 rows pooled.
    *arrived, missing = summed[statistics_slices(schema)[1][1]].astype(int).tolist()
    assert column.buckets == tuple(np.flatnonzero(arrived))
    assert set(column.buckets) < set(pooled[pooled >= 30].index)
    assert 2 <= len(column.buckets) < pooled.size  # some buckets are kept, the rare ones pooled
    assert missing == countries.isna().sum()  # no site has a small count of gaps
    # <other> holds every row not in a kept bucket or <missing>: rare values, withheld ones included.
    kept = [arrived[b] for b in column.buckets]
    expected = [*kept, len(adult_table) - sum(kept) - missing, missing]
    np.testing.assert_allclose(column.means, np.array(expected) / len(adult_table), rtol=1e-15)
    assert not any(value in " ".join(encoder.feature_names) for value in countries.dropna().unique())
    # A value no site has seen, or one in a rare bucket, is <other>; a gap is <missing>.
    rare = countries.dropna()[buckets.map(pooled) < 30].iloc[0]
    rows = pd.DataFrame({"age": [30, 30, 30], "native-country": ["Atlantis", rare, None]})
    features, labels = encoder.encode(rows, "new.csv")
    assert labels is None
    block = features[:, 1:]
    hot = np.isclose(block, ((1 - np.array(column.means)) / np.array(column.stds)).astype(np.float32))
    other, missing = column.levels.index("<other>"), column.levels.index("<missing>")
    assert [np.flatnonzero(row).tolist() for row in hot] == [[other], [other], [missing]]


LISTED = ("a", "b", "c", "d")
LEARNT = tuple(f"v{index}" for index in range(8))


@st.composite
def federations(draw: st.DrawFn) -> tuple[Schema, list[pd.DataFrame]]:
    """A schema with a numeric, a listed and a learnt column, and one to four small site tables.

    Few rows, few values and few hash buckets, so that counts below min_category_count,
    bucket collisions, sites smaller than min_category_count and (under "impute") a few
    missing categories are all common.
    """
    impute = draw(st.booleans())
    schema = Schema(
        label="y",
        classes=("0", "1"),
        columns=(Column("x", "numeric"), Column("listed", "categorical", LISTED), Column("learnt", "categorical")),
        missing="impute" if impute else "refuse",
        max_abs=1000.0,
        hash_buckets=draw(st.integers(2, 12)),
        min_category_count=draw(st.integers(1, 12)),
    )
    gap = st.none() if impute else st.nothing()
    # Numbers without gaps: a column no site has a value of is refused, and numbers are not what is tested.
    values = {"x": st.integers(-1000, 1000), "listed": st.sampled_from(LISTED) | gap,
              "learnt": st.sampled_from(LEARNT) | gap}  # fmt: skip
    sites = []
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(st.integers(1, 40))
        sites.append(pd.DataFrame({name: draw(st.lists(each, min_size=rows, max_size=rows))
                                   for name, each in values.items()}))  # fmt: skip
    return schema, sites


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(federations())
def test_every_sum_of_sites_holds_no_categorical_count_below_min_category_count(
    federation: tuple[Schema, list[pd.DataFrame]],
) -> None:
    schema, sites = federation
    least = schema.min_category_count
    sent = [statistics_vector(schema, site) for site in sites]
    true = [statistics_vector(unsuppressed(schema), site) for site in sites]
    categorical = [where for column, where in statistics_slices(schema) if column.kind == "categorical"]
    for vector, counts in zip(sent, true):
        # Row count and numeric statistics go out as they are; a count is withheld whole, never changed,
        # and at most one count of min_category_count or more per column (the smallest) goes with the small ones.
        assert vector[0] == counts[0]
        assert all(np.array_equal(vector[where], counts[where]) for column, where in statistics_slices(schema)
                   if column.kind == "numeric")  # fmt: skip
        for where in categorical:
            cells, truth = vector[where], counts[where]
            assert np.all((cells == truth) | (cells == 0))
            assert np.count_nonzero((cells == 0) & (truth >= least)) <= 1
    # Whatever set of sites the aggregator sums (and so, by differencing two sums, any one site), every count
    # it decodes is 0 or at least min_category_count, and so is a column's withheld total (rows minus its
    # counts), but for the whole tables of sites with fewer rows than that, whose row count it is told anyway.
    for subset in nonempty_subsets(len(sites)):
        summed = np.sum([sent[index] for index in subset], axis=0)
        small_tables = sum(len(sites[index]) for index in subset if len(sites[index]) < least)
        for where in categorical:
            cells = summed[where]
            assert np.all((cells == 0) | (cells >= least)), (cells, least)
            withheld = summed[0] - cells.sum() - small_tables
            assert withheld == 0 or withheld >= least, (withheld, least)
    # The sum still gives one encoder, whose numbers are exactly those of the unsuppressed statistics.
    encoder = encoder_from_statistics(schema, np.sum(sent, axis=0))
    everything = encoder_from_statistics(unsuppressed(schema), np.sum(true, axis=0))
    assert encoder.rows == everything.rows and encoder.columns[0] == everything.columns[0]
    assert all(0 <= mean <= 1 and std > 0 for column in encoder.columns[1:] for mean, std in
               zip(column.means, column.stds))  # fmt: skip


def test_one_rare_row_never_shows_in_a_sites_statistics_nor_in_any_sum(adult_table: pd.DataFrame) -> None:
    # The review's attack: hash every candidate value with the public bucket function and read its count.
    countries = adult_table["native-country"]
    sites = adult_sites(adult_table)
    holland = countries == "Holand-Netherlands"
    assert holland.sum() == 1 and holland[sites[0].index].sum() == 1  # one row in all, at the youngest site
    listed = draft_schema(adult_table, "income", ["age", "native-country"])
    learnt = dataclasses.replace(listed, columns=(listed.columns[0], Column("native-country", "categorical")))
    candidates = countries.dropna().unique()
    categories = listed.columns[1].categories
    assert categories is not None
    for schema in (listed, learnt):
        assert schema.min_category_count == 10
        where = statistics_slices(schema)[1][1]
        if schema is listed:
            cells = {value: categories.index(value) for value in candidates}
        else:
            cells = {value: category_bucket("native-country", value, schema.hash_buckets) for value in candidates}
        assert list(cells.values()).count(cells["Holand-Netherlands"]) == 1  # its bucket is its alone
        # Without suppression the sum reads Holand-Netherlands = 1.
        revealed = np.sum([statistics_vector(unsuppressed(schema), site) for site in sites], axis=0)[where]
        assert revealed[cells["Holand-Netherlands"]] == 1
        vectors = [statistics_vector(schema, site) for site in sites]
        for subset in nonempty_subsets(len(sites)):
            summed = securely_summed([vectors[index] for index in subset])
            counts = summed[where]
            assert counts[cells["Holand-Netherlands"]] == 0
            assert all(counts[cell] == 0 or counts[cell] >= 10 for cell in cells.values())
            assert summed[0] - counts.sum() >= 10  # the rows withheld in all: never a small count either
    # Withholding the one row alone would leave it to read off as rows minus counts: 21 - 20 = 1.
    tiny = pd.DataFrame({"age": [40] * 21, "native-country": ["Holand-Netherlands"] + ["United-States"] * 20})
    vector = statistics_vector(listed, tiny)
    assert vector[0] == 21 and not vector[statistics_slices(listed)[1][1]].any()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-LARGEST_SQUARES, LARGEST_SQUARES) | st.sampled_from([LARGEST_SQUARES, -LARGEST_SQUARES]),
                min_size=1, max_size=STATISTICS_MAX_SITES))  # fmt: skip
def test_limbs_stay_below_two_to_the_47_and_their_sums_join_exactly(values: list[int]) -> None:
    count = limb_count(LARGEST_SQUARES)
    limbs = [split_limbs(value, count) for value in values]
    assert all(abs(limb) < 2**COORDINATE_BITS for each in limbs for limb in each)
    assert all(join_limbs(each) == value for each, value in zip(limbs, values))
    # Adding up to 64 sites' limbs as float64, as the secure sum does, loses nothing.
    summed = np.sum(np.array(limbs, dtype=np.float64), axis=0)
    assert join_limbs([int(limb) for limb in summed]) == sum(values)


def test_statistics_at_the_magnitude_bound_are_exact_for_64_sites() -> None:
    schema = Schema("y", ("0", "1"), (Column("x", "numeric"),), max_abs=1e9, fraction_bits=22)
    rng = np.random.default_rng(0)
    x = np.concatenate([[1e9, -1e9, 1e9, 1e9 - 2.0**-22], rng.uniform(-1e9, 1e9, size=200)])
    table = pd.DataFrame({"x": x})
    vector = statistics_vector(schema, table)
    assert vector.shape == (statistics_dimension(schema),)
    assert np.abs(vector).max() < 2**COORDINATE_BITS
    encoder = encoder_from_statistics(schema, securely_summed([vector] * STATISTICS_MAX_SITES))
    assert encoder.rows == 64 * len(x)
    quantised = [int(value) for value in np.rint(np.ldexp(x, 22))]
    mean = Fraction(sum(quantised), len(x) * 2**22)
    variance = Fraction(sum(q * q for q in quantised), len(x) * 2**44) - mean * mean
    assert encoder.columns[0].means == (float(mean),)
    assert encoder.columns[0].stds == (math.sqrt(variance),)
    with pytest.raises(ConfigError, match=r"absolute size 1\.1e\+09, above the \[schema\] max_abs = 1e\+09"):
        statistics_vector(schema, pd.DataFrame({"x": [1.1e9]}))


def test_a_summed_vector_that_is_not_a_sum_of_statistics_is_refused(small_schema: Schema) -> None:
    with pytest.raises(ConfigError, match=r"shape \(3,\), but this schema's are \(\d+,\); every site must use"):
        encoder_from_statistics(small_schema, np.zeros(3))
    fractional = np.full(statistics_dimension(small_schema), 0.5)
    with pytest.raises(ConfigError, match=r"not integers below 2\^53; sum them with fractional_bits = 0"):
        encoder_from_statistics(small_schema, fractional)
    overfull = statistics_vector(small_schema, pd.DataFrame({"age": [30] * 12, "color": ["red"] * 12}))
    overfull[0] = 11
    with pytest.raises(ConfigError, match=r"inconsistent \(column 'color' counts 12 cells, some negative or more"):
        encoder_from_statistics(small_schema, overfull)


@pytest.mark.parametrize(
    ("cells", "sent"),
    [
        ([25, 3, 40, 0], [0, 0, 40, 0]),  # 3 withheld, and the smallest sent count (25) with it
        ([25, 12, 40], [25, 12, 40]),  # nothing below 10: all sent
        ([25, 4, 6, 40], [25, 0, 0, 40]),  # 10 withheld together: enough on their own
        ([3, 2], [0, 0]),  # all withheld: the total is the row count, sent anyway
        ([12, 12, 5], [0, 12, 0]),  # a tie: the first of the smallest goes
    ],
)
def test_the_small_cell_rule_withholds_small_counts_and_never_leaves_a_small_withheld_total(
    cells: list[int], sent: list[int]
) -> None:
    counts = np.array(cells, dtype=np.int64)
    result = suppress_small_cells(counts, 10)
    assert result.tolist() == sent and result.dtype == counts.dtype
    assert counts.tolist() == cells  # the input is left as it was
    withheld = counts.sum() - result.sum()
    assert withheld == 0 or withheld >= 10 or not result.any()
