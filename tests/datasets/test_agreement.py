"""Sites agree before round 1: one coding of the label and categories, and tables a federation can use."""

from __future__ import annotations

import logging
import tomllib

import numpy as np
import pandas as pd
import pytest

from fedfair.core.errors import ConfigError
from fedfair.datasets.agreement import (
    batch_shortfall,
    coding_advice,
    disagreeing_codings,
    fewest_training_rows,
    proposed_mapping,
    recode_line,
    recoded,
    site_problems,
    site_warnings,
    training_rows,
)
from fedfair.datasets.check import check_against
from fedfair.datasets.schema import Column, Schema, draft_schema
from fedfair.datasets.values import check_table, label_codes

SCHEMA = Schema(
    label="y",
    classes=("0", "1"),
    columns=(Column("age", "numeric"), Column("sex", "categorical", ("Female", "Male"))),
    missing="impute",
)


def site(
    rows: int = 80, *, label: tuple[object, object] = (0, 1), sex: tuple[str, str] = ("Female", "Male")
) -> pd.DataFrame:
    """A site's table: alternating labels and sexes, ages 20 to 79."""
    index = np.arange(rows)
    return pd.DataFrame(
        {
            "age": 20 + index % 60,
            "sex": np.where(index % 2 == 0, sex[0], sex[1]),
            "y": [label[int(i % 3 == 0)] for i in index],
        }
    )


@pytest.mark.parametrize(
    ("ours", "plan", "mapping", "certain"),
    [
        (["no", "yes"], ["0", "1"], {"no": "0", "yes": "1"}, True),
        (["0", "1"], ["No", "Yes"], {"0": "No", "1": "Yes"}, True),
        (["FALSE", "TRUE"], ["n", "y"], {"FALSE": "n", "TRUE": "y"}, True),
        (["F", "M"], ["Female", "Male"], {"F": "Female", "M": "Male"}, True),
        (["male", "female "], ["Female", "Male"], {"female ": "Female", "male": "Male"}, True),
        # Nothing says which is which: sorted order, flagged as uncertain.
        (["died", "survived"], ["0", "1"], {"died": "0", "survived": "1"}, False),
    ],
)
def test_a_mapping_is_proposed_and_said_to_be_certain_only_when_it_is(
    ours: list[str], plan: list[str], mapping: dict[str, str], certain: bool
) -> None:
    assert proposed_mapping(ours, plan) == (mapping, certain)


def test_no_mapping_is_proposed_between_unrelated_values() -> None:
    assert proposed_mapping(["north", "south", "east"], ["a", "b"]) is None
    # "Ma" abbreviates both: no certain pairing, and three values cannot be paired in order.
    assert proposed_mapping(["Ma", "Fe", "X"], ["Male", "Mallorca", "Female"]) is None
    assert coding_advice("region", ["north", "south"], ["east", "west"], certain_only=True) is None


def test_the_recode_line_is_toml_that_reads_back_as_the_mapping() -> None:
    mapping = {"no": "0", "Yes ": "1", "n/a": "0"}
    line = recode_line("readmitted 30d", mapping)
    assert line.startswith("[data.recode] ")
    assert tomllib.loads(line.removeprefix("[data.recode] ")) == {"readmitted 30d": mapping}


def test_a_label_in_another_coding_is_refused_with_the_mapping_and_accepted_once_mapped() -> None:
    table = site(label=("no", "yes"))
    with pytest.raises(ConfigError) as refused:
        label_codes(SCHEMA, table["y"], "table.csv")
    message = str(refused.value)
    assert "label column 'y' writes 'no', 'yes' where the plan's [schema] says [\"0\", \"1\"]" in message
    assert message.endswith(
        'map them in this institution\'s collaborator.toml, [data.recode] y = { no = "0", yes = "1" }, or recode the cells'
    )
    mapped = recoded(table, {"y": {"no": "0", "yes": "1"}}, "table.csv")
    check_table(SCHEMA, mapped, "table.csv")
    expected = np.array([1 if i % 3 == 0 else 0 for i in range(len(table))])
    assert np.array_equal(label_codes(SCHEMA, mapped["y"], "table.csv"), expected)


