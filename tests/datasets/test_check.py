"""`fedfair data check`: every problem of a table at once, and schema edits that really accept it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfair.cli import main as cli_main
from fedfair.core.errors import ConfigError
from fedfair.cli import data as commands
from fedfair.datasets.check import check_against, schema_edits, schema_from_file
from fedfair.datasets.schema import Column, Schema, draft_schema
from fedfair.fairness import tail
from fedfair.privacy.distributed import noise_excess
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from tests.federations import adult_raw_table


def clean_table(rows: int = 40) -> pd.DataFrame:
    generator = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "age": generator.integers(18, 80, rows),
            "workclass": generator.choice(["Private", "State-gov", "Self-emp"], rows),
            "hours": generator.integers(10, 60, rows).astype(float),
            "income": generator.choice(["<=50K", ">50K"], rows),
        }
    )


def messy_site() -> pd.DataFrame:
    """The new user's site: a renamed column, categories the others lack, gaps in the hours."""
    table = clean_table().rename(columns={"age": "Age"})
    table.loc[[1, 2], "workclass"] = "Never-worked"
    table.loc[[3], "workclass"] = "Without-pay"
    table.loc[[4, 5, 6], "hours"] = np.nan
    return table


def test_every_problem_is_reported_at_once_with_the_edit_that_accepts_it() -> None:
    schema = draft_schema(clean_table(), "income", None)
    report = check_against(schema, messy_site(), "site.csv")
    assert len(report.problems) == 3
    text = report.render()
    for expected in (
        "no column 'age'",
        "did you mean 'Age'",
        "'Never-worked' (2 rows at lines 3, 4)",
        "'Without-pay' (1 row at line 5)",
        "3 missing values (at lines 6, 7, 8)",
    ):
        assert expected in text
    assert '[[schema.columns]] name = "age": name = "Age" (the table\'s name)' in report.edits
    assert any(
        'name = "workclass": categories = [' in edit and '"Never-worked", "Without-pay"]' in edit
        for edit in report.edits
    )
    assert 'missing = "impute" (missing cells: hours (3))' in report.edits
    # The edits, applied, make the table fit: the report suggests nothing that would not work.
    columns = []
    for column in schema.columns:
        if column.name == "age":
            column = dataclasses.replace(column, name="Age")
        if column.name == "workclass":
            column = dataclasses.replace(column, categories=(*(column.categories or ()), "Never-worked", "Without-pay"))
        columns.append(column)
    edited = dataclasses.replace(schema, columns=tuple(columns), missing="impute")
    fixed = check_against(edited, messy_site(), "site.csv")
    assert fixed.problems == () and fixed.imputed == ("hours (3)",)
    assert fixed.render().endswith("every column and value accepted; empty cells to be imputed: hours (3)")
    assert schema_edits(edited, messy_site()) == []


def test_text_in_a_numeric_column_large_numbers_and_new_classes_get_their_edits() -> None:
    table = clean_table()
    schema = Schema("income", ("<=50K", ">50K"), (Column("age", "numeric"), Column("hours", "numeric")), max_abs=100.0)
    table["age"] = table["age"].astype(object)
    table.loc[0, "age"] = "unknown"
    table.loc[1, "hours"] = 2500.0
    table.loc[2, "income"] = ">50K."
    report = check_against(schema, table, "site.csv")
    assert len(report.problems) == 3
    # 'unknown' among 39 ages is a cell to fix, '>50K.' a misspelt class: neither gets a schema edit.
    assert report.edits == ("max_abs = 10000",)
    assert "'unknown' (1 row at line 2); fix those cells (the other 39 values are numbers)" in report.render()
    assert "'>50K.' where '>50K' is meant (1 row at line 4)" in report.render()


def test_a_type_change_is_suggested_only_when_most_values_fit_it() -> None:
    table = clean_table()
    schema = Schema("income", ("<=50K", ">50K"), (Column("workclass", "numeric"), Column("age", "numeric")))
    report = check_against(schema, table, "site.csv")
    assert report.edits == ('[[schema.columns]] name = "workclass": type = "categorical"',)
    assert 'or declare the column type = "categorical"' in report.problems[0]


