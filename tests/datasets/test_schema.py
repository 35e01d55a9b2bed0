"""The federation schema: every mistake in the plan refused with its fix, round trips, a first draft from a table."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.datasets import Schema, draft_schema
from fedfair.datasets.builtin import ADULT_COLUMNS
from fedfair.datasets.schema import COLUMN_KINDS, Column, drafted_range


ADULT_FEATURES = [name for name in ADULT_COLUMNS if name not in ("fnlwgt", "income")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lable": "y"}, r"plan.toml: \[schema\] unknown key 'lable'; did you mean 'label'\?"),
        ({"missing": "drop"}, r"plan.toml: \[schema\] missing = \"drop\" is not known; known: refuse, impute"),
        ({"classes": ["no"]}, r"plan.toml: \[schema\] classes must list at least two distinct label values"),
        ({"fraction_bits": 40}, r"plan.toml: \[schema\] max_abs = 1e\+09 with fraction_bits = 40 must satisfy"),
        ({"columns": [{"name": "age", "type": "numeric", "categories": ["1"]}]},
         r"plan.toml: \[\[schema.columns\]\] #1 numeric column 'age' cannot have categories"),
        ({"columns": [{"name": "age", "type": "number"}]},
         r"plan.toml: \[\[schema.columns\]\] #1 type = \"number\" is not known; did you mean 'numeric'\?"),
        ({"columns": [{"name": "age", "type": "numeric"}] * 2}, r"plan.toml: \[schema\] column 'age' is listed twice"),
        ({"columns": [{"name": "y", "type": "numeric"}]}, r"plan.toml: \[schema\] the label 'y' cannot also be a feature"),
        ({"columns": [{"name": "c", "type": "categorical", "categories": "learnt"}]},
         r"#1 categories must be a list of strings or \"learn\", got \"learnt\""),
        ({"columns": [{"name": "city", "type": "categorical", "categories": ["São Paulo", "São Paulo"]}]},
         r"plan.toml: \[schema\] column 'city' must list distinct categories, got \[\"São Paulo\", \"São Paulo\"\]"),
        ({"columns": [{"name": "age", "type": "numeric", "range": [120, 0]}]},
         r"plan.toml: \[schema\] column 'age' range = \[120, 0\] must be two finite numbers, low < high"),
        ({"columns": [{"name": "age", "type": "numeric", "range": [0]}]},
         r"#1 range must be \[low, high\], two numbers, e.g. \[0, 120\], got \[0\]"),
        ({"columns": [{"name": "c", "type": "categorical", "categories": ["a"], "range": [0, 1]}]},
         r"plan.toml: \[schema\] categorical column 'c' cannot have a range"),
    ],
)  # fmt: skip
def test_schema_from_mapping_refuses_each_mistake_with_the_fix(change: dict[str, object], message: str) -> None:
    data = {"label": "y", "classes": ["no", "yes"], "columns": [{"name": "age", "type": "numeric"}], **change}
    data.pop("label") if "lable" in change else None
    with pytest.raises(ConfigError, match=message):
        Schema.from_mapping(data, "plan.toml")


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=6)


@st.composite
def schemas(draw: st.DrawFn) -> Schema:
    column_names = draw(st.lists(names, min_size=2, max_size=5, unique=True))
    label, features = column_names[0], column_names[1:]
    fraction_bits = draw(st.integers(0, 30))
    max_abs = draw(st.floats(1.0, 2.0 ** (52 - fraction_bits)))
    columns = []
    for name in features:
        kind = draw(st.sampled_from(COLUMN_KINDS))
        categories = draw(st.none() | st.lists(names, min_size=1, max_size=4, unique=True).map(tuple))
        # A range lies within max_abs (beyond it values are refused anyway).
        bounds = draw(st.none() | st.tuples(st.floats(-min(max_abs, 1e6), 0.0), st.floats(0.5, min(max_abs, 1e6))))
        if kind == "categorical":
            columns.append(Column(name, kind, categories))
        else:
            columns.append(Column(name, kind, None, bounds))
    return Schema(
        label=label,
        classes=tuple(draw(st.lists(names, min_size=2, max_size=4, unique=True))),
        columns=tuple(columns),
        missing=draw(st.sampled_from(["refuse", "impute"])),
        max_abs=max_abs,
        fraction_bits=fraction_bits,
        hash_buckets=draw(st.integers(2, 4096)),
        min_category_count=draw(st.integers(1, 100)),
    )


@settings(max_examples=30, deadline=None)
@given(schemas())
def test_a_schema_round_trips_through_json_and_toml(schema: Schema) -> None:
    assert Schema.from_mapping(json.loads(json.dumps(schema.to_mapping())), "plan.json") == schema
    assert Schema.from_mapping(tomllib.loads(schema.to_toml())["schema"], "plan.toml") == schema


def test_draft_schema_lists_categories_or_learns_them(adult_table: pd.DataFrame) -> None:
    drafted = draft_schema(adult_table, "income", ["age", "race"])
    assert drafted.columns == (
        Column("age", "numeric", None, (10.0, 90.0)),  # ages 17 to 90, rounded outward
        Column("race", "categorical", ("Amer-Indian-Eskimo", "Asian-Pac-Islander", "Black", "Other", "White")),
    )
    assert drafted.missing == "refuse"
    learned = draft_schema(adult_table, "income", ["race", "workclass"], learn_categories=True)
    assert [column.categories for column in learned.columns] == [None, None] and learned.missing == "impute"
    wide = draft_schema(pd.DataFrame({"x": [1.0, 3e12], "y": [0, 1]}), "y")
    assert (wide.max_abs, wide.fraction_bits, wide.classes) == (1e13, 8, ("0", "1"))
    with pytest.raises(ConfigError, match=r"feature column 'salary' not found; choose --features from: age"):
        draft_schema(adult_table, "income", ["salary"])


@pytest.mark.parametrize(
    ("values", "bounds"),
    [
        ([18, 90], (10.0, 90.0)),
        ([0.02, 3.7], (0.0, 4.0)),
        ([-250.0, 31.0], (-300.0, 100.0)),
        ([0.0, 0.0], (0.0, 1.0)),
        ([7.0], (7.0, 8.0)),
        ([0.0, 99999.0], (0.0, 100000.0)),
    ],
)
def test_a_drafted_range_is_rounded_outward_to_the_leading_digit(
    values: list[float], bounds: tuple[float, float]
) -> None:
    assert drafted_range(np.array(values, dtype=np.float64)) == pytest.approx(bounds)
    assert drafted_range(np.array([], dtype=np.float64)) is None