def test_a_label_partly_outside_the_classes_is_not_taken_for_another_coding() -> None:
    table = site(label=("0", "1"))
    table.loc[5, "y"] = "maybe"
    with pytest.raises(ConfigError, match=r"values not among the \[schema\] classes .*'maybe'") as refused:
        label_codes(SCHEMA, table["y"], "table.csv")
    assert "[data.recode]" not in str(refused.value)


def test_a_category_in_another_coding_gets_the_mapping_only_when_it_is_certain() -> None:
    problems = check_against(SCHEMA, site(sex=("F", "M")), "table.csv").problems
    assert problems == (
        "column 'sex' writes 'F', 'M' where the plan's [schema] says [\"Female\", \"Male\"]: the same values in "
        'another coding; map them in this institution\'s collaborator.toml, [data.recode] sex = { F = "Female", M = "Male" }, or recode the cells',
    )
    uncertain = check_against(SCHEMA, site(sex=("woman", "man")), "table.csv").problems
    assert len(uncertain) == 1 and "not among its [schema] categories" in uncertain[0]
    assert "[data.recode]" not in uncertain[0]


def test_data_check_offers_the_mapping_not_more_classes_or_categories() -> None:
    checked = check_against(SCHEMA, site(label=("no", "yes"), sex=("F", "M")), "table.csv")
    assert len(checked.problems) == 2 and all("[data.recode]" in problem for problem in checked.problems)
    assert checked.edits == ()
    # Values that are not another coding still get the edit that lists them.
    new = check_against(SCHEMA, site(sex=("woman", "man")), "table.csv").edits
    assert new == ('[[schema.columns]] name = "sex": categories = ["Female", "Male", "woman", "man"] (or "learn")',)


def test_recoding_keeps_unmapped_and_missing_cells_and_refuses_an_unknown_column() -> None:
    table = pd.DataFrame({"y": [1.0, None, 0.0, 2.0]})
    mapped = recoded(table, {"y": {"1": "yes", "0": "no"}}, "t.csv")
    assert mapped["y"].tolist() == ["yes", None, "no", "2"]
    assert table["y"].tolist()[0] == 1.0, "the caller's table is left as it was"
    with pytest.raises(ConfigError, match=r"\[data.recode\] maps column 'label', which t.csv lacks; fix the column"):
        recoded(table, {"label": {"1": "yes"}}, "t.csv")


def test_a_mapping_written_the_wrong_way_round_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    table = pd.DataFrame({"y": ["no", "yes", "no"]})
    with caplog.at_level(logging.WARNING, logger="fedfair.datasets"):
        assert recoded(table, {"y": {"0": "no", "1": "yes"}}, "t.csv")["y"].tolist() == ["no", "yes", "no"]
    (record,) = caplog.records
    assert record.getMessage().startswith('[data.recode] y: none of "0", "1" occurs in t.csv, so nothing is mapped')


def test_classes_holding_two_codings_of_one_yes_no_label_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"hold two codings of one yes/no label"):
        Schema(label="y", classes=("0", "1", "no", "yes"), columns=(Column("age", "numeric"),))
    # One spelling of each meaning, or values that are not yes/no spellings, are classes like any other.
    Schema(label="y", classes=("no", "yes", "unknown", "0"), columns=(Column("age", "numeric"),))
    Schema(label="y", classes=("0", "1", "2"), columns=(Column("age", "numeric"),))


def test_an_empty_feature_column_is_refused_and_one_class_is_a_warning() -> None:
    table = site(label=(0, 0))
    table["age"] = np.nan
    problems = site_problems(SCHEMA, table)
    assert len(problems) == 1 and problems[0].startswith("column 'age' is empty in all 80 rows")
    assert "remove its [[schema.columns]] entry" in problems[0]
    (warning,) = site_warnings(SCHEMA, table)
    assert warning.startswith("label 'y' holds only the class \"0\" (80 rows)") and 'see no "1"' in warning
    checked = check_against(SCHEMA, table, "t.csv")
    assert checked.problems == tuple(problems) and checked.warnings == (warning,)
    assert "Warning: label 'y' holds only" in checked.render()
    # A column with a value, or a table with both classes, is neither.
    assert site_problems(SCHEMA, site()) == [] and site_warnings(SCHEMA, site()) == []


