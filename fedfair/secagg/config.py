"""The public parameters of one secure-aggregation round, shared by every party and the server.

Party ids are positions in the roster plus one (1..n); the id doubles as the party's Shamir x
coordinate, and the roster maps it to the name its certificate carries. The config's digest is
signed with every advertisement and hashed into the session id, so parties shown different
parameters cannot end up in the same session. :func:`threshold_for` gives the smallest threshold
the rule of docs/design.md section 5 allows (floor(m/2) + 1 for c = 0), and
:func:`check_threshold` refuses one that breaks it.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from functools import cached_property

from fedfair.core.errors import ConfigError, PrivacyWarning
from fedfair.secagg.codec import Writer
from fedfair.secagg.encode import Encoder, EncodingConfig
from fedfair.secagg.graph import Graph, canonical_roster, complete_graph, graph_seed, regular_graph
from fedfair.secagg.security import SecurityParameters


@dataclass(frozen=True)
class SecAggConfig:
    """One round's parameters.

    federation_id: the federation's name (from the plan).
    round: the round number.
    parties: the roster of party names; party id i + 1 is ``parties[i]``.
    dimension: d, the length of every party's (weighted) update vector.
    encoding: how updates are quantised (see :mod:`fedfair.secagg.encode`).
    security: the federation's collusion bound, threshold and masking degree (:class:`SecurityParameters`). A
        threshold of None is the smallest t the threshold rule allows (:func:`threshold_for`), where m is the
        number of holders of each secret (n on the complete graph, neighbours + 1 on a SecAgg+ graph):
        floor(m/2) + 1 when ``max_colluding`` is 0.
    graph_roster: the names the graph is drawn over, kept sorted (the plan's whole roster;
        empty: the round's parties). Parties of it that are not in the round are absent vertices, as if
        they had dropped before the round began, so who takes part does not redraw the graph.
    """

    federation_id: str
    round: int
    parties: tuple[str, ...]
    dimension: int
    encoding: EncodingConfig
    security: SecurityParameters = SecurityParameters()
    graph_roster: tuple[str, ...] = ()
    context: bytes = b""
    """What the caller binds the session to beside these parameters (the runtime: the digest of the model
    every party was sent); it enters :attr:`digest`, so parties given different contexts share no session."""
    _threshold: int = field(init=False, repr=False, compare=False)
    _graph: Graph = field(init=False, repr=False, compare=False)
    _encoder: Encoder = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parties", tuple(self.parties))
        object.__setattr__(self, "graph_roster", canonical_roster(self.graph_roster or self.parties))
        n = len(self.parties)
        if not self.federation_id:
            raise ConfigError("federation_id is empty; set the federation name in the plan")
        if self.round < 0:
            raise ConfigError(f"round={self.round} is negative; rounds count from 0")
        if n < 2:
            raise ConfigError(f"secure aggregation needs at least 2 parties, got {n}; add collaborators to the plan")
        if len(set(self.parties)) != n or not all(self.parties):
            raise ConfigError("party names must be unique and non-empty; fix the roster")
        if self.dimension < 1:
            raise ConfigError(f"dimension={self.dimension} must be at least 1")
        outside = set(self.parties) - set(self.graph_roster)
        if outside:
            raise ConfigError(
                f"party {min(outside)!r} is not in the roster the masking graph is drawn over; add it to the plan"
            )
        security = self.security
        object.__setattr__(
            self, "_threshold", threshold_in_force(security.threshold, self.holders_per_secret, security.max_colluding)
        )
        # Both constructors refuse bad settings, so a config that exists is a usable one.
        object.__setattr__(self, "_encoder", Encoder(self.encoding, n))
        object.__setattr__(self, "_graph", complete_graph(n) if self.complete else self._round_graph())
        if n < 3:
            warnings.warn(
                "secure aggregation with 2 parties: each party can infer the other's input from the sum",
                PrivacyWarning,
                stacklevel=3,
            )

    @property
    def size(self) -> int:
        """n, the number of parties in the roster."""
        return len(self.parties)

    @property
    def t(self) -> int:
        """The threshold actually in force (the default resolved)."""
        return self._threshold

    @property
    def resummed(self) -> bool:
        """Whether each survivor re-sums the survivors' masked inputs to check the claimed sum (:func:`resummed`)."""
        return resummed(self.size, self.dimension)

    @property
    def rechecked(self) -> bool:
        """Whether, above RESUMMED_WORDS, ``max_colluding + 1`` survivors re-check each survivor's masked input.

        Where the plan allows colluders (:mod:`fedfair.secagg.recheck`); with none the tag check alone is sound.
        """
        return not self.resummed and self.security.max_colluding > 0

    @property
    def complete(self) -> bool:
        """Whether every party masks with every other (no SecAgg+ graph)."""
        return complete_graph_over(len(self.graph_roster), self.security.neighbours)

    @property
    def holders_per_secret(self) -> int:
        """m: how many parties hold a share of each secret (the owner and its neighbours, present or not)."""
        return holders_per_secret(self.size, len(self.graph_roster), self.security.neighbours)

    @property
    def graph_seed(self) -> bytes:
        """The public seed of this session's SecAgg+ graph (:func:`fedfair.secagg.graph.graph_seed`)."""
        return graph_seed(self.federation_id, self.graph_roster, self.security.neighbours or 0, self.round)

    def _round_graph(self) -> Graph:
        """The plan-wide graph restricted to this round's parties, in round ids."""
        degree = self.security.neighbours
        assert degree is not None  # a sparse graph has a degree
        drawn = regular_graph(len(self.graph_roster), degree, self.graph_seed)
        vertex = {name: position + 1 for position, name in enumerate(self.graph_roster)}
        party = {vertex[name]: position + 1 for position, name in enumerate(self.parties)}
        return {party[v]: frozenset(party[w] for w in drawn[v] if w in party) for v in party}

    @property
    def graph(self) -> Graph:
        """Neighbours of every party id for this round."""
        return self._graph

    @property
    def encoder(self) -> Encoder:
        """The encoder for this round (sums of up to n inputs)."""
        return self._encoder

    def holders_of(self, party: int) -> frozenset[int]:
        """The parties holding shares of ``party``'s secrets: itself and its neighbours."""
        return self._graph[party] | {party}

    @cached_property
    def digest(self) -> bytes:
        """SHA-256 of the canonical encoding of every parameter."""
        writer = Writer().text("fedfair/secagg/v2/config").text(self.federation_id).u64(self.round)
        writer.u32(self.size)
        for name in self.parties:
            writer.text(name)
        writer.u64(self.dimension).u32(self.t).u32(0 if self.complete else self.holders_per_secret - 1)
        writer.u32(self.security.max_colluding)
        if not self.complete:
            writer.blob(self.graph_seed)
        encoding = self.encoding
        writer.f64(encoding.clip).f64(encoding.max_weight).u32(encoding.fractional_bits).u32(encoding.modulus_bits)
        if self.context:  # left out when empty, so a session without one keeps its digest
            writer.blob(self.context)
        return hashlib.sha256(writer.getvalue()).digest()

    def party_id(self, name: str) -> int:
        """The id of a roster name."""
        try:
            return self.parties.index(name) + 1
        except ValueError:
            raise ConfigError("this party is not in the round's roster; add it to the plan") from None

    def name_of(self, party: int) -> str:
        """The roster name of a party id."""
        return self.parties[party - 1]

    def is_party(self, party: int) -> bool:
        """Whether ``party`` is a valid id in this round."""
        return 1 <= party <= self.size


RESUMMED_WORDS = 1 << 22
"""The most masked-input words (parties x (d + 1)) a survivor re-sums to check a claimed sum: up to d = 419,429 at
n = 10, 1,398,100 at n = 3.

Up to here the check holds against the aggregator colluding with any number of survivors. Its cost per party grows
as n x d and a secure round's as d: measured (benchmarks/verify_soundness_cost.py, 16-bit words) at 5% of a
runtime round at n = 10, d = 10^5 and 16% at d = 10^6 (4% at n = 3, d = 10^6), so this bound keeps it under the 10%
goal at n = 10 by the measured slopes. Above it, where the plan allows colluders, max_colluding + 1 survivors
re-check each survivor's input (:attr:`SecAggConfig.rechecked`, :mod:`fedfair.secagg.recheck`: 5-6% of a round at
n = 10, d = 10^6 and n = 3, d = 10^7), and the tags alone check the sum where it does not (docs/security.md,
"Verified aggregation"); the round's :attr:`SecAggConfig.resummed` says which check is in force.
"""


def resummed(parties: int, dimension: int) -> bool:
    """Whether a round of ``parties`` over ``dimension`` coordinates checks its sum by re-summing (RESUMMED_WORDS)."""
    return parties * (dimension + 1) <= RESUMMED_WORDS


def resummed_claim_bytes(parties: int, words: int) -> int:
    """The most bytes the re-summing material adds to a claim whose vectors have at most ``words`` words.

    Every survivor's masked input (8 bytes a word at most; at most RESUMMED_WORDS words in all, since a longer
    round does not re-sum) and a rebuilt secret per party, framing included. A downloader's cap on a claim adds this.
    """
    return 8 * min(parties * words, RESUMMED_WORDS) + 64 * parties + 128


def rechecked_claim_bytes(parties: int, words: int) -> int:
    """The most bytes the re-check adds to a claim whose vectors have at most ``words`` words, above RESUMMED_WORDS.

    The carries (2 bytes a word), the masked inputs of the survivors a party re-checks (at most ``parties - 1``, 8
    bytes a word) and a rebuilt secret and a signature per party, framing included; none where the round re-sums.
    """
    return 0 if parties * words <= RESUMMED_WORDS else (2 + 8 * (parties - 1)) * words + 192 * parties + 128


def fallback_tag_set_bytes(parties: int, words: int) -> int:
    """The most bytes the re-summing material adds to a tag set of a round whose vectors have at most ``words`` words.

    None where the round re-sums (its claim carried the material); above RESUMMED_WORDS, where a tag set carries it
    in a round with a missing tag (:func:`~fedfair.secagg.resum.resum_decides`), every survivor's masked input (8
    bytes a word at most) and a rebuilt secret per party, framing included. A downloader's cap on a tag set adds this.
    """
    return 0 if parties * words <= RESUMMED_WORDS else 8 * parties * words + 64 * parties + 128


def complete_graph_over(roster: int, neighbours: int | None) -> bool:
    """Whether a round on a graph drawn over ``roster`` names is the complete graph of its parties.

    ``neighbours`` None, or a degree of ``roster - 1`` or more: every party masks with every other of the round,
    so each secret has as many holders as the round has parties, whatever the degree says.
    """
    return neighbours is None or neighbours >= roster - 1


def holders_per_secret(parties: int, roster: int, neighbours: int | None) -> int:
    """m: the holders of each secret in a round of ``parties`` on a graph drawn over ``roster`` names.

    The round's own size on the complete graph (:func:`complete_graph_over`), else ``neighbours`` + 1 (the owner
    and its neighbours, present in the round or not).
    """
    # `neighbours is None` first, for the type checker: the complete graph's test covers it anyway.
    return parties if neighbours is None or complete_graph_over(roster, neighbours) else neighbours + 1


def threshold_in_force(threshold: int | None, holders: int, max_colluding: int) -> int:
    """The t a round with m = ``holders`` runs under: ``threshold`` checked by the rule, or the rule's smallest.

    No round unmasks a sum of fewer than t survivors (the client refuses to sign such a survivor set).

    Raises:
        ConfigError: ``threshold`` breaks the rule for these holders (:func:`check_threshold`), or None and no t
            satisfies it (:func:`threshold_for`): no such round can run.
    """
    if threshold is None:
        return threshold_for(holders, max_colluding)
    check_threshold(threshold, holders, max_colluding)
    return threshold


def threshold_for(holders: int, max_colluding: int) -> int:
    """The smallest threshold t with 2t > m + c and t >= c + 2, for m ``holders`` of each secret.

    For c = 0 that is floor(m/2) + 1.

    Raises:
        ConfigError: c is negative, or no t <= m satisfies the rule (m < c + 2): fewer colluders or
            more holders are needed.
    """
    if max_colluding < 0:
        raise ConfigError(f"max_colluding={max_colluding} is negative; use 0 or more")
    threshold = max((holders + max_colluding) // 2 + 1, max_colluding + 2)
    if threshold > holders:
        raise ConfigError(
            f"no threshold works for {holders} holders of each secret with max_colluding={max_colluding}: "
            f"t must be at least {threshold} (t >= c + 2 and 2t > m + c) but at most m = {holders}; "
            f"lower max_colluding to at most {max(holders - 2, 0)} or add parties (or neighbours)"
        )
    return threshold


def check_threshold(threshold: int, holders: int, max_colluding: int) -> None:
    """Refuse a threshold t that breaks the rule c + 2 <= t, 2t > m + c, t <= m (m = ``holders``).

    The :class:`ConfigError` says which rule fails, why in one sentence, and the fix.
    """
    m, c, t = holders, max_colluding, threshold
    if c < 0:
        raise ConfigError(f"max_colluding={c} is negative; use 0 or more")
    try:
        smallest = threshold_for(m, c)
    except ConfigError:
        smallest = None
    if smallest is not None:
        fix = f"use threshold={smallest}"
    else:
        fix = f"lower max_colluding to at most {max(m - 2, 0)} or add parties (or neighbours)"
    if t > m:
        raise ConfigError(
            f"threshold={t} exceeds the {m} holders of each secret, so no secret could ever be rebuilt; {fix}"
        )
    if t < c + 2:
        raise ConfigError(
            f"threshold={t} is below max_colluding + 2 = {c + 2}: the {c} colluders hold {c} shares of the secret "
            "an honest party never reveals, so t must exceed c, and at least t - c >= 2 honest inputs must be summed "
            f"together; {fix}"
        )
    if 2 * t <= m + c:
        raise ConfigError(
            f"threshold={t} lets an aggregator collect t consistency signatures on two survivor views: honest "
            f"parties sign one view each, so 2t must exceed holders + max_colluding = {m + c}; {fix}"
        )
