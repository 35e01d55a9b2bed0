"""The two verifiers' state machine, apart from any transport: receive a share, exchange messages, decide, sum.

The aggregator is the leader, the auditor the helper. Per party each verifier turns the share it received
into a :class:`VerifierMessage` (its joint-randomness parts, the parts the client claimed for its peer, and
its :class:`flp.VerifierShare`), sends the other its commitment, then the signed message; both then run
the same public :func:`decide` on the two messages. A rejected party's shares are dropped from both sums and the
:class:`Evidence` (both signed messages) names it: any site re-runs :func:`check_evidence`. Accepted x
shares are summed per verifier; the auditor's total, added to the aggregator's, is the sum of the
accepted inputs, and neither total alone says anything of an input.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ProtocolError
from fedfair.pki import identity
from fedfair.secagg.bounded import field, flp
from fedfair.secagg.bounded.layout import QUERIES, Layout
from fedfair.secagg.bounded.upload import DIGEST_BYTES, helper_digest, leader_digest
from fedfair.secagg.bounded.shares import (
    SEED_BYTES,
    HelperShare,
    LeaderShare,
    Parts,
    helper_expansion,
    joint_bit_weights,
    leader_part,
    seed_parts,
    tests_seed,
)

_HEADER = struct.Struct("<I")


class Role(enum.Enum):
    """Which verifier: the aggregator holds explicit shares, the auditor a seed."""

    LEADER = "aggregator"
    HELPER = "auditor"


@dataclass(frozen=True)
class VerifierMessage:
    """One verifier's message about one party's report (what it signs and sends to the other verifier).

    received: the digest of the part this verifier received, as the party signed it
    (:func:`~fedfair.secagg.bounded.upload.leader_digest` or :func:`~fedfair.secagg.bounded.upload.helper_digest`):
    the message is a function of that part and the round's query seed alone, so a party that shows the part with this
    digest shows what the message should have been (:func:`~fedfair.secagg.bounded.record.framing`).
    """

    party: int
    received: bytes
    own_parts: Parts
    claimed_peer_parts: Parts
    share: flp.VerifierShare

    def to_bytes(self) -> bytes:
        """The message's canonical bytes: party, the received part's digest, four parts, then the share's elements."""
        elements = np.concatenate(
            [self.share.outputs, self.share.wire_values.reshape(-1), self.share.polynomial_values]
        )
        parts = self.own_parts.tests + self.own_parts.witness
        parts += self.claimed_peer_parts.tests + self.claimed_peer_parts.witness
        return _HEADER.pack(self.party) + self.received + parts + field.to_wire(elements)

    def commitment(self) -> bytes:
        """SHA-256 of the message: sent before the message, so neither verifier can fit its message to the other's."""
        return hashlib.sha256(b"fedfair bounded v1 commitment\x00" + self.to_bytes()).digest()

    @classmethod
    def from_bytes(cls, layout: Layout, data: bytes) -> VerifierMessage:
        """Parse :meth:`to_bytes` for ``layout``.

        Raises:
            ProtocolError: the length is not the layout's, or an element is not below p.
        """
        outputs, wires = layout.outputs, QUERIES * 2 * layout.chunk
        start = _HEADER.size + DIGEST_BYTES
        header = start + 4 * SEED_BYTES
        if len(data) != header + field.wire_bytes(outputs + wires + QUERIES):
            raise ProtocolError(f"a verifier message of {len(data)} bytes does not match the round's layout")
        elements = field.from_wire(data[header:], "a verifier message")
        parts = [data[start + index * SEED_BYTES : start + (index + 1) * SEED_BYTES] for index in range(4)]
        share = flp.VerifierShare(
            elements[:outputs],
            elements[outputs : outputs + wires].reshape(QUERIES, -1),
            elements[outputs + wires :],
        )
        received = bytes(data[_HEADER.size : start])
        return cls(_HEADER.unpack_from(data)[0], received, Parts(*parts[:2]), Parts(*parts[2:]), share)


