"""The messages the two verifiers exchange in VERIFY and TOTAL, each with canonical bytes.

VERIFY runs in four steps, each sent by both verifiers to the other before either takes the next:
:class:`Roster` (the parties it received its part from, and its commitment to its half of the query
seed, sent once uploads close), :class:`SeedReveal` (that half), :class:`Commitments` (per party, the
hash of its verifier message), :class:`Reveal` (per party, the signed message). TOTAL is the auditor's
:class:`AuditorTotal`, signed, so the aggregator can show what the auditor contributed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ProtocolError
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.shares import SEED_BYTES
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.wire import SIGNATURE_LIMIT

AUDITOR = 2**32
"""The auditor's party id in a stage's :class:`~fedfair.secagg.round.Opening`: no site's (a u32) can be it."""

COMMITMENT_BYTES = 32


def seed_commitment(context_digest: bytes, half: bytes) -> bytes:
    """SHA-256 of a verifier's half of the query seed, bound to the round."""
    return hashlib.sha256(b"fedfair bounded v1 query seed half\x00" + context_digest + half).digest()


def query_seed(context_digest: bytes, leader_half: bytes, helper_half: bytes) -> bytes:
    """The round's query seed: neither verifier chose it alone, and no client knew it before uploads closed."""
    return hashlib.sha256(b"fedfair bounded v1 query seed\x00" + context_digest + leader_half + helper_half).digest()


@dataclass(frozen=True)
class Roster:
    """Whom a verifier received its part from, and its commitment to its half of the query seed."""

    parties: tuple[int, ...]
    seed_commitment: bytes

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        return Writer().ids(self.parties).blob(self.seed_commitment).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Roster:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        reader = Reader(data)
        parties, commitment = reader.ids(), reader.blob(COMMITMENT_BYTES)
        reader.finish()
        if any(a >= b for a, b in zip(parties, parties[1:], strict=False)):
            raise ProtocolError("a verifier's roster lists a party twice or out of order")
        return cls(parties, commitment)


@dataclass(frozen=True)
class SeedReveal:
    """A verifier's half of the query seed, revealed once both rosters (and commitments) are in."""

    half: bytes

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        return Writer().blob(self.half).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> SeedReveal:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        reader = Reader(data)
        half = reader.blob(SEED_BYTES)
        reader.finish()
        return cls(half)


@dataclass(frozen=True)
class Commitments:
    """Per present party, the commitment to this verifier's message about it (in increasing party order)."""

    entries: tuple[tuple[int, bytes], ...]

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        writer = Writer().u32(len(self.entries))
        for party, commitment in self.entries:
            writer.u32(party).blob(commitment)
        return writer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Commitments:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        reader = Reader(data)
        entries = tuple((reader.u32(), reader.blob(COMMITMENT_BYTES)) for _ in range(reader.u32()))
        reader.finish()
        return cls(entries)


@dataclass(frozen=True)
class Reveal:
    """Per present party, this verifier's message about it and its identity signature over it."""

    entries: tuple[tuple[int, bytes, bytes], ...]

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        writer = Writer().u32(len(self.entries))
        for party, message, signature in self.entries:
            writer.u32(party).blob(message).blob(signature)
        return writer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Reveal:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        reader = Reader(data)
        entries = tuple((reader.u32(), reader.blob(), reader.blob(SIGNATURE_LIMIT)) for _ in range(reader.u32()))
        reader.finish()
        return cls(entries)


@dataclass(frozen=True)
class AuditorTotal:
    """The auditor's total over the accepted parties (field elements, its noise included), signed by it."""

    accepted: tuple[int, ...]
    total: np.ndarray
    signature: bytes

    @property
    def sender(self) -> int:
        """Who uploads a total: the auditor."""
        return AUDITOR

    def signed_bytes(self, context_digest: bytes) -> bytes:
        """What the auditor signs: the round, whom the total covers, and the total."""
        writer = Writer().blob(context_digest).ids(self.accepted)
        return b"fedfair bounded v1 auditor total\x00" + writer.blob(self.total.astype("<u8").tobytes()).getvalue()

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        writer = Writer().ids(self.accepted).blob(field.to_wire(self.total))
        return writer.blob(self.signature).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> AuditorTotal:
        """Parse :meth:`to_bytes`; ProtocolError if malformed or a value is not a field element."""
        reader = Reader(data)
        accepted, raw, signature = reader.ids(), reader.blob(), reader.blob(SIGNATURE_LIMIT)
        reader.finish()
        return cls(accepted, field.from_wire(raw, "the auditor's total"), signature)
