"""The round's public parameters: the digest, the bad configurations refused, and the threshold rule
(c + 2 <= t, 2t > m + c, t <= m) with its one-line explanations."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError, PrivacyWarning
from fedfair.secagg.config import SecAggConfig, check_threshold, threshold_for
from fedfair.secagg.encode import EncodingConfig
from fedfair.secagg.security import SecurityParameters

ENCODING = EncodingConfig(clip=1.0, max_weight=10.0, fractional_bits=16)


def config(**changes: object) -> SecAggConfig:
    fields = {"federation_id": "fed", "round": 2, "parties": ("a", "b", "c", "d"), "dimension": 5, "encoding": ENCODING}
    # The security parameters by name too, gathered into the one value a config takes.
    bounds = {key: changes.pop(key) for key in ("max_colluding", "threshold", "neighbours") if key in changes}
    fields.update(changes, security=SecurityParameters(**bounds))  # type: ignore[arg-type]
    return SecAggConfig(**fields)  # type: ignore[arg-type]


def test_config_digest_changes_with_every_parameter() -> None:
    base = config().digest
    variants = [
        config(federation_id="other"),
        config(round=3),
        config(parties=("a", "b", "c", "e")),
        config(parties=("b", "a", "c", "d")),
        config(dimension=6),
        config(threshold=4),
        config(max_colluding=1),
        config(encoding=dataclasses.replace(ENCODING, fractional_bits=15)),
        config(encoding=dataclasses.replace(ENCODING, modulus_bits=64)),
        config(encoding=dataclasses.replace(ENCODING, clip=2.0)),
        config(parties=tuple(f"p{i}" for i in range(10)), neighbours=4),
        config(parties=tuple(f"p{i}" for i in range(10)), neighbours=4, graph_roster=tuple(f"p{i}" for i in range(11))),
    ]
    digests = {variant.digest for variant in variants}
    assert base not in digests
    assert len(digests) == len(variants)
    assert config().digest == base


def test_default_threshold_is_a_strict_majority_of_holders() -> None:
    for parties in (3, 5, 10):
        names = tuple(f"p{i}" for i in range(parties))
        assert config(parties=names).t == parties // 2 + 1
    graph_config = config(parties=tuple(f"p{i}" for i in range(10)), neighbours=4)
    assert graph_config.holders_per_secret == 5
    assert graph_config.t == 3
    assert config(neighbours=3).complete  # 3 neighbours of 4 parties is everyone


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"threshold": 2}, "threshold"),
        ({"threshold": 5}, "threshold"),
        ({"parties": ("a",)}, "at least 2 parties"),
        ({"parties": ("a", "a", "b")}, "unique"),
        ({"federation_id": ""}, "federation_id"),
        ({"round": -1}, "round"),
        ({"dimension": 0}, "dimension"),
        ({"neighbours": 0}, "neighbours"),
        ({"parties": tuple("abcde"), "neighbours": 3}, "even number of neighbours"),
        ({"encoding": EncodingConfig(1.0, 10.0, 30)}, "wrap around"),
    ],
)
def test_bad_configs_are_refused_in_one_line(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        config(**changes)
    assert "\n" not in str(raised.value)


def test_two_parties_warn() -> None:
    with pytest.warns(PrivacyWarning, match="infer the other's input"):
        config(parties=("a", "b"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config(parties=("a", "b", "c"))


def rule_holds(t: int, m: int, c: int) -> bool:
    return c + 2 <= t <= m and 2 * t > m + c


@given(holders=st.integers(2, 200), colluding=st.integers(0, 200))
def test_threshold_for_is_the_smallest_threshold_the_rule_allows(holders: int, colluding: int) -> None:
    if holders < colluding + 2:
        with pytest.raises(ConfigError, match="lower max_colluding"):
            threshold_for(holders, colluding)
        return
    t = threshold_for(holders, colluding)
    assert rule_holds(t, holders, colluding)
    assert not rule_holds(t - 1, holders, colluding)
    check_threshold(t, holders, colluding)
    if colluding == 0:
        assert t == holders // 2 + 1


@given(threshold=st.integers(1, 60), holders=st.integers(2, 50), colluding=st.integers(0, 50))
def test_check_threshold_accepts_exactly_the_rule(threshold: int, holders: int, colluding: int) -> None:
    if rule_holds(threshold, holders, colluding):
        check_threshold(threshold, holders, colluding)
    else:
        with pytest.raises(ConfigError) as raised:
            check_threshold(threshold, holders, colluding)
        message = str(raised.value)
        assert "\n" not in message and f"threshold={threshold}" in message
        assert "use threshold=" in message or "lower max_colluding" in message


@pytest.mark.parametrize(
    ("threshold", "holders", "colluding", "message"),
    [
        (6, 5, 0, "exceeds the 5 holders"),
        (2, 5, 1, "below max_colluding \\+ 2 = 3.*use threshold=4"),
        (3, 5, 1, "2t must exceed holders \\+ max_colluding = 6; use threshold=4"),
        (3, 4, 0, None),
        (2, 4, 0, "2t must exceed holders \\+ max_colluding = 4; use threshold=3"),
        (4, 5, 4, "lower max_colluding to at most 3"),
    ],
)
def test_each_broken_rule_is_named_with_its_fix(
    threshold: int, holders: int, colluding: int, message: str | None
) -> None:
    if message is None:
        check_threshold(threshold, holders, colluding)
        return
    with pytest.raises(ConfigError, match=message):
        check_threshold(threshold, holders, colluding)


def test_config_applies_the_rule_for_its_colluders_and_graph() -> None:
    five = tuple("abcde")
    assert config(parties=five, max_colluding=1).t == 4
    assert config(parties=five, max_colluding=2).t == 4
    assert config(parties=five, max_colluding=3).t == 5
    with pytest.raises(ConfigError, match="2t must exceed"):
        config(parties=five, max_colluding=1, threshold=3)
    with pytest.raises(ConfigError, match="no threshold works"):
        config(parties=five, max_colluding=4)
    with pytest.raises(ConfigError, match="negative"):
        config(max_colluding=-1)
    # On a SecAgg+ graph the rule counts the holders of each secret (neighbours + 1), not the roster.
    graph = config(parties=tuple(f"p{i}" for i in range(10)), neighbours=4, max_colluding=1)
    assert (graph.holders_per_secret, graph.t) == (5, 4)


def test_the_graph_is_drawn_over_the_plans_roster_so_who_takes_part_does_not_redraw_it() -> None:
    roster = tuple(f"site-{i:02d}" for i in range(30))
    everyone = config(parties=roster, neighbours=6, graph_roster=roster)
    present = tuple(reversed(roster[::2]))  # half the sites, in another order
    some = config(parties=present, neighbours=6, graph_roster=roster)
    assert some.graph_seed == everyone.graph_seed
    for name in present:
        expected = {everyone.name_of(other) for other in everyone.graph[everyone.party_id(name)]} & set(present)
        assert {some.name_of(other) for other in some.graph[some.party_id(name)]} == expected
    assert config(parties=roster, neighbours=6).graph_seed == everyone.graph_seed
    with pytest.raises(ConfigError, match="not in the roster the masking graph is drawn over"):
        config(parties=(*present, "stranger"), neighbours=6, graph_roster=roster)
