"""The worst group's composition: hand-counted on a small table, shares that sum to 1, and the
fractional boundary sample weighed exactly as CVaR weighs it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.core.objective import cvar
from fedfair.fairness.composition import (
    above_threshold_weights,
    composition,
    format_composition,
    worst_fraction_weights,
)

# Ten people: loss, race, label. The worst 30% are rows 0, 3 and 7 (losses 9, 8, 7).
LOSSES = np.array([9.0, 1.0, 2.0, 8.0, 0.5, 3.0, 0.1, 7.0, 0.2, 4.0])
RACE = np.array(["Black", "White", "White", "White", "Other", "White", "Black", "Other", "White", "White"])
LABEL = np.array(["1", "0", "0", "1", "0", "1", "0", "0", "0", "1"])


def test_a_small_table_matches_a_hand_count() -> None:
    shares = composition(worst_fraction_weights(LOSSES, 0.3), {"race": RACE, "label": LABEL})
    by_cell = {share.cell: share for share in shares}
    # Worst three: (Black, 1), (White, 1), (Other, 0); everyone: 10 rows in 5 cells.
    assert {cell: share.worst_share for cell, share in by_cell.items()} == pytest.approx(
        {("Black", "0"): 0.0, ("Black", "1"): 1 / 3, ("Other", "0"): 1 / 3, ("White", "0"): 0.0,
         ("White", "1"): 1 / 3}
    )  # fmt: skip
    assert {cell: share.rows for cell, share in by_cell.items()} == {
        ("Black", "0"): 1, ("Black", "1"): 1, ("Other", "0"): 2, ("White", "0"): 3, ("White", "1"): 3,
    }  # fmt: skip
    assert by_cell[("White", "0")].overall_share == pytest.approx(0.3)
    assert [share.cell for share in shares] == sorted(by_cell)


def test_the_boundary_sample_counts_by_its_fraction_as_in_cvar() -> None:
    # rho = 0.25 of 10 rows is 2.5 rows: rows 0 and 3 whole, row 7 (Other) by half.
    weights = worst_fraction_weights(LOSSES, 0.25)
    assert weights.sum() == pytest.approx(2.5)
    assert float(weights @ LOSSES) / 2.5 == pytest.approx(cvar(LOSSES, 0.25))
    other = next(share for share in composition(weights, {"race": RACE}) if share.cell == ("Other",))
    assert other.worst_rows == pytest.approx(0.5) and other.worst_share == pytest.approx(0.2)


def test_above_a_threshold_counts_whole_rows() -> None:
    shares = composition(above_threshold_weights(LOSSES, 3.5), {"race": RACE})
    # Above 3.5: rows 0 (Black), 3 (White), 7 (Other), 9 (White).
    assert {share.cell: share.worst_rows for share in shares} == {("Black",): 1, ("Other",): 1, ("White",): 2}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=60),
    st.floats(0.01, 1.0),
    st.integers(1, 4),
)
def test_shares_sum_to_one(losses: list[float], rho: float, groups: int) -> None:
    values = np.array(losses)
    column = np.array([f"g{index % groups}" for index in range(values.size)])
    shares = composition(worst_fraction_weights(values, rho), {"group": column})
    assert sum(share.worst_share for share in shares) == pytest.approx(1.0)
    assert sum(share.overall_share for share in shares) == pytest.approx(1.0)
    assert sum(share.rows for share in shares) == values.size
    assert sum(share.worst_rows for share in shares) == pytest.approx(rho * values.size)


def test_bad_input_names_the_problem() -> None:
    with pytest.raises(ConfigError, match="rho must be in"):
        worst_fraction_weights(LOSSES, 0.0)
    with pytest.raises(ConfigError, match="NaN"):
        worst_fraction_weights(np.array([1.0, np.nan]), 0.5)
    with pytest.raises(ConfigError, match="column 'race' has 3 values for 10 samples"):
        composition(np.ones(10), {"race": RACE[:3]})
    with pytest.raises(ConfigError, match="at least one column"):
        composition(np.ones(10), {})
    with pytest.raises(ConfigError, match="the worst group is empty"):
        composition(above_threshold_weights(LOSSES, 100.0), {"race": RACE})


def test_the_text_table_has_a_line_per_cell() -> None:
    shares = composition(worst_fraction_weights(LOSSES, 0.3), {"race": RACE})
    text = format_composition(shares, ["race"], "worst 30%")
    assert text.splitlines()[0] == "worst 30%"
    assert "Black" in text.splitlines()[2] and "33.3%" in text.splitlines()[2] and "20.0%" in text.splitlines()[2]
    assert len(text.splitlines()) == 2 + len(shares)
