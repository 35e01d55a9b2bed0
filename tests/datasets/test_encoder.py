"""The shared encoder: what every site builds from the statistics travels as JSON and comes back equal."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fedfair.core.errors import ConfigError
from fedfair.datasets import Schema, draft_schema, encoder_from_statistics, statistics_vector
from fedfair.datasets.builtin import ADULT_COLUMNS
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import Column


ADULT_FEATURES = [name for name in ADULT_COLUMNS if name not in ("fnlwgt", "income")]


def test_an_encoder_round_trips_through_json(adult_table: pd.DataFrame) -> None:
    schema = draft_schema(adult_table, "income", ["age", "workclass", "native-country"])
    learned = Schema(**{**schema.__dict__, "columns": (*schema.columns[:2], Column("native-country", "categorical"))})
    for each in (schema, learned):
        encoder = encoder_from_statistics(each, statistics_vector(each, adult_table))
        again = Encoder.from_mapping(json.loads(json.dumps(encoder.to_mapping())), "bundle.json")
        assert again == encoder
    damaged = encoder.to_mapping()
    damaged["columns"][1]["levels"] = ["Private"]  # type: ignore[index]
    with pytest.raises(
        ConfigError, match=r"bundle.json: \[\[encoder.columns\]\] #2 does not fit its schema column 'workclass'"
    ):
        Encoder.from_mapping(damaged, "bundle.json")


def test_a_mean_too_large_for_a_float_is_a_damaged_bundle_not_an_overflow() -> None:
    schema = Schema("y", ("0", "1"), (Column("x", "numeric"),))
    column = {"name": "x", "levels": [], "means": [10**400], "stds": [1.0], "buckets": []}
    with pytest.raises(ConfigError, match=r"bundle.json: \[\[encoder.columns\]\] #1 means must be a list of numbers"):
        Encoder.from_mapping({"schema": schema.to_mapping(), "rows": 3, "columns": [column]}, "bundle.json")
