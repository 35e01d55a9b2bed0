"""Neighbour graphs: complete by default, random k-regular (SecAgg+) from a public per-round seed."""

from __future__ import annotations

import collections

import pytest
from scipy import stats

from fedfair.core.errors import ConfigError
from fedfair.secagg import graph


def assert_regular(neighbours: graph.Graph, parties: int, degree: int) -> None:
    assert set(neighbours) == set(range(1, parties + 1))
    for party, adjacent in neighbours.items():
        assert party not in adjacent
        assert len(adjacent) == degree
        assert all(party in neighbours[other] for other in adjacent)


def is_connected(neighbours: graph.Graph) -> bool:
    seen, frontier = {1}, [1]
    while frontier:
        for other in neighbours[frontier.pop()]:
            if other not in seen:
                seen.add(other)
                frontier.append(other)
    return len(seen) == len(neighbours)


def test_complete_graph() -> None:
    assert_regular(graph.complete_graph(6), 6, 5)


@pytest.mark.parametrize(("parties", "degree"), [(10, 4), (10, 3), (11, 2), (12, 11), (50, 7), (7, 6)])
def test_regular_graph_is_k_regular_symmetric_and_connected(parties: int, degree: int) -> None:
    neighbours = graph.regular_graph(parties, degree, graph.round_seed("fed", 1))
    assert_regular(neighbours, parties, degree)
    assert is_connected(neighbours)


def test_graph_is_public_per_round_and_changes_between_rounds() -> None:
    seed = graph.round_seed("fed", 3)
    assert seed == graph.round_seed("fed", 3)
    assert graph.regular_graph(30, 4, seed) == graph.regular_graph(30, 4, seed)
    assert graph.regular_graph(30, 4, seed) != graph.regular_graph(30, 4, graph.round_seed("fed", 4))
    assert graph.round_seed("fed", 3) != graph.round_seed("other", 3)


def test_impossible_graphs_are_refused() -> None:
    with pytest.raises(ConfigError, match="even number of neighbours"):
        graph.regular_graph(9, 3, bytes(32))
    with pytest.raises(ConfigError, match="neighbours"):
        graph.regular_graph(5, 5, bytes(32))
    with pytest.raises(ConfigError, match="neighbours"):
        graph.regular_graph(5, 0, bytes(32))


def test_permutations_are_uniform() -> None:
    counts = collections.Counter(tuple(graph.random_permutation(3, i.to_bytes(32, "big"))) for i in range(1200))
    assert len(counts) == 6
    assert stats.chisquare(list(counts.values())).pvalue > 1e-6
