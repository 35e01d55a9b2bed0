"""Every number of a served plan is range-checked before any use (issue 51, item 8).

A collaborator reads the aggregator's plan with fedfair.runtime.plan.aggregator_plan.load_shared_settings, before
it compares the plan with its manifest's pin. Here every numeric field of a plan that sets them all (declared
sizes, a threshold, a grace factor, distributed privacy, a [schema]) is replaced, one at a time, by an odd value
(huge, negative, non-finite, the wrong type), sent as the JSON an aggregator would send, and must be refused with
a ConfigError naming the field: never an OverflowError, a traceback, or a plan taken.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.runtime.plan.aggregator_plan import (
    load_aggregator_plan,
    load_shared_settings,
    parse_aggregator_plan,
    shared_content,
)
from tests.runtime.test_plan import PLAN_TEMPLATE, edited

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from attacks.plan_values import FULL_PLAN, field_name, is_odd, numbers_in, replaced  # the attack row's plan and fields

Where = tuple[str | int, ...]

BASE = shared_content(load_aggregator_plan(None, FULL_PLAN))
"""What the aggregator of a plan that sets every optional number serves, as JSON values."""
FIELDS = sorted(numbers_in(BASE), key=str)
OPTIONAL = {
    ("secure_aggregation", "threshold"),
    ("quorum", "grace_factor"),
    ("privacy", "report_epsilon"),
    ("privacy", "interim_report_epsilon"),
}
"""Numbers a plan may leave unset (JSON null): null is no odd value for them."""

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


def test_the_full_plan_is_served_and_read_with_every_numeric_field() -> None:
    shared = load_shared_settings(json.dumps(BASE).encode())
    assert shared.schema is not None and shared.secure_aggregation.threshold == 2
    # Every section holds numbers (the [federation] its count), and each is among the fields tried.
    assert {path[0] for path in FIELDS} == set(BASE) and len(FIELDS) >= 40


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(FIELDS), ODD)
def test_every_odd_number_of_a_served_plan_is_a_named_error(path: Where, value: object) -> None:
    assume(is_odd(path, value))
    payload = replaced(BASE, path, value)
    with pytest.raises(ConfigError) as caught:
        load_shared_settings(payload)
    message = str(caught.value)
    assert field_name(path) in message, message
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
def test_the_values_that_crashed_a_collaborator_are_named_errors(path: Where, value: object) -> None:
    """Before, each of these ended in an OverflowError inside load_shared_settings (issue 51, item 8)."""
    with pytest.raises(ConfigError, match=field_name(path)):
        load_shared_settings(replaced(BASE, path, value))


@pytest.mark.parametrize("path", [path for path in FIELDS if path[:2] in OPTIONAL])
def test_an_unset_optional_number_is_read_as_unset(path: Where) -> None:
    base = BASE
    if path == ("privacy", "report_epsilon"):  # the interim answers' epsilon needs a final one, and so does training DP
        base = json.loads(replaced(BASE, ("privacy", "interim_report_epsilon"), None))
        base = json.loads(replaced(base, ("privacy", "epsilon"), None))
        base = json.loads(replaced(base, ("privacy", "mode"), "off"))
    shared = load_shared_settings(replaced(base, path, None))
    section = getattr(shared, str(path[0]))
    assert getattr(section, str(path[1])) is None


def test_a_model_too_large_to_build_is_refused_before_it_is_built() -> None:
    """2^20 features and 2^9 classes pass each ceiling, but not the first layer's (2^28 weights)."""
    plan = edited(PLAN_TEMPLATE, {"model": {"features": 2**20, "classes": 2**9}})
    with pytest.raises(ConfigError, match=r"\[model\] features = 1048576 and classes = 512 give 536870912 weights"):
        parse_aggregator_plan(plan, PLAN_TEMPLATE)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # Each within its own range, but three collaborators' clipped updates overflow the 64-bit words.
        ({"clip": 1e9, "max_weight": 1e9}, r"could wrap around modulo 2\^64 .*; lower clip or max_weight"),
        ({"modulus_bits": 32}, r"could wrap around modulo 2\^32 .* or set modulus_bits=64"),
        ({"modulus_bits": 63}, r"modulus_bits must be 16, 32 or 64"),
    ],
)
def test_an_encoding_that_cannot_hold_the_sum_is_refused_as_the_plan_is_read(
    values: dict[str, object], message: str
) -> None:
    """Before, a collaborator took such a plan and then skipped every round ("not contributing")."""
    served = json.loads(json.dumps(BASE))
    served["secure_aggregation"].update(values)
    served["privacy"] = {"mode": "off"}  # distributed noise needs 64-bit words: refused on that ground first
    with pytest.raises(ConfigError, match=message):
        load_shared_settings(json.dumps(served).encode())