def test_a_fitting_table_says_so() -> None:
    table = clean_table()
    report = check_against(draft_schema(table, "income", None), table, "site.csv")
    assert report.problems == () and report.edits == ()
    assert report.render() == "site.csv fits the plan's [schema]: 40 rows, every column and value accepted"


def test_the_command_reads_a_plan_or_the_manifest_that_pins_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = draft_schema(clean_table(), "income", None)
    plan = tmp_path / "plan.toml"
    plan.write_text('[federation]\nid = "f"\n\n' + schema.to_toml(commented=True))
    manifest = tmp_path / "federation.toml"
    settings = json.dumps({"schema": schema.to_mapping()}, indent=2)
    manifest.write_text(f"[plan]\nsha256 = \"\"\nsettings = '''\n{settings}\n'''\n")
    site = tmp_path / "site.csv"
    messy_site().to_csv(site, index=False)
    good = tmp_path / "good.csv"
    clean_table().to_csv(good, index=False)
    parser = commands_parser()
    for source in (plan, manifest):
        assert schema_from_file(source) == schema
        args = parser.parse_args(["data", "check", "--plan", str(source), "--csv", str(site)])
        assert args.handler(args) == 1
        out = capsys.readouterr().out
        assert "site.csv does not fit the plan's [schema] (3 problems" in out
        # Checked against the plan before its pin, an edit needs no new pin; against the manifest it does.
        assert ("then pin the plan again" in out) == (source == manifest)
        assert ("before the plan is pinned, so no new pin is needed" in out) == (source == plan)
    args = parser.parse_args(["data", "check", "--plan", str(plan), "--csv", str(good)])
    assert args.handler(args) == 0
    assert "good.csv fits" in capsys.readouterr().out
    no_schema = tmp_path / "builtin.toml"
    no_schema.write_text('[federation]\nid = "f"\n')
    with pytest.raises(ConfigError, match="has no \\[schema\\].*fedfair data schema"):
        schema_from_file(no_schema)


def test_the_drafted_schema_comments_every_option_and_reads_back_unchanged() -> None:
    schema = draft_schema(clean_table(), "income", None)
    text = schema.to_toml(commented=True)
    assert '"refuse": a site with an empty feature cell stops; "impute"' in text
    for key in ("max_abs", "fraction_bits", "hash_buckets", "min_category_count"):
        assert f"{key} = " in text and "#" in text.split(f"{key} = ")[1].splitlines()[0]
    assert Schema.from_mapping(tomllib.loads(text)["schema"], "plan.toml") == schema


def commands_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    commands.register_commands(parser.add_subparsers(dest="command"))
    return parser


# ---------------------------------------------------------------- the four hostile files, through the command


HOSTILE_PLAN = """[federation]
id = "clinics"

[schema]
label = "outcome"
classes = ["no", "readmit"]
missing = "refuse"

[[schema.columns]]
name = "age"
type = "numeric"

[[schema.columns]]
name = "ward"
type = "categorical"
categories = ["Chirurgie", "Médecine"]
"""


def patients(rows: int = 30) -> pd.DataFrame:
    generator = np.random.default_rng(1)
    return pd.DataFrame(
        {
            "patient_id": [f"P{index:05d}" for index in range(rows)],
            "age": generator.integers(20, 90, rows),
            "ward": generator.choice(["Chirurgie", "Médecine"], rows),
            "outcome": generator.choice(["no", "readmit"], rows),
        }
    )


