"""Every number of a served plan is range-checked before any use (issue 51, item 8).

A collaborator reads the aggregator's plan with fedfair.runtime.plan.aggregator_plan.load_shared_settings, before
it compares the plan with its manifest's pin. Here every numeric field of a plan that sets them all (declared
sizes, a threshold, a grace factor, distributed privacy, a [schema]) is replaced, one at a time, by an odd value
(huge, negative, non-finite, the wrong type), sent as the JSON an aggregator would send, and must be refused with
a ConfigError naming the field: never an OverflowError, a traceback, or a plan taken.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.runtime.plan.aggregator_plan import load_shared_settings, parse_aggregator_plan, shared_content
from tests.runtime.test_plan import PLAN_TEMPLATE, edited

Path = tuple[str | int, ...]

FULL_PLAN: dict[str, dict[str, Any]] = {
    "influence": {"weights": "declared", "sizes": {"hospital-a": 1000, "hospital-b": 800, "hospital-c": 500}},
    "secure_aggregation": {"threshold": 2},
    "quorum": {"grace_factor": 3.0},
    "training": {"local_steps": 1},
    "privacy": {"mode": "distributed", "epsilon": 3.0, "report_epsilon": 1.0},
    "schema": {
        "label": "income",
        "classes": ["<=50K", ">50K"],
        "columns": [
            {"name": "age", "type": "numeric"},
            {"name": "sector", "type": "categorical", "categories": "learn"},
        ],
    },
}
"""Every optional number set, so that every numeric field of a plan is in what the aggregator serves."""

OPTIONAL = {("secure_aggregation", "threshold"), ("quorum", "grace_factor"), ("privacy", "report_epsilon")}
"""Numbers a plan may leave unset (JSON null): null is no odd value for them."""


def served() -> dict[str, Any]:
    """What the aggregator of FULL_PLAN serves, as JSON values."""
    sections = {**FULL_PLAN, "model": {"features": ...}}  # a [schema] decides the input size
    return shared_content(parse_aggregator_plan(edited(PLAN_TEMPLATE, sections), PLAN_TEMPLATE))


def numeric_fields(node: Any, path: Path = ()) -> Iterator[Path]:
    """The paths of every number in `node` (a list's items and a table's entries included)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from numeric_fields(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from numeric_fields(value, (*path, index))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path


BASE = served()
FIELDS = sorted(numeric_fields(BASE), key=str)

HUGE = st.one_of(
    st.integers(min_value=2**41, max_value=10**400),
    st.floats(min_value=2.0**41, allow_infinity=False),
    st.sampled_from([10**400, 2**63, 2**64, 1e300, 1.7976931348623157e308]),
)
"""Above every ceiling of fedfair.runtime.plan.limits (the largest: 2^40 rows) and of [schema]."""
NEGATIVE = st.one_of(st.integers(max_value=-1, min_value=-(10**400)), st.floats(max_value=-1e-9, allow_infinity=False))
NON_FINITE = st.sampled_from([math.inf, -math.inf, math.nan])
WRONG_TYPE = st.one_of(st.text(max_size=5), st.booleans(), st.lists(st.integers(0, 3), max_size=2), st.just({"a": 1}))
ODD = st.one_of(HUGE, NEGATIVE, NON_FINITE, WRONG_TYPE)


def with_value(path: Path, value: object) -> bytes:
    """BASE with `value` at `path`, as the JSON bytes an aggregator sends (NaN and Infinity spelt as JSON allows)."""
    data = copy.deepcopy(BASE)
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(data).encode()


def named_key(path: Path) -> str:
    """The key an error must name: the field's own, or the list or table holding it."""
    return str(next(key for key in reversed(path) if isinstance(key, str) and key not in BASE["influence"]["sizes"]))


def test_the_full_plan_is_served_and_read_with_every_numeric_field() -> None:
    shared = load_shared_settings(json.dumps(BASE).encode())
    assert shared.schema is not None and shared.secure_aggregation.threshold == 2
    # Every section holds numbers (the [federation] its count), and each is among the fields tried.
    assert {path[0] for path in FIELDS} == set(BASE) and len(FIELDS) >= 40


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(FIELDS), ODD)
def test_every_odd_number_of_a_served_plan_is_a_named_error(path: Path, value: object) -> None:
    payload = with_value(path, value)
    with pytest.raises(ConfigError) as caught:
        load_shared_settings(payload)
    message = str(caught.value)
    assert named_key(path) in message, message
    assert len(message) < 1500  # a 400-digit value is shown cut, not echoed


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("training", "local_steps"), 10**400),
        (("influence", "sizes", "hospital-a"), 10**400),
        (("evaluation", "loss_range", 1), 10**400),
        (("schema", "max_abs"), 1e308),
    ],
)
def test_the_values_that_crashed_a_collaborator_are_named_errors(path: Path, value: object) -> None:
    """Before, each of these ended in an OverflowError inside load_shared_settings (issue 51, item 8)."""
    with pytest.raises(ConfigError, match=named_key(path)):
        load_shared_settings(with_value(path, value))


@pytest.mark.parametrize("path", [path for path in FIELDS if path[:2] in OPTIONAL])
def test_an_unset_optional_number_is_read_as_unset(path: Path) -> None:
    shared = load_shared_settings(with_value(path, None))
    section = getattr(shared, str(path[0]))
    assert getattr(section, str(path[1])) is None


def test_a_model_too_large_to_build_is_refused_before_it_is_built() -> None:
    """2^20 features and 2^9 classes pass each ceiling, but not the first layer's (2^28 weights)."""
    plan = edited(PLAN_TEMPLATE, {"model": {"features": 2**20, "classes": 2**9}})
    with pytest.raises(ConfigError, match=r"\[model\] features = 1048576 and classes = 512 give 536870912 weights"):
        parse_aggregator_plan(plan, PLAN_TEMPLATE)
