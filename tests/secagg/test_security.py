"""The security parameters: one value, refused when it cannot hold, and compared field by field by name."""

from __future__ import annotations

import dataclasses

import pytest

from fedfair.core.errors import ConfigError
from fedfair.secagg import SecurityParameters


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_colluding": -1}, r"^max_colluding=-1 is negative; use 0 or more$"),
        ({"neighbours": 0}, r"^neighbours=0 must be at least 1, or None for the complete graph$"),
    ],
)
def test_parameters_that_cannot_hold_are_refused_naming_the_fix(fields: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SecurityParameters(**fields)


def test_differences_name_exactly_the_fields_a_round_changed_in_a_fixed_order() -> None:
    own = SecurityParameters(max_colluding=1, threshold=None, neighbours=6)
    assert own.differences(own) == []
    assert own.differences(dataclasses.replace(own, neighbours=4)) == ["neighbours"]
    assert own.differences(dataclasses.replace(own, threshold=4)) == ["threshold"]
    assert own.differences(SecurityParameters(max_colluding=0, threshold=3, neighbours=None)) == [
        "threshold",
        "neighbours",
        "collusion bound",
    ]


def test_the_isolation_floor_keeps_two_honest_inputs_beside_the_colluders() -> None:
    assert [SecurityParameters(max_colluding=c).isolating for c in (0, 1, 5)] == [2, 3, 7]
