"""What a table's bytes and values suggest: number formats, spellings of one value, identifiers by content.

The hostile files are a small hospital export written three ways a spreadsheet or a careless script
writes them: semicolons with decimal commas and thousands points, one label written yes / Yes / YES /
"Yes ", and an encounter number that identifies each row. ``fedfair data schema`` and ``fedfair data
check`` must draft and suggest nothing harmful from them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedfair.cli import main as cli_main
from fedfair.datasets.suspects import id_like_columns, number_format, sniff_dialect, spellings
from fedfair.datasets.tabular import read_table

ROWS = 300


def hospital_table() -> pd.DataFrame:
    generator = np.random.default_rng(7)
    return pd.DataFrame(
        {
            "encounter": generator.choice(np.arange(100_000, 1_000_000), ROWS, replace=False),
            "age": generator.normal(60, 12, ROWS).round(1),
            "bmi": generator.normal(27, 4, ROWS).round(1),
            "systolic_bp": generator.integers(95, 190, ROWS) * 10,
            "length_of_stay": generator.gamma(2, 2, ROWS).round(1),
            "diabetes": generator.choice(["Yes", "No"], ROWS),
            "readmitted_30d": generator.choice(["yes", "no"], ROWS),
        }
    )


def european_export(table: pd.DataFrame, path: Path) -> Path:
    """`table` as a spreadsheet in a decimal-comma locale writes it: ';', '66,7', and '1.200' for 1200."""
    written = table.copy().astype(object)
    for name in ("age", "bmi", "length_of_stay"):
        written[name] = [f"{value:.1f}".replace(".", ",") for value in table[name]]
    written["systolic_bp"] = [f"{value:,}".replace(",", ".") for value in table["systolic_bp"]]
    written.to_csv(path, sep=";", index=False)
    return path


def careless_labels(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with each label and diabetes value written in one of several cases, some with a trailing space."""
    written = table.copy()
    generator = np.random.default_rng(8)
    forms = (str.lower, str.capitalize, str.upper, lambda value: value.capitalize() + " ")
    written["readmitted_30d"] = [forms[generator.integers(4)](value) for value in table["readmitted_30d"]]
    written["diabetes"] = [value + " " if row % 7 == 0 else value for row, value in enumerate(table["diabetes"])]
    return written


def test_a_decimal_comma_export_reads_as_the_numbers_it_holds(tmp_path: Path) -> None:
    table = hospital_table()
    read = read_table(european_export(table, tmp_path / "eu.csv"))
    dialect = read.attrs["dialect"]
    assert (dialect.delimiter, dialect.decimal, dialect.thousands) == (";", ",", ".")
    for name in ("age", "bmi", "length_of_stay", "systolic_bp"):
        assert pd.api.types.is_numeric_dtype(read[name]), name
        np.testing.assert_allclose(read[name].to_numpy(dtype=float), table[name].to_numpy(dtype=float), rtol=0, atol=0)
    assert "decimal commas, '.' between thousands" in dialect.describe()


@pytest.mark.parametrize(
    ("fields", "delimiter", "expected"),
    [
        (["66,7", "1.200", "12"], ";", (",", ".")),  # decimal commas: points group thousands
        (["66.7", "1,5"], ";", (".", None)),  # a decimal point anywhere rules decimal commas out
        (["1,200", "66.7"], ",", (".", ",")),  # quoted "1,200" in a comma-separated file
        (["66.7", "12"], ",", (".", None)),
        (["1.200", "3"], ";", (".", None)),  # ambiguous alone: pandas' default, as before
    ],
)
def test_number_format_reads_the_decimal_mark_and_grouping(
    fields: list[str], delimiter: str, expected: tuple[str, str | None]
) -> None:
    assert number_format(fields, delimiter) == expected


def test_a_plain_file_keeps_the_default_dialect(tmp_path: Path) -> None:
    path = tmp_path / "plain.csv"
    hospital_table().to_csv(path, index=False)
    dialect = sniff_dialect(path)
    assert (dialect.delimiter, dialect.decimal, dialect.thousands) == (",", ".", None)


