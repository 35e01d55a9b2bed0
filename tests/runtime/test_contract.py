"""The round's contract: parameters an aggregator may send malformed are refused by name, never by traceback."""

from __future__ import annotations

import json

import pytest

from fedfair.core.errors import ConfigError
from fedfair.runtime.contract import RoundParameters
from fedfair.secagg import EncodingConfig, SecurityParameters


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


def test_the_security_parameters_travel_as_the_three_keys_every_peer_reads() -> None:
    """The one value rides the wire as the keys it always had, so a round's bytes (and the bounded sum's session,
    their digest) do not change with it; a bound read back is the bound sent, and a negative one is refused."""
    security = SecurityParameters(max_colluding=1, threshold=4, neighbours=6)
    roster = tuple(f"site-{index}" for index in range(8))
    encoding = EncodingConfig(clip=1.0, max_weight=10.0, fractional_bits=16)
    parameters = RoundParameters("train", 3, True, roster, 5, encoding, security, graph_roster=roster)
    document = json.loads(parameters.to_bytes())
    assert "security" not in document
    assert (document["max_colluding"], document["threshold"], document["neighbours"]) == (1, 4, 6)
    assert RoundParameters.from_bytes(parameters.to_bytes()) == parameters
    document["max_colluding"] = -1
    with pytest.raises(ConfigError, match=r"malformed \(max_colluding=-1 is negative; use 0 or more\)"):
        RoundParameters.from_bytes(json.dumps(document).encode())
