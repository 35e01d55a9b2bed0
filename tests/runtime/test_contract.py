"""The round's contract: parameters an aggregator may send malformed are refused by name, never by traceback."""

from __future__ import annotations

import pytest

from fedfair.core.errors import ConfigError
from fedfair.runtime.contract import RoundParameters


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (b'{"round": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"kind": "train"}', "malformed .*'round'"),
        (b'{"kind": "train", "round": "two"}', "malformed"),
    ],
    ids=["100,000 deep", "5,000 digits", "not UTF-8", "not an object", "a field missing", "a field of another type"],
)
def test_malformed_round_parameters_are_a_named_error_with_its_likely_cause(payload: bytes, problem: str) -> None:
    with pytest.raises(ConfigError, match=rf"^the round's parameters.*{problem}.*; the aggregator may run another"):
        RoundParameters.from_bytes(payload)
