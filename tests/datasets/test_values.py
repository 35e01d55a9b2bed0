"""A table checked against the schema: every mistake named with its fix, fitting tables accepted."""

from __future__ import annotations

import pandas as pd
import pytest

from fedfair.core.errors import ConfigError
from fedfair.datasets import Schema, check_table
from fedfair.datasets.builtin import ADULT_COLUMNS
from fedfair.datasets.schema import Column

ADULT_FEATURES = [name for name in ADULT_COLUMNS if name not in ("fnlwgt", "income")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"age": None}, r"t.csv has no column 'age', which the plan's \[schema\] requires; rename that column"),
        ({"color": ["red", "green"]}, (r"t.csv: column 'color' has values not among its \[schema\] categories: "
                                       r"'green' \(1 row at line 3\); fix those cells, add the values to its categories, or "
                                       r"set categories = \"learn\"")),
        ({"age": ["30", "forty"]}, (r"t.csv: column 'age' is numeric in the plan's \[schema\] but holds text: "
                                    r"'forty' \(1 row at line 3\); fix those cells, or declare the column type = \"categorical\"")),
        ({"y": ["no", "maybe"]}, (r"t.csv: label column 'y' has values not among the \[schema\] classes "
                                  r"\[\"no\", \"yes\"\]: 'maybe' \(1 row at line 3\); fix those cells or add them to classes")),
        ({"y": ["no", None]}, r"t.csv: label column 'y' has 1 missing values; drop those rows"),
        ({"color": ["red", None]}, (r"t.csv: column 'color' has 1 missing values \(at line 3\) and the plan's \[schema\] "
                                    r"says missing = \"refuse\"; fill or drop those rows, or set missing = \"impute\"")),
        ({"age": [30, 2000]}, (r"t.csv: column 'age' has a value of absolute size 2000, above the \[schema\] "
                               r"max_abs = 1000; rescale the column")),
        ({"y": None}, r"t.csv has no label column 'y', which the plan's \[schema\] requires"),
    ],
)  # fmt: skip
def test_check_table_names_the_column_the_values_and_the_fix(
    small_schema: Schema, change: dict[str, object], message: str
) -> None:
    table = pd.DataFrame({"age": [30, 40], "color": ["red", "blue"], "y": ["no", "yes"], "notes": ["a", "b"]})
    for name, values in change.items():
        table = table.drop(columns=name) if values is None else table.assign(**{name: values})
    with pytest.raises(ConfigError, match=message) as raised:
        check_table(small_schema, table, "t.csv")
    assert "\n" not in str(raised.value)


def test_check_table_accepts_a_fitting_table_and_prediction_tables_without_labels(small_schema: Schema) -> None:
    table = pd.DataFrame({"age": [30.5, 40], "color": ["red", "blue"], "y": ["no", "yes"], "extra": [1, 2]})
    check_table(small_schema, table, "t.csv")
    check_table(small_schema, table.drop(columns="y"), "t.csv", label_required=False)
    with pytest.raises(ConfigError, match=r"t.csv has no data rows"):
        check_table(small_schema, table.iloc[:0], "t.csv")
    # Codes read as floats because of a gap elsewhere still match the categories "1" and "2".
    coded = Schema("y", ("0", "1"), (Column("code", "categorical", ("1", "2")),), missing="impute")
    check_table(coded, pd.DataFrame({"code": [1.0, 2.0, None], "y": [0, 1, 1]}), "t.csv")


def test_every_problem_of_a_table_is_named_in_one_refusal(small_schema: Schema) -> None:
    """One run shows everything to correct: each bad column with its values and counts, and the label."""
    table = pd.DataFrame(
        {"age": ["30", "forty", "fifty"], "color": ["red", "green", "green"], "y": ["no", "maybe", "yes"]}
    )
    with pytest.raises(ConfigError) as refused:
        check_table(small_schema, table, "t.csv")
    message = str(refused.value)
    assert message.startswith("t.csv does not fit the plan's [schema] in 3 ways: (1) label column 'y'")
    assert (
        "(2) column 'age' is numeric" in message and "'forty' (1 row at line 3), 'fifty' (1 row at line 4)" in message
    )
    assert "(3) column 'color' has values not among its [schema] categories: 'green' (2 rows at lines 3, 4)" in message
    assert "\n" not in message


def test_every_missing_column_is_named_in_one_refusal(small_schema: Schema) -> None:
    table = pd.DataFrame({"Age": [30], "y": ["no"]})
    with pytest.raises(ConfigError, match=r"t.csv has no column 'age' \(did you mean 'Age'\?\), column 'color', "):
        check_table(small_schema, table, "t.csv")
