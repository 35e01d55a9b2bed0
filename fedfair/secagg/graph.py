"""Who masks with whom: the complete graph, or a random k-regular graph (SecAgg+, Bell et al. 2020).

On the complete graph every party masks against, and shares its secrets with, all n - 1 others;
on a SecAgg+ graph only its k = O(log n) neighbours (:func:`default_degree`). The graph is a
uniformly drawn random k-regular graph over the plan's whole roster, from a seed nobody chooses
(:func:`graph_seed`), and a party signs a survivor set only if its subgraph survives the removal
of any ``max_colluding`` members (:func:`check_survivors`). docs/design.md section 5 ("The masking
graph") says why privacy rests on that check, not on the graph's randomness.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Collection, Sequence
from functools import lru_cache
from typing import Any

from fedfair.core.errors import ConfigError, UnmaskRefusedError
from fedfair.secagg import prg
from fedfair.secagg.codec import Writer

Graph = dict[int, frozenset[int]]
"""Party id (1..n) -> the ids of its neighbours (never itself)."""

SPARSE_FROM = 2
"""The automatic degree keeps the complete graph unless k is at most n / SPARSE_FROM: a graph
that saves less than half the masks is not worth the survivors' connectivity condition."""

_DRAWS_PER_READ = 512


def graph_seed(federation_id: str, roster: Sequence[str], degree: int, session_round: int) -> bytes:
    """The public seed of one session's graph: a hash of what the plan pins and the round.

    ``roster`` is the plan's whole roster in a canonical order (:func:`canonical_roster`), not
    the round's parties, so the aggregator's choice of who takes part cannot redraw it.
    """
    writer = Writer().text("fedfair/secagg/v3/graph").text(federation_id).u32(len(roster))
    for name in roster:
        writer.text(name)
    writer.u32(degree).u64(session_round)
    return hashlib.sha256(writer.getvalue()).digest()


def canonical_roster(names: Collection[str]) -> tuple[str, ...]:
    """The order the graph's vertices take: sorted names, so no list order a party sends matters."""
    return tuple(sorted(names))


def default_degree(parties: int, max_colluding: int) -> int | None:
    """The degree ``neighbours = "auto"`` picks for a roster of ``parties``; None for the complete graph.

    k = 2 ceil(log2 n) + 2c, made even: the logarithm keeps a random k-regular graph connected,
    with its neighbourhoods above the threshold, when a tenth of the parties drop at random (a
    test measures it), and each colluder assumed costs two neighbours, since the threshold rule
    t >= c + 2, 2t > k + 1 + c needs k >= c + 1 and the survivors' graph must stay connected
    without c of them. Small federations keep the complete graph (see :data:`SPARSE_FROM`).
    """
    degree = 2 * math.ceil(math.log2(max(parties, 2))) + 2 * max_colluding
    degree += degree % 2
    return degree if degree * SPARSE_FROM <= parties else None


def complete_graph(parties: int) -> Graph:
    """Every party is every other party's neighbour."""
    everyone = frozenset(range(1, parties + 1))
    return {party: everyone - {party} for party in everyone}


def regular_graph(parties: int, degree: int, seed: bytes) -> Graph:
    """A uniformly drawn random k-regular graph on parties 1..n, from the keystream of ``seed``.

    Points (k per party) are paired at random, never two of one party nor a second edge
    between two parties, and the draw starts over if it gets stuck (Steger and Wormald
    1999: rare when k is small against n). A degree above (n - 1) / 2 is drawn as the
    complement of a random (n - 1 - k)-regular graph, where pairing would get stuck often.
    """
    if not 1 <= degree < parties:
        raise ConfigError(f"neighbours={degree} must be from 1 to {parties - 1} (parties - 1) for {parties} parties")
    if degree % 2 and parties % 2:
        raise ConfigError(f"no {degree}-regular graph exists on {parties} parties; use an even number of neighbours")
    return _regular(parties, degree, seed)


@lru_cache(maxsize=16)
def _regular(parties: int, degree: int, seed: bytes) -> Graph:
    if degree == parties - 1:
        return complete_graph(parties)
    if 2 * degree > parties - 1:
        complement = _regular(parties, parties - 1 - degree, seed)
        everyone = frozenset(range(1, parties + 1))
        return {party: everyone - complement[party] - {party} for party in everyone}
    draws = _Draws(seed)
    while True:
        edges = _pairing(parties, degree, draws)
        if edges is not None:
            return {party: frozenset(adjacent) for party, adjacent in edges.items()}


def _pairing(parties: int, degree: int, draws: _Draws) -> dict[int, set[int]] | None:
    """One attempt at a random perfect pairing of the points into a simple graph; None if stuck."""
    points = [party for party in range(1, parties + 1) for _ in range(degree)]
    edges: dict[int, set[int]] = {party: set() for party in range(1, parties + 1)}
    while points:
        for _ in range(100):
            i, j = draws.below(len(points)), draws.below(len(points))
            a, b = points[i], points[j]
            if a != b and b not in edges[a]:
                break
        else:
            return None
        edges[a].add(b)
        edges[b].add(a)
        for index in sorted((i, j), reverse=True):  # swap-remove the larger index first
            points[index] = points[-1]
            points.pop()
    return edges


