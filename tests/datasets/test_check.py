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

from fedfair.core.errors import ConfigError
from fedfair.datasets import commands
from fedfair.datasets.check import check_against, schema_edits, schema_from_file
from fedfair.datasets.schema import Column, Schema, draft_schema


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
    for expected in ("no column 'age'", "did you mean 'Age'", "'Never-worked' (2 rows)", "'Without-pay' (1 row)", "3 missing"):
        assert expected in text
    assert '[[schema.columns]] name = "age": name = "Age" (the table\'s name)' in report.edits
    assert any('name = "workclass": categories = [' in edit and '"Never-worked", "Without-pay"]' in edit for edit in report.edits)
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
    assert report.edits == (
        'classes = ["<=50K", ">50K", ">50K."]',
        '[[schema.columns]] name = "age": type = "categorical"',
        "max_abs = 10000",
    )


def test_a_fitting_table_says_so() -> None:
    table = clean_table()
    report = check_against(draft_schema(table, "income", None), table, "site.csv")
    assert report.problems == () and report.edits == ()
    assert report.render() == "site.csv fits the plan's [schema]: 40 rows, every column and value accepted"


def test_the_command_reads_a_plan_or_the_manifest_that_pins_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = draft_schema(clean_table(), "income", None)
    plan = tmp_path / "plan.toml"
    plan.write_text("[federation]\nid = \"f\"\n\n" + schema.to_toml(commented=True))
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
        assert "site.csv does not fit the plan's [schema] (3 problems" in capsys.readouterr().out
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
