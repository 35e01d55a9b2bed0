"""`fedfair evaluate --composition`: who is in the worst-off group, read from the raw table.

A tiny table whose worst rows are known by construction (a one-feature model whose loss grows
with x for one class and falls for the other) is counted by hand, boundary row included; on
Adult rows, with race left out of the model's features, each share column sums to 1, the
cells' row counts are pandas' own, and the worst group is the rows the model's own losses rank
highest. Unknown columns and columns with too many values are refused, naming the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedfair.bundle import Bundle, builtin_architecture, make_provenance, write_bundle
from fedfair.bundle.composition import MAX_NUMERIC_VALUES, composition_columns, composition_values
from fedfair.cli import main
from fedfair.core.errors import ConfigError
from fedfair.core.models import per_sample_loss
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import MISSING_LEVEL, draft_schema
from fedfair.datasets.statistics import encoder_from_statistics, statistics_vector
from tests.bundle.test_commands import trained
from tests.federations import adult_raw_table

ADULT_ROWS = 3000
ADULT_FEATURES = ["age", "workclass", "education-num", "occupation", "sex", "hours-per-week"]


def bundle_of(path: Path, encoder: Encoder, state: dict[str, torch.Tensor], rho: float) -> Path:
    """A logreg bundle with the given weights, trained under a plan whose objective rho is ``rho``."""
    write_bundle(
        path,
        Bundle(
            state_dict=state,
            architecture=builtin_architecture("logreg", encoder.num_features, len(encoder.class_names)),
            encoder=encoder.to_mapping(),
            threshold=0.0,
            plan={"objective": {"rho": rho, "epsilon": 0.1}},
            metrics=[],
            provenance=make_provenance(1, {"site-a": 1}),
        ),
    )
    return path


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    """8 rows; the model's logit is the standardised x (mean 6), so a "no" row's loss grows with x and
    the one "yes" row's (x = 1, 5 below the mean) is the second highest: the worst rows by loss are
    x = 20 (site A), x = 1 (site B, "yes"), then x = 7 (site B). `site` is no feature of the model."""
    table = pd.DataFrame(
        {
            "x": [1, 2, 3, 4, 5, 6, 7, 20],
            "site": ["B", "A", "A", "B", "A", "B", "B", "A"],
            "income": ["yes", "no", "no", "no", "no", "no", "no", "no"],
        }
    )
    schema = draft_schema(table, "income", ["x"])
    encoder = encoder_from_statistics(schema, statistics_vector(schema, table))
    state = {"weight": torch.ones(1, 1), "bias": torch.zeros(1)}
    table.to_csv(tmp_path / "tiny.csv", index=False)
    return bundle_of(tmp_path / "tiny.bundle", encoder, state, rho=0.3), tmp_path / "tiny.csv"


def test_a_tiny_table_matches_the_hand_count_boundary_row_included(
    tiny: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, data = tiny
    command = ["evaluate", "--model", str(bundle), "--data", str(data), "--composition", "site,income", "--json"]
    assert main(command) == 0
    reported = json.loads(capsys.readouterr().out)["composition"]
    # rho = 0.3 of 8 rows is 2.4: x = 20 (A, no) and x = 1 (B, yes) whole, 0.4 of x = 7 (B, no).
    assert reported["columns"] == ["site", "income"] and reported["rho"] == 0.3
    assert reported["worst_rows"] == pytest.approx(2.4)
    expected = [  # site, income, worst rows, rows; the label by class name, cells in class order
        ("A", "no", 1.0, 4),
        ("B", "no", 0.4, 3),
        ("B", "yes", 1.0, 1),
    ]
    assert [(cell["site"], cell["income"]) for cell in reported["cells"]] == [row[:2] for row in expected]
    for cell, (_, _, worst, rows) in zip(reported["cells"], expected, strict=True):
        assert cell["worst_rows"] == pytest.approx(worst) and cell["rows"] == rows
        assert cell["worst_share"] == pytest.approx(worst / 2.4) and cell["overall_share"] == rows / 8

    # --rho 0.25 is exactly the two worst rows; the site alone is then half A, half B.
    command = ["evaluate", "--model", str(bundle), "--data", str(data), "--composition", "site", "--rho", "0.25"]
    assert main(command) == 0
    text = capsys.readouterr().out
    assert "worst-off group: the worst 25% of rows by loss (2 of 8 rows), by site" in text
    assert re.search(r"^A\s+50\.0%\s+50\.0%\s+4$", text, re.MULTILINE)
    assert re.search(r"^B\s+50\.0%\s+50\.0%\s+4$", text, re.MULTILINE)


@pytest.fixture(scope="module")
def adult(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, pd.DataFrame, np.ndarray]:
    """A model trained on Adult rows without race (or the label's other proxies); the table, its
    per-row losses under that model, and the bundle's rho (0.1)."""
    table = adult_raw_table().iloc[:ADULT_ROWS]
    schema = draft_schema(table, "income", ADULT_FEATURES)
    encoder = encoder_from_statistics(schema, statistics_vector(schema, table))
    model = trained("logreg", encoder, table, 2)
    features, labels = encoder.encode(table, "adult rows")
    assert labels is not None and schema.missing == "impute"
    with torch.no_grad():
        losses = per_sample_loss(model(torch.as_tensor(features)), torch.as_tensor(labels)).double().numpy()
    folder = tmp_path_factory.mktemp("adult")
    table.to_csv(folder / "adult.csv", index=False)
    return bundle_of(folder / "adult.bundle", encoder, model.state_dict(), rho=0.1), folder / "adult.csv", table, losses


def test_on_adult_shares_sum_to_one_and_the_worst_group_is_the_highest_losses(
    adult: tuple[Path, Path, pd.DataFrame, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, data, table, losses = adult
    command = ["evaluate", "--model", str(bundle), "--data", str(data), "--composition", "race,income", "--json"]
    assert main(command) == 0
    reported = json.loads(capsys.readouterr().out)
    cells = reported["composition"]["cells"]
    assert reported["rho"] == 0.1 and reported["rows"] == ADULT_ROWS
    assert sum(cell["worst_share"] for cell in cells) == pytest.approx(1.0, abs=1e-12)
    assert sum(cell["overall_share"] for cell in cells) == pytest.approx(1.0, abs=1e-12)
    assert sum(cell["rows"] for cell in cells) == ADULT_ROWS

    counts = table.groupby(["race", "income"]).size()
    worst = table.assign(loss=losses).nlargest(ADULT_ROWS // 10, "loss", keep="first")
    worst_counts = worst.groupby(["race", "income"]).size()
    assert {(cell["race"], cell["income"]) for cell in cells} == set(counts.index)
    for cell in cells:
        key = (cell["race"], cell["income"])
        assert cell["rows"] == counts[key]
        assert cell["worst_rows"] == pytest.approx(worst_counts.get(key, 0), abs=1e-9)
    # Race is no feature, yet the composition is not the table's: the model's errors fall unevenly.
    assert any(abs(cell["worst_share"] - cell["overall_share"]) > 0.02 for cell in cells)


def test_the_text_table_lists_each_cell_once_missing_cells_last(
    adult: tuple[Path, Path, pd.DataFrame, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, data, table, _ = adult
    assert main(["evaluate", "--model", str(bundle), "--data", str(data), "--composition", "workclass,income"]) == 0
    text = capsys.readouterr().out
    assert "worst-group risk" in text  # the report is still there, the composition follows it
    lines = text.split("worst-off group: the worst 10% of rows by loss (300 of 3,000 rows), by workclass x income\n")[1]
    header, *rows = lines.strip().splitlines()
    assert header.split() == ["workclass", "income", "worst", "group", "everyone", "rows"]
    cells = [tuple(line.split()[:2]) for line in rows]
    expected = {(str(w), str(i)) for w, i in table.fillna({"workclass": MISSING_LEVEL})[["workclass", "income"]].values}
    assert len(cells) == len(set(cells)) == len(expected) and set(cells) == expected
    assert [cell[0] for cell in cells][-2:] == [MISSING_LEVEL, MISSING_LEVEL]
    missing_rows = sum(int(line.split()[-1].replace(",", "")) for line in rows if line.startswith(MISSING_LEVEL))
    assert missing_rows == table["workclass"].isna().sum() > 0


def test_an_unknown_column_is_refused_naming_it_the_columns_and_the_fix(
    adult: tuple[Path, Path, pd.DataFrame, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, data, table, _ = adult
    assert main(["evaluate", "--model", str(bundle), "--data", str(data), "--composition", "Race,income"]) == 2
    captured = capsys.readouterr()
    assert "worst-group risk" not in captured.out
    error = captured.err
    assert f"{data} has no column 'Race' (did you mean 'race'?) to describe the worst group by" in error
    assert "name columns of the table in --composition" in error and "case-sensitive" in error
    assert "table columns: " + ", ".join(table.columns) in error
    assert "Traceback" not in error

    assert main(["evaluate", "--model", str(bundle), "--data", str(data), "--composition", "zip,sex,postcode"]) == 2
    assert "has no columns 'zip', 'postcode' to describe" in capsys.readouterr().err


def test_a_numeric_column_with_many_values_is_refused_few_values_are_ordered_as_numbers(
    adult: tuple[Path, Path, pd.DataFrame, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, data, table, _ = adult
    assert table["age"].nunique() > MAX_NUMERIC_VALUES
    assert main(["evaluate", "--model", str(bundle), "--data", str(data), "--composition", "race,age"]) == 2
    error = capsys.readouterr().err
    assert f"column 'age' is numeric with {table['age'].nunique()} distinct values" in error
    assert "it does not bin numbers" in error and "add a column of bands to the table, e.g. age_band" in error

    identifiers = table.assign(person=[f"p{row}" for row in range(len(table))])
    with pytest.raises(ConfigError, match="'person' is text with 3,000 distinct values.*e.g. person_group"):
        composition_values(identifiers, ["person"], draft_schema(table, "income"), "adult rows")

    values, orders = composition_values(table, ["education-num"], draft_schema(table, "income"), "adult rows")
    shown = sorted(table["education-num"].unique())
    assert orders["education-num"] == [str(number) for number in shown]  # 9 before 10, no '.0'
    assert list(values["education-num"]) == [str(number) for number in table["education-num"]]


def test_composition_values_line_up_with_rows_and_show_classes_and_gaps() -> None:
    table = pd.DataFrame({"y": [1, 0, 1, 0], "score": [2.0, None, 10.0, 9.0], "city": ["b", "a", None, "a"]})
    schema = draft_schema(table, "y", ["score"])
    values, orders = composition_values(table, ["y", "score", "city"], schema, "t")
    assert list(values["y"]) == ["1", "0", "1", "0"] and orders["y"] == ["0", "1"]
    assert list(values["score"]) == ["2", MISSING_LEVEL, "10", "9"]
    assert orders["score"] == ["2", "9", "10", MISSING_LEVEL]
    assert list(values["city"]) == ["b", "a", MISSING_LEVEL, "a"] and orders["city"] == ["a", "b", MISSING_LEVEL]


@pytest.mark.parametrize(
    ("spec", "message"),
    [("race,,sex", "has an empty column name"), ("race,sex,race", "names 'race' twice"), ("", "empty column name")],
)
def test_the_column_list_is_parsed_or_refused(spec: str, message: str) -> None:
    assert composition_columns(" race , income") == ["race", "income"]
    with pytest.raises(ConfigError, match=message):
        composition_columns(spec)
