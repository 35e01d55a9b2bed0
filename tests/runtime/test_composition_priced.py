"""What counting the worst group's composition costs the headline, said where a plan is written and checked;
and the `<missing>` level an imputing schema adds, listed only where a row may be missing.

The first walk turned composition on and saw the worst-group interval go from +/- 0.15 to +/- 0.50 over the
same 695 held-out rows with nothing saying why, and a `<missing>` sex group in a federation with no empty cell.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedfair import cli
from fedfair.datasets.schema import MISSING_LEVEL, Column, Schema
from fedfair.fairness import tail
from fedfair.privacy.distributed import noise_excess
from fedfair.runtime.composition_counts import (
    CompositionColumn,
    composition_columns,
    composition_from_sums,
    local_counts,
    suggested_composition,
)
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.plan.composition_price import headline_half_widths
from fedfair.runtime.plan.privacy import answer_release
from fedfair.runtime.plan.templates import COMPOSITION_PLACEHOLDER

SCHEMA = Schema(
    "outcome",
    ("no", "yes"),
    (
        Column("age", "numeric"),
        Column("ward", "categorical", ("a", "b", "c", "d")),
        Column("sex", "categorical", ("female", "male")),
        Column("country", "categorical", None),
        Column("shift", "categorical", ("day", "night", "weekend")),
    ),
    missing="impute",
)
SEX = CompositionColumn("sex", ("female", "male", MISSING_LEVEL))
THRESHOLD = 1.0


# ---------------------------------------------------------------- the price


def test_suggested_columns_are_countable_with_the_fewest_categories_first() -> None:
    assert suggested_composition(SCHEMA) == ("sex", "shift")
    assert suggested_composition(SCHEMA, 3) == ("sex", "shift", "ward")
    composition_columns(SCHEMA, suggested_composition(SCHEMA, 3))  # each one the plan accepts
    numbers_only = Schema("outcome", ("no", "yes"), (Column("age", "numeric"),))
    assert suggested_composition(numbers_only) == ("outcome",)


def test_the_widened_half_width_is_the_runtimes_own_noise_ratio() -> None:
    """The figure is what the runtime adds: the final answer's release with the counts beside it, against
    the release without them (each coordinate's noise sd is sqrt(2 mu), so the half-width scales with it)."""
    plan = load_aggregator_plan(Path(__file__).resolve().parents[2] / "aggregator" / "plan.toml")
    privacy = plan.privacy
    assert privacy.report_epsilon is not None
    alone = tail.expected_half_width(695, 0.3, privacy.report_epsilon, privacy.delta, 3.0)
    previous = alone
    for names in (("sex",), ("sex", "shift"), ("sex", "shift", "ward")):
        columns = composition_columns(SCHEMA, names)
        without, composed = headline_half_widths(privacy.report_epsilon, privacy.delta, 695, 0.3, 3.0, columns)
        ratio = math.sqrt(answer_release(privacy, columns).mu / answer_release(privacy, ()).mu)
        assert without == alone and composed == pytest.approx(alone * ratio, rel=1e-12)
        assert composed > previous  # each column moves 2 more counts per record: more noise everywhere
        previous = composed
    # About the walk's figures over 695 rows: +/- 0.14 alone, more than twice that with two columns.
    two = headline_half_widths(
        privacy.report_epsilon, privacy.delta, 695, 0.3, 3.0, composition_columns(SCHEMA, ("sex", "shift"))
    )
    assert two[1] / two[0] > 2.0
    assert headline_half_widths(1.0, 1e-5, 695, 0.3, 3.0, ()) == (alone, alone)


@pytest.fixture()
def sample(tmp_path: Path) -> Path:
    """A site's table: a number, two categories of few values, one of many, and a label."""
    rng = np.random.default_rng(0)
    rows = 400
    path = tmp_path / "sample.csv"
    pd.DataFrame(
        {
            "age": rng.integers(18, 90, rows),
            "ward": rng.choice([f"w{i}" for i in range(6)], rows),
            "sex": rng.choice(["female", "male"], rows),
            "shift": rng.choice(["day", "night", "weekend"], rows),
            "outcome": rng.choice(["no", "yes"], rows),
        }
    ).to_csv(path, index=False)
    return path


def composition_comment(plan_text: str) -> tuple[list[str], str]:
    """The commented composition line's columns and its note, joined into one line of text."""
    lines = plan_text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("# composition = "))
    example, _, first = lines[start].partition("]")
    notes = [first] + [line for line in lines[start + 1 :] if line.startswith(" " * 33 + "#")][:12]
    names = tomllib.loads(example.removeprefix("# ") + "]")["composition"]
    return names, " ".join(note.strip().removeprefix("#").strip() for note in notes)


