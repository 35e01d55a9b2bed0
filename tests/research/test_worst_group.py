"""The composition table's rows: mean and spread over seeds, absent cells as 0, the paper's layout."""

from __future__ import annotations

import pytest

from fedfair.research.worst_group import composition_markdown, composition_rows


def cell(race: str, label: str, worst: float, overall: float) -> dict[str, object]:
    return {"race": race, "label": label, "worst_share": worst, "overall_share": overall}


def test_rows_average_the_seeds_and_count_a_missing_cell_as_zero() -> None:
    seed0 = {"composition": {"0.1": [cell("A", "0", 0.75, 0.5), cell("B", "0", 0.25, 0.5)]}}
    seed1 = {"composition": {"0.1": [cell("A", "0", 1.0, 0.5)]}}  # no B row in its worst group
    rows = composition_rows({0.1: [seed0, seed1]}, "race")
    by_race = {row["race"]: row for row in rows}
    assert by_race["A"]["worst_share_mean"] == pytest.approx(0.875)
    assert by_race["A"]["worst_share_std"] == pytest.approx(0.125)
    assert by_race["B"]["worst_share_mean"] == pytest.approx(0.125)
    assert by_race["B"]["overall_share"] == 0.5
    # A diverged seed has no worst group: it is left out, not counted as shares of 0.
    diverged = {"diverged": "the model diverged, lower --lr"}
    assert composition_rows({0.1: [seed0, seed1, diverged]}, "race") == rows


def test_the_markdown_has_a_row_per_rho_and_everyone() -> None:
    text_rows = [
        {"rho": rho, "race": race, "label": "1", "worst_share_mean": worst, "overall_share": "0.5"}
        for rho, race, worst in (("0.1", "A", "0.9"), ("0.1", "B", "0.1"), ("0.3", "A", "0.6"), ("0.3", "B", "0.4"))
    ]
    lines = composition_markdown(text_rows, "race").splitlines()
    assert lines[0] == "| | A 1 | B 1 |"
    assert lines[2:] == ["| worst 10% | 90.0 | 10.0 |", "| worst 30% | 60.0 | 40.0 |", "| everyone | 50.0 | 50.0 |"]