class _Draws:
    """Uniform integers below a bound from a seed's keystream (rejection sampling, no modulo bias)."""

    def __init__(self, seed: bytes) -> None:
        self._stream = prg.Keystream(seed)
        self._words: list[int] = []

    def below(self, bound: int) -> int:
        limit = (1 << 64) - (1 << 64) % bound
        while True:
            if not self._words:
                block = self._stream.read(8 * _DRAWS_PER_READ)
                self._words = list(struct.unpack(f"<{_DRAWS_PER_READ}Q", block))
            value = self._words.pop()
            if value < limit:
                return value % bound


def check_survivors(graph: Graph, survivors: Collection[int], max_colluding: int) -> None:
    """Refuse (:class:`UnmaskRefusedError`) survivors whose subgraph a set of ``max_colluding`` can cut.

    The aggregator can unmask the sum of any piece of the survivors' subgraph that the
    colluders' vertices separate from the rest (their pairwise masks are known to it), so the
    survivors must induce a (c + 1)-vertex-connected subgraph. A complete graph always does.
    """
    members = frozenset(survivors)
    if len(members) <= max_colluding + 1:
        return  # too few to cut; the threshold rule refuses such rounds on its own terms
    adjacency = {party: graph[party] & members for party in members}
    if all(len(adjacent) == len(members) - 1 for adjacent in adjacency.values()):
        return
    cut = _small_cut(adjacency, max_colluding + 1)
    if cut is not None:
        without = f" without any {max_colluding} of them" if max_colluding else ""
        how = f"falls apart without parties {sorted(cut)}" if cut else "is not connected"
        raise UnmaskRefusedError(
            f"the survivors' masking graph {how}, so the aggregator could unmask the sum of a piece of it; with "
            f"max_colluding = {max_colluding} it must stay connected{without}: refused "
            "(more neighbours, or fewer dropouts, make such rounds rare)"
        )


def _small_cut(adjacency: dict[int, frozenset[int]], connectivity: int) -> frozenset[int] | None:
    """A vertex cut of fewer than ``connectivity`` vertices (possibly empty), or None if none exists.

    Any minimum cut S either misses the vertex v of least degree, and then separates v from a
    vertex not adjacent to it, or holds v, and then separates two neighbours of v that are not
    adjacent (Esfahanian and Hakimi 1984); so those pairs' local connectivities decide it, each
    a unit-capacity max flow on the split graph (every vertex an in and an out node joined by
    an arc of capacity 1; a path from the source's out node to the sink's in node crosses
    only other vertices' arcs).
    """
    if not _connected(adjacency):
        return frozenset()
    if connectivity == 1:
        return None
    import numpy as np
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import maximum_flow

    order = sorted(adjacency)
    index = {party: position for position, party in enumerate(order)}
    size = len(order)
    rows, columns = list(range(size)), list(range(size, 2 * size))
    capacities = [1] * size
    for party in order:
        for other in adjacency[party]:
            rows.append(index[party] + size)
            columns.append(index[other])
            capacities.append(size)
    network = csr_array(
        (np.array(capacities, dtype=np.int32), (np.array(rows), np.array(columns))), shape=(2 * size, 2 * size)
    )
    v = min(order, key=lambda party: (len(adjacency[party]), party))
    pairs = [(v, w) for w in order if w != v and w not in adjacency[v]]
    near = sorted(adjacency[v])
    pairs += [(x, y) for i, x in enumerate(near) for y in near[i + 1 :] if y not in adjacency[x]]
    for source, sink in pairs:
        result = maximum_flow(network, index[source] + size, index[sink])
        if result.flow_value < connectivity:
            reached = _reachable(csr_array(network - result.flow), index[source] + size)
            return frozenset(party for party in order if index[party] in reached and index[party] + size not in reached)
    return None


def _connected(adjacency: dict[int, frozenset[int]]) -> bool:
    first = next(iter(adjacency))
    seen, frontier = {first}, [first]
    while frontier:
        for other in adjacency[frontier.pop()]:
            if other not in seen:
                seen.add(other)
                frontier.append(other)
    return len(seen) == len(adjacency)


def _reachable(residual: Any, start: int) -> set[int]:
    """Nodes reachable from ``start`` along arcs with capacity left (after a max flow)."""
    seen, frontier = {start}, [start]
    while frontier:
        node = frontier.pop()
        begin, end = residual.indptr[node], residual.indptr[node + 1]
        for other, left in zip(residual.indices[begin:end], residual.data[begin:end]):
            if left > 0 and int(other) not in seen:
                seen.add(int(other))
                frontier.append(int(other))
    return seen