def test_init_names_the_tables_columns_and_prices_them(tmp_path: Path, sample: Path) -> None:
    folder = tmp_path / "fed"
    assert cli.main(["init", str(folder), "--sites", "a,b,c", "--csv", str(sample), "--label", "outcome"]) == 0
    plan_path = folder / "aggregator" / "plan.toml"
    names, note = composition_comment(plan_path.read_text())
    assert names == ["sex", "shift"]  # the sample's own columns, the fewest values first: not the demo's race
    plan = load_aggregator_plan(plan_path)
    assert plan.schema is not None and plan.privacy.report_epsilon is not None
    rows = 3 * 100  # three sites like the sample, a quarter of each held out
    excess = noise_excess(3, plan.survivor_floor(3), plan.secure_aggregation.max_colluding)
    without, composed = headline_half_widths(
        plan.privacy.report_epsilon,
        plan.privacy.delta,
        rows,
        plan.objective.rho,
        plan.evaluation.loss_range[1],
        composition_columns(plan.schema, names),
        excess=excess,
    )
    assert (
        f"over {rows:,} held-out rows in all, the worst-group risk's 95% half-width is +/- {without:.2g} "
        f"without them and +/- {composed:.2g} with these columns" in note
    )
    # Turned on as written, the line loads: the columns are ones the plan can count.
    text = plan_path.read_text().replace('# composition = ["sex", "shift"]', 'composition = ["sex", "shift"]')
    plan_path.write_text(text)
    assert load_aggregator_plan(plan_path).evaluation.composition == ("sex", "shift")


def test_init_without_a_table_names_a_placeholder_not_the_demo_datas_columns(tmp_path: Path) -> None:
    folder = tmp_path / "fed"
    assert cli.main(["init", str(folder), "--sites", "a,b,c"]) == 0
    names, note = composition_comment((folder / "aggregator" / "plan.toml").read_text())
    assert tuple(names) == COMPOSITION_PLACEHOLDER
    found = re.search(r"over 2,000 held-out rows in all, .* \+/- ([0-9.]+) without them and \+/- ([0-9.]+) with", note)
    assert found is not None, note
    assert float(found.group(2)) > 2 * float(found.group(1))


