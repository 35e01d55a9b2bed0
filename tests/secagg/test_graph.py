"""Neighbour graphs: complete, or random k-regular (SecAgg+) from a seed the plan pins."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from scipy import stats

from fedfair.core.errors import ConfigError, ThresholdError, UnmaskRefusedError
from fedfair.secagg import graph
from fedfair.secagg.config import threshold_for

ROSTER = tuple(f"site-{i:02d}" for i in range(51))


def seed(round_number: int = 1, roster: tuple[str, ...] = ROSTER, degree: int = 12, federation: str = "fed") -> bytes:
    return graph.graph_seed(federation, roster, degree, round_number)


def assert_regular(neighbours: graph.Graph, parties: int, degree: int) -> None:
    assert set(neighbours) == set(range(1, parties + 1))
    for party, adjacent in neighbours.items():
        assert party not in adjacent
        assert len(adjacent) == degree
        assert all(party in neighbours[other] for other in adjacent)


def connected_without(neighbours: graph.Graph, members: set[int], removed: set[int]) -> bool:
    left = members - removed
    start = min(left)
    seen, frontier = {start}, [start]
    while frontier:
        for other in neighbours[frontier.pop()] & left:
            if other not in seen:
                seen.add(other)
                frontier.append(other)
    return seen == left


def test_complete_graph() -> None:
    assert_regular(graph.complete_graph(6), 6, 5)


@pytest.mark.parametrize(
    ("parties", "degree"), [(10, 4), (10, 3), (11, 2), (12, 11), (10, 7), (50, 7), (7, 6), (51, 12), (200, 16)]
)
def test_regular_graph_is_k_regular_symmetric_and_simple(parties: int, degree: int) -> None:
    assert_regular(graph.regular_graph(parties, degree, seed()), parties, degree)


def test_the_graph_is_a_function_of_what_the_plan_pins_and_the_round() -> None:
    drawn = graph.regular_graph(51, 12, seed(3))
    assert drawn == graph.regular_graph(51, 12, seed(3))
    others = [seed(4), seed(3, ROSTER[:-1] + ("site-99",)), seed(3, degree=14), seed(3, federation="other")]
    assert len({seed(3), *others}) == 5
    assert all(graph.regular_graph(51, 12, other) != drawn for other in others)
    assert graph.canonical_roster(reversed(ROSTER)) == ROSTER


def test_every_pair_is_an_edge_equally_often() -> None:
    """Over many seeds each of the 15 pairs of 6 parties is an edge in 2/5 of 2-regular draws."""
    counts = dict.fromkeys(itertools.combinations(range(1, 7), 2), 0)
    for draw in range(600):
        drawn = graph.regular_graph(6, 2, draw.to_bytes(32, "big"))
        for a, b in counts:
            counts[a, b] += b in drawn[a]
    assert sum(counts.values()) == 600 * 6
    assert stats.chisquare(list(counts.values())).pvalue > 1e-6


def test_a_drawn_graph_is_no_ring_one_arc_cannot_be_cut_off_by_k_drops() -> None:
    """In a circulant, dropping k consecutive parties isolates an arc; in a random regular graph
    the survivors stay connected without any k parties of this kind (a min-degree vertex's k
    neighbours are the only k-cut)."""
    drawn = graph.regular_graph(51, 12, seed())
    everyone = set(drawn)
    for removed in (set(range(1, 13)), set(range(20, 32)), {party for party in everyone if party % 4 == 0}):
        assert connected_without(drawn, everyone, removed)


def test_impossible_graphs_are_refused() -> None:
    with pytest.raises(ConfigError, match="even number of neighbours"):
        graph.regular_graph(9, 3, bytes(32))
    with pytest.raises(ConfigError, match="neighbours"):
        graph.regular_graph(5, 5, bytes(32))
    with pytest.raises(ConfigError, match="neighbours"):
        graph.regular_graph(5, 0, bytes(32))


@pytest.mark.parametrize(
    ("parties", "colluding", "expected"),
    [(3, 0, None), (15, 0, None), (20, 0, 10), (30, 0, 10), (51, 0, 12), (100, 0, 14), (200, 0, 16), (51, 2, 16)],
)
def test_the_default_degree_is_logarithmic_and_keeps_small_federations_complete(
    parties: int, colluding: int, expected: int | None
) -> None:
    assert graph.default_degree(parties, colluding) == expected


@pytest.mark.slow
@pytest.mark.parametrize(("parties", "colluding"), [(51, 0), (100, 0), (51, 1)])
def test_the_default_degree_survives_a_tenth_dropping_at_random(parties: int, colluding: int) -> None:
    """The liveness the rule is chosen for: with 10% of the parties gone at random, every survivor
    keeps t - 1 surviving neighbours and the survivors' graph passes the colluder check, in at
    least 98 of 100 rounds."""
    degree = graph.default_degree(parties, colluding)
    assert degree is not None
    t = threshold_for(degree + 1, colluding)
    pick = random.Random(7)
    good = 0
    for round_number in range(100):
        drawn = graph.regular_graph(parties, degree, seed(round_number, degree=degree))
        survivors = set(pick.sample(sorted(drawn), parties - parties // 10))
        try:
            graph.check_survivors(drawn, survivors, colluding)
        except UnmaskRefusedError:
            continue
        good += all(len(drawn[party] & survivors) >= t - 1 for party in survivors)
    assert good >= 98


def test_check_survivors_refuses_a_cut_of_max_colluding_and_names_it() -> None:
    ring = {i: frozenset({i % 10 + 1, (i - 2) % 10 + 1}) for i in range(1, 11)}
    graph.check_survivors(ring, range(1, 11), 0)
    graph.check_survivors(ring, range(1, 11), 1)
    with pytest.raises(UnmaskRefusedError, match=r"falls apart without parties \[\d+, \d+\]"):
        graph.check_survivors(ring, range(1, 11), 2)
    with pytest.raises(UnmaskRefusedError, match="is not connected"):
        graph.check_survivors(ring, [1, 2, 3, 5, 6, 7], 0)
    graph.check_survivors(graph.complete_graph(8), [1, 4, 5], 1)


@pytest.mark.parametrize("draw", range(12))
def test_check_survivors_agrees_with_trying_every_set_of_colluders(draw: int) -> None:
    pick = random.Random(draw)
    parties, degree, colluding = 11, 4, pick.choice([0, 1, 2, 3])
    drawn = graph.regular_graph(parties, degree, draw.to_bytes(32, "big"))
    survivors = set(pick.sample(range(1, parties + 1), pick.randint(7, parties)))
    cuttable = any(
        not connected_without(drawn, survivors, set(removed))
        for size in range(colluding + 1)
        for removed in itertools.combinations(sorted(survivors), size)
        if len(survivors) - size > 0
    )
    if cuttable:
        with pytest.raises(UnmaskRefusedError):
            graph.check_survivors(drawn, survivors, colluding)
    else:
        graph.check_survivors(drawn, survivors, colluding)


def test_a_party_signs_no_survivor_set_whose_graph_falls_apart() -> None:
    """Survivors in two pieces would let the aggregator unmask each piece's sum: the server aborts
    such a round, a party refuses to sign it if a lying server shows it anyway, and a connected
    set of the same size is signed."""
    from tests.secagg.helpers import Harness, make_config

    config = make_config(parties=12, neighbours=4)
    drawn = config.graph
    triples = list(itertools.combinations(sorted(drawn), 3))
    apart = next(s for s in triples if not connected_without(drawn, set(s), set()))
    together = next(s for s in triples if connected_without(drawn, set(s), set()))
    aborted = Harness(config)
    aborted.mask(aborted.through_check(), list(apart))
    with pytest.raises(ThresholdError, match="is not connected.*round aborted"):
        aborted.server.survivor_set()
    lied_to = Harness(config)
    genuine = lied_to.through_masking(list(range(1, 13)))
    with pytest.raises(UnmaskRefusedError, match="is not connected"):
        lied_to.clients[apart[0]].consistency(dataclasses.replace(genuine, survivors=apart))
    signed = Harness(config)
    signed.clients[together[0]].consistency(signed.through_masking(list(together)))
