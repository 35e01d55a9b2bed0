"""Who masks with whom: the complete graph, or a random k-regular graph (SecAgg+).

With n parties the complete graph costs every party n - 1 pairwise masks and
n Shamir shares per secret. For large federations SecAgg+ (Bell et al. 2020)
masks only along the edges of a k-regular graph: each party shares its secrets
with, and masks against, its k neighbours only. fedfair draws the graph as a
Harary graph (the k-regular circulant with the fewest edges that stays
k-connected) whose vertex labels are permuted at random; the permutation is
drawn from the AES keystream of a public per-round seed, so every party and the
server compute the same graph without talking, and a new one every round.
"""

from __future__ import annotations

import hashlib
import struct

from fedfair.core.errors import ConfigError
from fedfair.secagg import prg

Graph = dict[int, frozenset[int]]
"""Party id (1..n) -> the ids of its neighbours (never itself)."""


def round_seed(federation_id: str, round_number: int) -> bytes:
    """The public graph seed of one round: anyone can recompute it, nobody chooses it."""
    return hashlib.sha256(
        b"fedfair/secagg/v2/graph" + federation_id.encode() + struct.pack(">Q", round_number)
    ).digest()


def complete_graph(parties: int) -> Graph:
    """Every party is every other party's neighbour."""
    everyone = frozenset(range(1, parties + 1))
    return {party: everyone - {party} for party in everyone}


def regular_graph(parties: int, degree: int, seed: bytes) -> Graph:
    """A k-regular graph on parties 1..n: a Harary graph H(k, n) with labels permuted by ``seed``.

    In the circulant, position p is joined to p +- 1, ..., p +- floor(k/2), and, when k is
    odd, to the opposite position p + n/2 (which needs n even).
    """
    if not 1 <= degree < parties:
        raise ConfigError(f"neighbours={degree} must be from 1 to {parties - 1} (parties - 1) for {parties} parties")
    if degree % 2 and parties % 2:
        raise ConfigError(f"no {degree}-regular graph exists on {parties} parties; use an even number of neighbours")
    label = random_permutation(parties, seed)
    graph: dict[int, set[int]] = {party: set() for party in range(1, parties + 1)}
    for position in range(parties):
        offsets = list(range(1, degree // 2 + 1))
        if degree % 2:
            offsets.append(parties // 2)
        for offset in offsets:
            a, b = label[position], label[(position + offset) % parties]
            graph[a].add(b)
            graph[b].add(a)
    return {party: frozenset(neighbours) for party, neighbours in graph.items()}


def random_permutation(parties: int, seed: bytes) -> list[int]:
    """A uniformly random ordering of 1..n (Fisher-Yates driven by the keystream of ``seed``)."""
    stream = prg.Keystream(seed)
    order = list(range(1, parties + 1))
    for i in range(parties - 1, 0, -1):
        j = _below(stream, i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def _below(stream: prg.Keystream, bound: int) -> int:
    """A uniform integer in [0, bound) by rejection sampling of 64-bit words (no modulo bias)."""
    limit = (1 << 64) - (1 << 64) % bound
    while True:
        value = int.from_bytes(stream.read(8), "little")
        if value < limit:
            return value % bound
