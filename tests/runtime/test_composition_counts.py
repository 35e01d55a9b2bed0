"""The worst group's composition from per-site counts: the columns a plan may name, each site's counts
under the small-cell rule, and the decoded sums against the pooled composition of every site's rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from fedfair.core.errors import ConfigError
from fedfair.datasets.schema import MISSING_LEVEL, Column, Schema
from fedfair.fairness.composition import above_threshold_weights, composition
from fedfair.runtime.composition_counts import (
    joint_suppression,
    TOTALS,
    CompositionColumn,
    composition_columns,
    composition_from_sums,
    composition_sensitivity,
    composition_length,
    held_out_levels,
    local_counts,
)

RACES = ("white", "black", "asian", "other")
SCHEMA = Schema(
    "income",
    ("low", "high"),
    (
        Column("age", "numeric"),
        Column("race", "categorical", RACES),
        Column("sex", "categorical", ("female", "male")),
        Column("country", "categorical", None),
    ),
    missing="impute",
    min_category_count=10,
)
THRESHOLD = 1.0


def site_table(rng: np.random.Generator, rows: int, race_weights: tuple[float, ...]) -> pd.DataFrame:
    """Held-out rows of one site: a few gaps in sex (the schema imputes them)."""
    sex = rng.choice(["female", "male"], rows).astype(object)
    sex[rng.random(rows) < 0.03] = None
    return pd.DataFrame(
        {
            "age": rng.integers(18, 90, rows),
            "race": rng.choice(RACES, rows, p=race_weights),
            "sex": sex,
            "country": rng.choice(["x", "y"], rows),
            "income": rng.choice(["low", "high"], rows),
        }
    )


def sites(seed: int = 0) -> list[tuple[pd.DataFrame, np.ndarray]]:
    """Three sites' held-out tables and losses; the third has few 'other' rows, some of them above c."""
    rng = np.random.default_rng(seed)
    found = []
    for rows, weights in ((900, (0.6, 0.2, 0.1, 0.1)), (500, (0.3, 0.5, 0.1, 0.1)), (300, (0.8, 0.1, 0.09, 0.01))):
        table = site_table(rng, rows, weights)
        losses = rng.exponential(0.7, rows) + 0.8 * (table["race"] == "black").to_numpy()
        found.append((table, losses))
    return found


def summed(
    columns: tuple[CompositionColumn, ...], data: list[tuple[pd.DataFrame, np.ndarray]], minimum: int
) -> np.ndarray:
    """The secure sum of every site's counts (plain addition: secure aggregation adds the same integers)."""
    return np.sum(
        [
            local_counts(columns, held_out_levels(SCHEMA, columns, table, "site"), losses, THRESHOLD, minimum)
            for table, losses in data
        ],
        axis=0,
    )


def pooled(column: str, data: list[tuple[pd.DataFrame, np.ndarray]]) -> dict[str, object]:
    """fedfair.fairness.composition on every site's held-out rows together, by level."""
    losses = np.concatenate([losses for _, losses in data])
    values = np.concatenate([table[column].fillna(MISSING_LEVEL).to_numpy(dtype=str) for table, _ in data])
    return {share.cell[0]: share for share in composition(above_threshold_weights(losses, THRESHOLD), {column: values})}


# ---------------------------------------------------------------- the columns a plan may name


def test_the_label_and_listed_categorical_columns_are_counted_in_the_plans_order() -> None:
    columns = composition_columns(SCHEMA, ["sex", "income", "race"])
    assert columns == (
        CompositionColumn("sex", ("female", "male", MISSING_LEVEL)),  # the schema imputes gaps
        CompositionColumn("income", ("low", "high"), label=True),
        CompositionColumn("race", (*RACES, MISSING_LEVEL)),
    )
    assert composition_length(columns) == TOTALS + 2 * (3 + 2 + 5)
    assert composition_columns(SCHEMA, []) == () and composition_length(()) == 0
    refusing = Schema("income", ("low", "high"), (Column("race", "categorical", RACES),))
    assert composition_columns(refusing, ["race"])[0].levels == RACES  # no gaps, no <missing> level