def test_data_check_prices_the_plans_composition_or_the_one_it_would_have(
    tmp_path: Path, sample: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "fed"
    assert cli.main(["init", str(folder), "--sites", "a,b,c", "--csv", str(sample), "--label", "outcome"]) == 0
    plan_path = folder / "aggregator" / "plan.toml"
    plan = load_aggregator_plan(plan_path)
    assert plan.schema is not None and plan.privacy.report_epsilon is not None
    excess = noise_excess(3, plan.survivor_floor(3), plan.secure_aggregation.max_colluding)

    def widths(names: tuple[str, ...]) -> tuple[float, float]:
        assert plan.schema is not None and plan.privacy.report_epsilon is not None
        columns = composition_columns(plan.schema, names)
        return headline_half_widths(
            plan.privacy.report_epsilon, plan.privacy.delta, 100, 0.3, 3.0, columns, excess=excess
        )

    capsys.readouterr()
    assert cli.main(["data", "check", "--plan", str(plan_path), "--csv", str(sample)]) == 0
    said = capsys.readouterr().out
    without, composed = widths(("sex", "shift"))
    assert (
        f'[evaluation] composition = ["sex", "shift"] would send counts in the final answer and widen its '
        f"worst-group risk over these 100 held-out rows from +/- {without:.2g} to +/- {composed:.2g}" in said
    )
    # The same before-and-after at the data check's own figure for the rows alone (the sizing line's).
    assert f"alone would give the final worst-group risk +/- {without:.2g}" in said
    plan_path.write_text(plan_path.read_text().replace("every = 5 ", 'composition = ["ward"]\nevery = 5 ', 1))
    capsys.readouterr()
    assert cli.main(["data", "check", "--plan", str(plan_path), "--csv", str(sample)]) == 0
    said = capsys.readouterr().out
    without, composed = widths(("ward",))
    assert (
        f"the plan's [evaluation] composition (ward) sends its counts in the final answer, which widens its "
        f"worst-group risk over these 100 held-out rows to +/- {composed:.2g} (+/- {without:.2g} without it" in said
    )


# ---------------------------------------------------------------- the <missing> level


def counted(sex: Sequence[str | None], losses: list[float], minimum: int = 1) -> np.ndarray:
    """One site's composition counts for sex, its gaps at the <missing> level (as held_out_levels codes them)."""
    codes = {"female": 0, "male": 1, None: 2}
    levels = np.array([[codes[value]] for value in sex], dtype=np.int64)
    return local_counts((SEX,), levels, np.array(losses), THRESHOLD, minimum)


def levels_of(reported: dict[str, object]) -> list[str]:
    columns = reported["columns"]
    assert isinstance(columns, dict)
    return [cell["level"] for cell in columns["sex"]]


def test_no_missing_cell_no_missing_group_when_exact() -> None:
    # 30 women, 30 men, none missing, half of each above c: the walk's federation had no empty cell.
    full = counted(["female"] * 30 + ["male"] * 30, [2.0, 0.5] * 30)
    assert levels_of(composition_from_sums((SEX,), full, THRESHOLD, 10)) == ["female", "male"]
    # A site that withheld its 3 missing rows (below the minimum) sums to 0 there too, but its categories
    # then miss 3 rows: the level stays, suppressed, and the shares do not add up to 100%.
    withheld = counted(["female"] * 30 + ["male"] * 30 + [None] * 3, [2.0, 0.5] * 31 + [2.0], minimum=10)
    assert withheld[-1] == 0
    reported = composition_from_sums((SEX,), withheld, THRESHOLD, 10)
    assert levels_of(reported) == ["female", "male", MISSING_LEVEL]
    # And real gaps, above the minimum, are a group like any other.
    gaps = counted(["female"] * 30 + ["male"] * 30 + [None] * 20, [2.0, 0.5] * 40)
    cells = {cell["level"]: cell for cell in composition_from_sums((SEX,), gaps, THRESHOLD, 10)["columns"]["sex"]}
    assert cells[MISSING_LEVEL]["rows"] == 20 and cells[MISSING_LEVEL]["worst_rows"] == 10


def test_noise_alone_is_not_a_missing_group() -> None:
    """Noised, a zero count reads as a group of the noise's size (std 10 reads 10 or more one time in 6); the
    level is listed only when its count is beyond the bound every count is within, all at once at 95%."""
    rng = np.random.default_rng(3)
    none_missing = counted(["female"] * 300 + ["male"] * 300, [2.0, 0.5] * 300)
    many_missing = counted(["female"] * 300 + ["male"] * 300 + [None] * 300, [2.0, 0.5] * 450)
    std, trials = 10.0, 200
    listed_without = listed_with = 0
    for _ in range(trials):
        noise = rng.normal(0.0, std, none_missing.size)
        listed_without += MISSING_LEVEL in levels_of(
            composition_from_sums((SEX,), none_missing + noise, THRESHOLD, 10, std)
        )
        listed_with += MISSING_LEVEL in levels_of(
            composition_from_sums((SEX,), many_missing + noise, THRESHOLD, 10, std)
        )
    # Listed only on the bound's failure event (probability at most 5% a trial).
    assert listed_without <= stats.binom.isf(1e-6, trials, 0.05)
    # 300 missing rows are 30 sds from 0, far beyond the bound (about 4 sds): always listed.
    assert listed_with == trials
