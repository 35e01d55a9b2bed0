"""What aggregator and collaborators agree on for federated preprocessing: the encoder's wire form,
and the model a [schema] implies (built-in or a factory's)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd
import pytest
import torch
from torch import nn

from fedfair.core.errors import ConfigError
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import draft_schema
from fedfair.datasets.statistics import encoder_from_statistics, statistics_vector
from fedfair.runtime.preprocessing import (
    MAX_ENCODER_BYTES,
    encoder_payload,
    model_for,
    read_encoder_payload,
)
from fedfair.runtime.plan.model import ModelSettings


def sized(features: int, classes: int, hidden: int = 4) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def features_only(features: int, hidden: int = 4) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def any_keywords(**arguments: Any) -> nn.Module:
    return nn.Linear(int(arguments["features"]), int(arguments["classes"]))


@pytest.fixture
def encoder() -> Encoder:
    table = pd.DataFrame(
        {"age": [30, 41, 52, 63], "colour": ["red", "blue", "red", "green"], "label": ["no", "yes", "no", "yes"]}
    )
    schema = draft_schema(table, "label")
    return encoder_from_statistics(schema, statistics_vector(schema, table))


def test_a_built_in_model_takes_the_encoders_input_size_and_classes(encoder: Encoder) -> None:
    model = model_for(ModelSettings(name="mlp", features=107, classes=5), encoder)
    assert (model.features, model.classes) == (
        encoder.num_features,
        2,
    ) and encoder.num_features == 1 + 3  # age, three colours
    assert model.build(seed=0)(torch.zeros(3, model.features)).shape[0] == 3


@pytest.mark.parametrize(
    ("factory", "passed"),
    [("sized", {"features", "classes"}), ("features_only", {"features"}), ("any_keywords", {"features", "classes"})],
)
def test_a_factory_is_handed_the_sizes_its_signature_takes(encoder: Encoder, factory: str, passed: set[str]) -> None:
    settings = ModelSettings(name=factory, factory=f"{__name__}:{factory}", arguments={"features": 999, "hidden": 3})
    allowed = (f"{__name__}:{factory}",)
    model = model_for(settings, encoder, allowed)
    expected = {"features": encoder.num_features, "classes": 2}
    assert {key: model.arguments[key] for key in passed} == {key: expected[key] for key in passed}
    assert "classes" in model.arguments or "classes" not in passed
    assert model.arguments.get("hidden", 3) == 3  # the plan's other arguments stay
    built = model.build(seed=0, allowed=allowed)
    first = next(module for module in built.modules() if isinstance(module, nn.Linear))
    assert first.in_features == encoder.num_features


def test_the_encoder_travels_as_canonical_json_and_only_for_its_schema(encoder: Encoder) -> None:
    payload = encoder_payload(encoder)
    assert read_encoder_payload(payload, encoder.schema) == encoder
    assert encoder_payload(Encoder.from_mapping(encoder.to_mapping(), "copy")) == payload  # canonical
    other = dataclasses.replace(encoder.schema, label="colour-of-label")
    with pytest.raises(ConfigError, match="another schema than the plan's"):
        read_encoder_payload(payload, other)
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_encoder_payload(b"\xff{", encoder.schema)
    with pytest.raises(ConfigError, match="expected a JSON object"):
        read_encoder_payload(b"[1, 2]", encoder.schema)
    with pytest.raises(ConfigError, match="more than an encoder can be"):
        read_encoder_payload(b" " * (MAX_ENCODER_BYTES + 1), encoder.schema)