def data_check(tmp_path: Path, table: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    plan = tmp_path / "plan.toml"
    plan.write_text(HOSTILE_PLAN, encoding="utf-8")
    code = cli_main(["data", "check", "--plan", str(plan), "--csv", str(table)])
    return code, capsys.readouterr().out


def test_one_word_among_numbers_is_a_cell_to_fix_at_its_line_not_a_categorical_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = patients()
    table["age"] = table["age"].astype(object)
    table.loc[6, "age"] = "forty"
    table.to_csv(tmp_path / "ages.csv", index=False)
    code, out = data_check(tmp_path, tmp_path / "ages.csv", capsys)
    assert code == 1
    assert "'forty' (1 row at line 8); fix those cells (the other 29 values are numbers)" in out
    assert "categorical" not in out
    assert "(line numbers are the file's, the header being line 1)" in out
    assert (tmp_path / "ages.csv").read_text().splitlines()[7].split(",")[1] == "forty"  # line 8 indeed


def test_a_misspelt_label_gets_its_near_match_not_a_new_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = patients()
    table.loc[[3, 17], "outcome"] = "Readmit"
    table.to_csv(tmp_path / "labels.csv", index=False)
    code, out = data_check(tmp_path, tmp_path / "labels.csv", capsys)
    assert code == 1
    assert "label column 'outcome' has 'Readmit' where 'readmit' is meant (2 rows at lines 5, 19)" in out
    assert "classes =" not in out


def test_a_semicolon_separated_windows_1252_file_is_read_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "export.csv"
    patients().to_csv(path, index=False, sep=";", encoding="cp1252")
    code, out = data_check(tmp_path, path, capsys)
    assert code == 0, out
    assert out.startswith("export.csv fits the plan's [schema]: 30 rows, every column and value accepted\n")
    assert "Read as ';'-separated, cp1252 text (detected)." in out
    assert "remove the entry" not in out


def test_id_like_columns_are_listed_beside_and_inside_the_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = patients(60)
    table.insert(1, "record", np.random.default_rng(2).permutation(np.arange(1000, 1060)))
    table.insert(2, "income", np.random.default_rng(3).permutation(np.arange(60) * 1000 + 20_000))
    table.to_csv(tmp_path / "ids.csv", index=False)
    code, out = data_check(tmp_path, tmp_path / "ids.csv", capsys)
    assert code == 0
    # Distinct but spread-out amounts (income) are no identifier.
    assert (
        "Not in the [schema], so never used: patient_id (ID-like: named like an identifier), record (ID-like: "
        "all 60 values distinct), income." in out
    )
    # A schema that uses an identifier as a feature is told so.
    plan = tmp_path / "plan.toml"
    plan.write_text(HOSTILE_PLAN + '\n[[schema.columns]]\nname = "record"\ntype = "numeric"\n', encoding="utf-8")
    assert cli_main(["data", "check", "--plan", str(plan), "--csv", str(tmp_path / "ids.csv")]) == 0
    assert "ID-like columns the [schema] uses as features: record (all 60 values distinct)." in capsys.readouterr().out


def test_data_check_sizes_the_plans_privacy_to_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under the plan `fedfair init --csv` writes, a site's check says what the final evaluation can resolve with
    its rows (1,500 of Adult's here: 375 held out), and what would give +/- 0.05: the same figures as the
    function the warnings and benchmarks/eval_error.py use."""
    table = tmp_path / "site.csv"
    adult_raw_table().iloc[:1500].to_csv(table, index=False)
    folder = tmp_path / "fed"
    assert cli_main(["init", str(folder), "--sites", "a,b,c", "--csv", str(table), "--label", "income"]) == 0
    capsys.readouterr()
    assert cli_main(["data", "check", "--plan", str(folder / "aggregator" / "plan.toml"), "--csv", str(table)]) == 0
    said = capsys.readouterr().out
    plan = load_aggregator_plan(folder / "aggregator" / "plan.toml", check_manifest=False)
    excess = noise_excess(3, plan.survivor_floor(3), plan.secure_aggregation.max_colluding)
    half = tail.expected_half_width(375, 0.3, 1.0, 1e-5, 3.0, excess=excess)
    assert 0.2 < half < 0.5  # 375 rows at epsilon 1 cannot resolve it; the line says so, and what would
    assert (
        f"this table's 375 held-out rows (a 0.25 share) alone would give the final worst-group risk +/- {half:.2g}"
        in said
    )
    assert f"+/- 0.05 needs about {tail.rows_for(half, 375):,.0f} of them, or report_epsilon" in said
