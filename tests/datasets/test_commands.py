"""`fedfair data list`, `fedfair data fetch` and `fedfair data schema`."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from fedfair.datasets import DATASETS, Column, Schema, draft_schema
from fedfair.cli.data import register_commands


def test_data_commands_list_and_fetch(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="fedfair")
    register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "list"])
    assert args.handler(args) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in DATASETS)
    assert "bundled" in listing and "CC BY 4.0" in listing
    args = parser.parse_args(["data", "fetch", "adult"])
    assert args.handler(args) == 0
    assert Path(capsys.readouterr().out.strip()).parts[-2:] == ("data", "adult")


def test_data_schema_prints_a_section_the_plan_reads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = pd.DataFrame(
        {"age": [30, 41, 52], "smoker": ["no", "yes", None], "site": ["a", "b", "a"], "outcome": ["ok", "ill", "ok"]}
    )
    table.to_csv(tmp_path / "clinic.csv", index=False)
    parser = argparse.ArgumentParser(prog="fedfair")
    register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "schema", "--csv", str(tmp_path / "clinic.csv"), "--label", "outcome",
                              "--features", "age,smoker"])  # fmt: skip
    assert args.handler(args) == 0
    schema = Schema.from_mapping(tomllib.loads(capsys.readouterr().out)["schema"], "plan.toml")
    assert schema == draft_schema(table, "outcome", ["age", "smoker"])
    assert schema.columns == (
        Column("age", "numeric", None, (30.0, 60.0)),
        Column("smoker", "categorical", ("no", "yes")),
    )
    assert (schema.classes, schema.missing) == (("ill", "ok"), "impute")
    args = parser.parse_args(["data", "schema", "--csv", str(tmp_path / "clinic.csv"), "--label", "outcome",
                              "--learn-categories"])  # fmt: skip
    assert args.handler(args) == 0
    output = capsys.readouterr().out
    assert 'categories = "learn"' in output and "site" in output