@dataclass(frozen=True)
class Verdict:
    """The decision about one party: accepted, or rejected with what the messages showed."""

    party: int
    accepted: bool
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Evidence:
    """Both verifiers' signed messages about one party: what a site checks before it believes a verdict.

    party_signature: the party's own signature over the digests of its two parts
    (:func:`~fedfair.secagg.bounded.upload.statement`), which each message names as the part it is of: neither verifier
    can file a message under a part the party never sent.
    """

    leader_message: bytes
    leader_signature: bytes
    helper_message: bytes
    helper_signature: bytes
    party_signature: bytes


def decide(layout: Layout, leader: VerifierMessage, helper: VerifierMessage) -> Verdict:
    """The decision, a public function of the two messages.

    Each verifier drew the joint randomness from its own parts and those the client claimed for its peer;
    they agree only when the client told each the truth about the other.
    """
    if leader.party != helper.party:
        raise ProtocolError(f"messages about parties {leader.party} and {helper.party} cannot be decided together")
    if leader.own_parts != helper.claimed_peer_parts or helper.own_parts != leader.claimed_peer_parts:
        return Verdict(leader.party, False, ("parts: the client gave the two verifiers different shares' hashes",))
    reasons = flp.failures(layout, leader.share, helper.share)
    return Verdict(leader.party, not reasons, tuple(reasons))


def sign(
    key: ec.EllipticCurvePrivateKey, context: bytes, query_seed: bytes, message: VerifierMessage
) -> tuple[bytes, bytes]:
    """The message's bytes and the verifier's signature over the round's ``context``, its ``query_seed`` and them.

    The signature is the identity key's ECDSA-SHA256. The message is a function of its part and the query seed
    (:class:`VerifierMessage`): signing the seed with it means a message shown under another seed than its verifier
    drew is not its verifier's (the verdict record's seed is bound by both verifiers' signatures, so the aggregator
    alone cannot write another one there).
    """
    data = message.to_bytes()
    return data, identity.sign(key, _signed_payload(context, query_seed, data))