@pytest.mark.parametrize(
    ("schema", "names", "message"),
    [
        (SCHEMA, ["rase"], r"names 'rase', which is not a column of the \[schema\] \(did you mean 'race'\?\); name "
         r"categorical columns with listed categories or the label 'income'"),
        (SCHEMA, ["age"], r"names 'age', a numeric column, which has no categories to count; remove it, or bin it"),
        (SCHEMA, ["country"], r"names 'country', whose categories are learnt .*; list its categories in the \[schema\]"),
        (SCHEMA, ["race", "race"], r"lists 'race' twice"),
        (None, ["race"], r"composition needs a \[schema\].*add a \[schema\] or remove composition"),
    ],
)  # fmt: skip
def test_a_column_that_cannot_be_counted_is_refused_with_the_fix(
    schema: Schema | None, names: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        composition_columns(schema, names)
    assert str(caught.value).startswith("[evaluation] composition") and "\n" not in str(caught.value)


def test_held_out_levels_are_the_tables_codes_with_gaps_at_missing() -> None:
    table = pd.DataFrame({"race": ["asian", "white"], "sex": [None, "male"], "income": ["high", "low"]})
    columns = composition_columns(SCHEMA, ["race", "sex", "income"])
    assert held_out_levels(SCHEMA, columns, table, "t").tolist() == [[2, 2, 1], [0, 1, 0]]
    with pytest.raises(ConfigError, match=r"t: column 'race' has values not among its \[schema\] categories"):
        held_out_levels(SCHEMA, columns, table.assign(race=["asian", "martian"]), "t")


# ---------------------------------------------------------------- one site's counts


def test_a_sites_counts_are_its_rows_above_c_and_all_its_rows_each_column_suppressed() -> None:
    columns = composition_columns(SCHEMA, ["race", "income"])
    levels = np.array([[0, 0]] * 45 + [[1, 1]] * 20 + [[3, 1]] * 4)
    losses = np.array([2.0] * 20 + [0.5] * 25 + [2.0] * 12 + [0.5] * 8 + [2.0, 0.1, 0.1, 0.1])
    counts = local_counts(columns, levels, losses, THRESHOLD, 10)
    assert counts[:TOTALS].tolist() == [33, 69]  # rows above c, rows: sent as they are
    race_worst, race_all, income_worst, income_all = np.split(counts[TOTALS:], np.cumsum([5, 5, 2]))
    # 'other' (1 above c, 3 at or below) is withheld, and with it 'black', the smallest sent, since the
    # withheld totals (1 above, 3 below, 4 rows) would otherwise give them by subtraction.
    assert race_worst.tolist() == [20, 0, 0, 0, 0]
    assert race_all.tolist() == [45, 0, 0, 0, 0]
    assert income_worst.tolist() == [20, 13] and income_all.tolist() == [45, 24]
    with pytest.raises(ConfigError, match=r"levels have shape \(69, 2\) for 3 losses"):
        local_counts(columns, levels, losses[:3], THRESHOLD, 10)


def test_a_category_and_its_complement_are_suppressed_together() -> None:
    # The review's leak: all rows 12 less above c 11 gave one person; now neither count is sent.
    sent = joint_suppression(np.array([11, 40, 30]), np.array([12, 55, 41]), 10)
    assert sent.tolist() == [False, True, False]  # and the smallest other, as the withheld 1 row below c would show
    assert joint_suppression(np.array([11, 40]), np.array([12, 55]), 10).tolist() == [False, False]


@given(
    worst=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    extra=st.lists(st.integers(0, 40), min_size=6, max_size=6),
    minimum=st.integers(1, 12),
)
def test_every_count_the_aggregator_can_form_is_zero_or_at_least_the_minimum(
    worst: list[int], extra: list[int], minimum: int
) -> None:
    above = np.array(worst)
    everyone = above + np.array(extra[: above.size])
    sent = joint_suppression(above, everyone, minimum)
    formed = [above[sent], (everyone - above)[sent], everyone[sent]]
    if sent[everyone > 0].any():  # else the withheld totals are the site's totals, which it sends anyway
        formed += [np.array([part[~sent].sum()]) for part in (above, everyone - above, everyone)]
    for counts in formed:
        assert not ((counts > 0) & (counts < minimum)).any()


# ---------------------------------------------------------------- the decoded sum against the pooled rows


def test_without_small_counts_the_federated_composition_is_the_pooled_one() -> None:
    data = sites()
    columns = composition_columns(SCHEMA, ["race", "sex", "income"])
    # min_category_count 1 withholds nothing: every present cell comes back exactly, absent ones as None.
    reported = composition_from_sums(columns, summed(columns, data, 1), THRESHOLD, 1)
    losses = np.concatenate([losses for _, losses in data])
    assert reported["worst_rows"] == int((losses > THRESHOLD).sum()) and reported["rows"] == losses.size
    for column in columns:
        expected = pooled(column.name, data)
        for cell in reported["columns"][column.name]:
            share = expected.get(cell["level"])
            if share is None or share.worst_rows == 0:
                assert cell["worst_rows"] is None and cell["worst_share"] is None
            else:
                assert (cell["worst_rows"], cell["worst_share"]) == (share.worst_rows, share.worst_share)
            if share is not None:
                assert (cell["rows"], cell["overall_share"]) == (share.rows, share.overall_share)


def test_small_counts_come_back_suppressed_never_as_a_number() -> None:
    data = sites()
    minimum = SCHEMA.min_category_count
    columns = composition_columns(SCHEMA, ["race", "sex"])
    reported = composition_from_sums(columns, summed(columns, data, minimum), THRESHOLD, minimum)
    withheld_somewhere = 0
    for column in columns:
        expected = pooled(column.name, data)
        for index, cell in enumerate(reported["columns"][column.name]):
            level = cell["level"]
            for key, share_key, above in (("worst_rows", "worst_share", True), ("rows", "overall_share", False)):
                # What each site let out of this cell under the rule, and what it truly holds.
                sent = true = 0
                for table, losses in data:
                    levels = held_out_levels(SCHEMA, columns, table, "site")[:, columns.index(column)]
                    worst = np.bincount(levels[losses > THRESHOLD], minlength=len(column.levels))
                    everyone = np.bincount(levels, minlength=len(column.levels))
                    cells = worst if above else everyone
                    sent += int(cells[index]) if joint_suppression(worst, everyone, minimum)[index] else 0
                    true += int(cells[index])
                if sent < minimum:
                    assert cell[key] is None and cell[share_key] is None, (level, key)
                else:
                    assert cell[key] == sent >= minimum
                if sent != true:
                    withheld_somewhere += 1
                elif cell[key] is not None:
                    share = expected[level]
                    assert cell[key] == (share.worst_rows if above else share.rows)
                    assert cell[share_key] == (share.worst_share if above else share.overall_share)
    assert withheld_somewhere > 0  # the third site's few 'other' rows, and its gaps in sex
    assert reported["suppressed"] > 0


def test_the_aggregator_applies_the_rule_again_so_a_faulty_sites_small_count_cannot_be_read() -> None:
    columns = (CompositionColumn("race", RACES),)
    # Above c: white 40, black 30, asian 3 (a faulty site sent it unsuppressed), other 0; 73 in all.
    vector = np.array([73, 200, 40, 30, 3, 0, 100, 60, 40, 0], dtype=np.float64)
    reported = composition_from_sums(columns, vector, THRESHOLD, 10)
    cells = {cell["level"]: cell for cell in reported["columns"]["race"]}
    # 3 is withheld, and 30 with it: the reported figures leave 33 rows unattributed, never 3.
    assert [cells[race]["worst_rows"] for race in RACES] == [40, None, None, None]
    assert cells["white"]["worst_share"] == 40 / 73 and reported["worst_rows"] == 73
    assert [cells[race]["rows"] for race in RACES] == [100, 60, 40, None]


@pytest.mark.parametrize(
    ("vector", "message"),
    [
        ([10, 20, 11, 0, 20, 0], r"counts of 'sex' are inconsistent \(negative, or more rows than the total\)"),
        ([10, 20, -1, 0, 20, 0], r"counts of 'sex' are inconsistent"),
        ([10, 20, 10, 0], r"composition sum has shape \(4,\), but the plan's columns make \(6,\)"),
    ],
)
def test_sums_no_honest_sites_add_up_to_are_refused(vector: list[float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        composition_from_sums((CompositionColumn("sex", ("female", "male")),), np.array(vector, float), 1.0, 10)


# ---------------------------------------------------------------- under noise


def test_one_record_moves_the_unsuppressed_counts_by_at_most_the_stated_sensitivity() -> None:
    columns = composition_columns(SCHEMA, ["race", "sex", "income"])
    table, losses = sites()[0]
    levels = held_out_levels(SCHEMA, columns, table, "site")
    l1, l2 = composition_sensitivity(columns)
    assert (l1, l2) == (TOTALS + 2 * len(columns), np.sqrt(TOTALS + 2 * len(columns)))
    whole = local_counts(columns, levels, losses, THRESHOLD, 1)  # minimum 1: nothing withheld
    for row in (int(np.argmax(losses > THRESHOLD)), int(np.argmax(losses <= THRESHOLD))):
        kept = np.arange(losses.size) != row
        moved = np.abs(whole - local_counts(columns, levels[kept], losses[kept], THRESHOLD, 1))
        assert moved.sum() <= l1 and np.sqrt((moved**2).sum()) <= l2 and moved.max() == 1
    # A site's own suppression breaks the bound: one record takes a category of 10 below the minimum, and the
    # withheld 9 take the category of 50 with them; its sent counts move by 2 (10 + 50), not by at most 2.
    before = np.array([10, 50])
    after = np.array([9, 50])
    sent_before, sent_after = joint_suppression(before, before, 10), joint_suppression(after, after, 10)
    assert sent_before.all() and not sent_after.any()
    assert 2 * np.abs(np.where(sent_before, before, 0) - np.where(sent_after, after, 0)).sum() == 120 > l1


def test_noised_counts_are_reported_within_their_bound_and_small_ones_suppressed() -> None:
    data = sites()
    columns = composition_columns(SCHEMA, ["race", "sex", "income"])
    exact = composition_from_sums(columns, summed(columns, data, 1), THRESHOLD, 1)
    clean = summed(columns, data, 1)  # the sites send whole counts; the noise protects them
    rng = np.random.default_rng(5)
    std, minimum, trials, failed = 3.0, SCHEMA.min_category_count, 40, 0
    for _ in range(trials):
        reported = composition_from_sums(columns, clean + rng.normal(0.0, std, clean.size), THRESHOLD, minimum, std)
        assert reported["noise_std"] == std and reported["confidence"] == 0.95
        count_bound, share_bound = reported["count_error_bound"], reported["share_error_bound"]
        missed = False
        for column in columns:
            for cell, truth in zip(reported["columns"][column.name], exact["columns"][column.name]):
                for key, share in (("worst_rows", "worst_share"), ("rows", "overall_share")):
                    if cell[key] is None:
                        continue
                    assert cell[key] >= minimum  # a noised count below the minimum is suppressed
                    true_count = truth[key] or 0
                    true_share = truth[share] or 0.0
                    missed |= abs(cell[key] - true_count) > count_bound
                    missed |= abs(cell[share] - true_share) > share_bound + 1e-12
        failed += missed
    assert failed <= stats.binom.isf(1e-6, trials, 0.05)
    # Sums no honest sites could send are refused when exact, reported when noised.
    broken = np.array([10, 20, -3, 0, 25, 0], dtype=np.float64)
    sex = (CompositionColumn("sex", ("female", "male")),)
    with pytest.raises(ConfigError, match="inconsistent"):
        composition_from_sums(sex, broken, 1.0, 10)
    assert composition_from_sums(sex, broken, 1.0, 10, 2.0)["columns"]["sex"][0]["worst_rows"] is None