@given(
    st.lists(
        st.sampled_from(["yes", "Yes", "YES", " yes", "Yes ", "no", "No", " no ", "maybe"]), min_size=1, max_size=40
    )
)
def test_spellings_groups_only_case_and_space_variants(values: list[str]) -> None:
    found = spellings(values)
    counts = {value: values.count(value) for value in set(values)}
    for kept, others in found.items():
        assert all(other.strip().casefold() == kept.strip().casefold() for other in others)
        # The kept spelling is trimmed whenever a trimmed one exists, and the most frequent of those.
        trimmed = [value for value in (kept, *others) if value == value.strip()]
        if trimmed:
            assert kept == kept.strip() and all(counts[kept] >= counts[value] for value in trimmed)
        else:
            assert all(counts[kept] >= counts[other] for other in others)
    grouped = {kept for kept in found} | {other for others in found.values() for other in others}
    folded = [value.strip().casefold() for value in set(values)]
    assert grouped == {value for value in set(values) if folded.count(value.strip().casefold()) > 1}
    assert "maybe" not in grouped


def test_fixed_width_codes_are_id_like_but_measurements_are_not() -> None:
    table = hospital_table()
    table["income"] = np.random.default_rng(9).choice(np.arange(9_000, 250_000), ROWS, replace=False)
    found = id_like_columns(table, list(table.columns))
    assert "encounter" in found
    assert not {"age", "bmi", "systolic_bp", "income"} & set(found)


def draft(csv: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    assert cli_main(["data", "schema", "--csv", str(csv), "--label", "readmitted_30d"]) == 0
    text = capsys.readouterr().out
    return tomllib.loads(text)["schema"], text


def test_the_schema_draft_of_hostile_exports_holds_no_junk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = hospital_table()
    schema, _ = draft(european_export(table, tmp_path / "eu.csv"), capsys)
    kinds = {column["name"]: column["type"] for column in schema["columns"]}
    assert kinds == {
        "age": "numeric",
        "bmi": "numeric",
        "systolic_bp": "numeric",
        "length_of_stay": "numeric",
        "diabetes": "categorical",
    }

    careless = tmp_path / "careless.csv"
    careless_labels(table).to_csv(careless, index=False)
    schema, text = draft(careless, capsys)
    assert sorted(str(value).casefold() for value in schema["classes"]) == ["no", "yes"]
    diabetes = next(column for column in schema["columns"] if column["name"] == "diabetes")
    assert diabetes["categories"] == ["No", "Yes"]
    assert "Left out as ID-like: encounter" in text
    assert "Written several ways, drafted once" in text and "readmitted_30d:" in text


def test_data_check_reports_spellings_as_one_problem_and_never_as_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[schema]\nlabel = "readmitted_30d"\nclasses = ["0", "1"]\n'
        '[[schema.columns]]\nname = "diabetes"\ntype = "categorical"\ncategories = ["No", "Yes"]\n'
    )
    careless = tmp_path / "careless.csv"
    careless_labels(hospital_table()).to_csv(careless, index=False)
    assert cli_main(["data", "check", "--plan", str(plan), "--csv", str(careless)]) == 1
    out = capsys.readouterr().out
    assert "Written several ways (only case or surrounding spaces differ)" in out
    # yes/no where the plan says 0/1 is another coding: adding its spellings as classes would give the
    # plan two codings of one label, so the fix offered is the site's [data.recode], every spelling mapped.
    assert not any(line.strip().startswith("classes = ") for line in out.splitlines())
    line = next(line for line in out.splitlines() if "[data.recode]" in line)
    recode = line.split("[data.recode] ")[1].removesuffix(", or recode the cells")
    mapping = tomllib.loads(recode)["readmitted_30d"]
    assert {value.strip().casefold(): plan for value, plan in mapping.items()} == {"no": "0", "yes": "1"}
    assert len(mapping) == 8  # four forms of each word, every one mapped