def is_signed(key: ec.EllipticCurvePublicKey, context: bytes, query_seed: bytes, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``key``'s signature of a message's bytes ``data`` under ``query_seed`` in ``context``."""
    return identity.is_valid_signature(key, signature, _signed_payload(context, query_seed, data))


def check_evidence(
    layout: Layout,
    context: bytes,
    query_seed: bytes,
    evidence: Evidence,
    leader_key: ec.EllipticCurvePublicKey,
    helper_key: ec.EllipticCurvePublicKey,
) -> Verdict:
    """Verify both signatures under ``query_seed`` and re-run :func:`decide`: the verdict any site can reach on its own.

    Raises:
        ProtocolError: a signature does not verify (with this query seed), or a message does not parse.
    """
    for name, key, data, signature in (
        ("aggregator", leader_key, evidence.leader_message, evidence.leader_signature),
        ("auditor", helper_key, evidence.helper_message, evidence.helper_signature),
    ):
        if not is_signed(key, context, query_seed, data, signature):
            raise ProtocolError(f"the {name}'s verifier message is not signed by the {name} under this query seed")
    leader = VerifierMessage.from_bytes(layout, evidence.leader_message)
    helper = VerifierMessage.from_bytes(layout, evidence.helper_message)
    return decide(layout, leader, helper)


def combine_totals(leader_total: np.ndarray, helper_total: np.ndarray) -> np.ndarray:
    """The sum of the accepted inputs (signed integers) from the two verifiers' totals."""
    return field.to_signed(field.add(leader_total, helper_total))


class Verifier:
    """One verifier for one round: shares in, messages out, verdicts, and the total of accepted x shares."""

    def __init__(self, layout: Layout, role: Role, query_seed: bytes) -> None:
        """``query_seed``: the verifiers' shared secret for the round, fixed before and unknown to the clients."""
        self.layout = layout
        self.role = role
        self._query_points = flp.query_points(layout, query_seed)
        self._pending: dict[int, tuple[np.ndarray, VerifierMessage]] = {}
        self._peer_commitments: dict[int, bytes] = {}
        self._total = np.zeros(layout.dimension, dtype=np.uint64)
        self.verdicts: dict[int, Verdict] = {}

    def receive(self, party: int, share: LeaderShare | HelperShare) -> VerifierMessage:
        """This verifier's message about ``party``'s share (kept until :meth:`conclude`).

        Raises:
            ProtocolError: the share is of the other verifier's kind, malformed, or the party's second.
        """
        if party in self._pending or party in self.verdicts:
            raise ProtocolError(f"party {party} sent a second share this round")
        if isinstance(share, LeaderShare) and self.role is Role.LEADER:
            if not share.fits(self.layout):
                raise ProtocolError(f"party {party}'s share does not match the round's layout")
            if np.any(share.inputs >= np.uint64(field.P)) or np.any(share.values >= np.uint64(field.P)):
                raise ProtocolError(f"party {party}'s share holds a value that is not a field element")
            inputs, proof = share.inputs, share.proof(self.layout)
            dimension = self.layout.dimension
            own = Parts(
                leader_part(share.blind, b"tests", inputs[:dimension]),
                leader_part(share.blind, b"witness", inputs[dimension:]),
            )
            received = leader_digest(share)
        elif isinstance(share, HelperShare) and self.role is Role.HELPER:
            inputs, proof = helper_expansion(self.layout, share.seed)
            own = seed_parts(share.seed)
            received = helper_digest(share)
        else:
            raise ProtocolError(f"party {party} sent the {self.role.value} a share meant for the other verifier")
        leader_parts, helper_parts = (own, share.peer_parts) if self.role is Role.LEADER else (share.peer_parts, own)
        layout = self.layout
        randomness = flp.Randomness(
            joint_bit_weights(layout, leader_parts, helper_parts),
            field.trit_codes(
                tests_seed(leader_parts.tests, helper_parts.tests), b"trits", layout.tests * layout.dimension
            ),
            self._query_points,
        )
        message = VerifierMessage(
            party,
            received,
            own,
            share.peer_parts,
            flp.query(layout, inputs, proof, randomness, self.role is Role.LEADER),
        )
        self._pending[party] = (inputs[: layout.dimension], message)
        return message

    def commit(self, party: int, peer_commitment: bytes) -> None:
        """Record the peer's :meth:`VerifierMessage.commitment` for ``party``, before either message is revealed.

        Raises:
            ProtocolError: a commitment for ``party`` was recorded already.
        """
        if party in self._peer_commitments:
            raise ProtocolError(f"the other verifier committed twice to its message about party {party}")
        self._peer_commitments[party] = peer_commitment

    def committed_to(self, party: int, peer: VerifierMessage) -> bool:
        """Whether ``peer`` is the message the other verifier committed to about ``party``."""
        return peer.party == party and self._peer_commitments.get(party) == peer.commitment()

    def conclude(self, party: int, peer: VerifierMessage) -> Verdict:
        """Decide ``party`` from this verifier's message and the peer's; an accepted x share joins the total.

        Raises:
            ProtocolError: no share from ``party`` is pending, or the peer's message is not the one it committed
                to (the other verifier misbehaved: the client is not judged on it).
        """
        if party not in self._pending:
            raise ProtocolError(f"no share from party {party} is waiting for a decision")
        if not self.committed_to(party, peer):
            raise ProtocolError(f"the other verifier's message about party {party} is not the one it committed to")
        x_share, own = self._pending.pop(party)
        leader, helper = (own, peer) if self.role is Role.LEADER else (peer, own)
        verdict = decide(self.layout, leader, helper)
        if verdict.accepted:
            self._total = field.add(self._total, x_share)
        self.verdicts[party] = verdict
        return verdict

    def total(self) -> np.ndarray:
        """The sum of the accepted parties' x shares (field elements): what this verifier contributes."""
        return self._total.copy()


def _signed_payload(context: bytes, query_seed: bytes, data: bytes) -> bytes:
    bound = struct.pack("<I", len(context)) + context + struct.pack("<I", len(query_seed)) + query_seed
    return b"fedfair bounded v1 verifier message\x00" + bound + data