@pytest.mark.parametrize("fraction", [0.01, 0.02, 0.05, 0.3])
def test_the_fewest_training_rows_are_where_the_batch_first_rounds_to_one(fraction: float) -> None:
    fewest = fewest_training_rows(fraction)
    assert round(fraction * fewest) == 1 and all(round(fraction * rows) == 0 for rows in range(1, fewest))
    assert batch_shortfall(fewest, fraction, 0.25) is None
    refusal = batch_shortfall(fewest - 1, fraction, 0.25) if fewest > 1 else None
    assert fewest == 1 or (refusal is not None and f"at least {fewest:,} training rows" in refusal)


def test_a_five_row_site_is_too_small_for_the_batch() -> None:
    # 5 rows keep 4 for training (1 held out); round(0.01 x 4) = 0, and 51 is the first n with round(0.01 n) = 1.
    assert training_rows(5, 0.25) == 4 and fewest_training_rows(0.01) == 51
    refusal = batch_shortfall(4, 0.01, 0.25)
    assert refusal is not None
    assert "round(0.01 x 4) = 0 rows a step; a site needs at least 51 training rows (68 rows with 0.25 held out)" in (
        refusal
    )
    assert training_rows(68, 0.25) == 51 and training_rows(67, 0.25) == 50
    checked = check_against(SCHEMA, site(5), "t.csv", batch_fraction=0.01, test_fraction=0.25)
    assert checked.problems == (refusal,)
    assert check_against(SCHEMA, site(68), "t.csv", batch_fraction=0.01, test_fraction=0.25).problems == ()


def test_disagreeing_codings_name_the_site_the_column_and_the_mapping() -> None:
    tables = {"north": site(), "south": site(), "east": site(label=("no", "yes"))}
    (line,) = disagreeing_codings(tables, "y", ["sex"])
    assert line.startswith('east writes \'y\' as "no", "yes" where north, south write "0", "1"')
    assert '"no" -> "0", "yes" -> "1"' in line and '[data.recode] y = { no = "0", yes = "1" }' in line
    # Two sites that disagree: the first table's coding is the reference.
    (pair,) = disagreeing_codings({"north": site(), "east": site(label=("no", "yes"))}, "y", [])
    assert pair.startswith("east writes 'y'")
    # Categories: only a certain mapping is a coding; a site's own places are not.
    (sex,) = disagreeing_codings({"north": site(), "east": site(sex=("F", "M"))}, "y", ["sex"])
    assert sex.startswith('east writes \'sex\' as "F", "M"')
    regions = {"north": site().assign(region="north"), "south": site().assign(region="south")}
    assert disagreeing_codings(regions, "y", ["region"]) == []


def test_two_codings_inside_the_tables_are_named_with_who_holds_which() -> None:
    mixed = site(label=("no", "yes"))
    mixed.loc[:9, "y"] = ["0", "1"] * 5
    (line,) = disagreeing_codings({"north": site(), "east": mixed}, "y", [])
    assert "'y' holds two codings of one yes/no label" in line and 'east: "0", "1", "no", "yes"' in line


def test_text_cells_among_numbers_are_named_with_a_fix_the_draft_command_has() -> None:
    table = pd.DataFrame({"age": [str(20 + i % 150) for i in range(400)], "y": [i % 2 for i in range(400)]})
    table.loc[[3, 7, 11, 20, 40, 50], "age"] = "forty"
    with pytest.raises(ConfigError) as refused:
        draft_schema(table, "y")
    message = str(refused.value)
    assert message.startswith("column 'age' holds numbers but for 6 text cells: 'forty' (6 rows at lines 5, 9, 13")
    assert "--features" in message and "--learn-categories" not in message
