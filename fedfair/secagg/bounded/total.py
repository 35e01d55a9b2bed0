"""VERIFY: each accepted site checks the bounded sum's total before any model is made of it.

The aggregator's signed verdict record carries its claimed share-sum S (the sum of the accepted sites' explicit
shares it holds) and the auditor's signed total A over the same sites; the total is S + A mod p. Each accepted
site tags its own explicit share a_i under two challenge rows r_1, r_2 drawn from the record's digest (so fixed
only once the aggregator committed to S), t_ik = <r_k, a_i> mod p, and signs the tags with its identity key. The
aggregator relays every accepted site's signed tags; a site accepts S only if each verifies and
sum_i t_ik = <r_k, S> mod p for both rows. A false S passes with probability 1/p per row (p = 2^61 - 1), so
p^-2 for both, and the aggregator cannot forge a site's tag. docs/security.md, "Bounded inputs (two verifiers)".
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ProtocolError, VerificationError, VerifyReason
from fedfair.pki import identity
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.wire import SIGNATURE_LIMIT

CHALLENGE_ROWS = 2
"""Challenge rows per round: a false share-sum passes each with probability 1/p, both with p^-2."""

_PARTY = struct.Struct(">I")


def record_digest(record_bytes: bytes) -> bytes:
    """SHA-256 of the signed verdict record's bytes: what the challenge is drawn from and every tag is bound to."""
    return hashlib.sha256(b"fedfair bounded v1 record digest\x00" + record_bytes).digest()


def challenge(digest: bytes, dimension: int) -> np.ndarray:
    """The challenge rows (CHALLENGE_ROWS x d uniform field elements), from the record's digest."""
    return field.random_elements(digest, b"total challenge", CHALLENGE_ROWS * dimension).reshape(CHALLENGE_ROWS, -1)


def tags_of(rows: np.ndarray, vector: np.ndarray) -> tuple[int, ...]:
    """<r_k, vector> mod p for each challenge row r_k."""
    return tuple(field.dot(row, vector) for row in rows)


@dataclass(frozen=True)
class SiteTags:
    """A site's tags of its explicit share under the record's challenge, signed with its identity key."""

    party: int
    tags: tuple[int, ...]
    signature: bytes

    @property
    def sender(self) -> int:
        """The site the tags are from (its signature binds it)."""
        return self.party

    def signed_bytes(self, context: BoundedContext, digest: bytes) -> bytes:
        """What the site signs: the round's context, the record's digest, its id and its tags."""
        writer = Writer().blob(context.digest).blob(digest).u32(self.party)
        for tag in self.tags:
            writer.u64(tag)
        return b"fedfair bounded v1 total tags\x00" + writer.getvalue()

    def is_signed(self, context: BoundedContext, digest: bytes, key: ec.EllipticCurvePublicKey) -> bool:
        """Whether the tags are signed by ``key`` for this round's record."""
        return identity.is_valid_signature(key, self.signature, self.signed_bytes(context, digest))

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        writer = Writer().u32(self.party).u32(len(self.tags))
        for tag in self.tags:
            writer.u64(tag)
        return writer.blob(self.signature).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> SiteTags:
        """Parse :meth:`to_bytes`; ProtocolError if malformed or a tag is not a field element."""
        reader = Reader(data)
        party, count = reader.u32(), reader.u32()
        if count != CHALLENGE_ROWS:
            raise ProtocolError(f"party {party}'s tags are {count}, not one per challenge row ({CHALLENGE_ROWS})")
        tags = tuple(reader.u64() for _ in range(count))
        signature = reader.blob(SIGNATURE_LIMIT)
        reader.finish()
        if any(tag >= field.P for tag in tags):
            raise ProtocolError(f"party {party}'s tag is not a field element")
        return cls(party, tags, signature)


def sign_tags(
    context: BoundedContext, digest: bytes, party: int, share: np.ndarray, key: ec.EllipticCurvePrivateKey
) -> SiteTags:
    """``party``'s signed tags of its explicit ``share`` (d elements) under the challenge of the record ``digest``."""
    unsigned = SiteTags(party, tags_of(challenge(digest, context.dimension), share), b"")
    return SiteTags(party, unsigned.tags, identity.sign(key, unsigned.signed_bytes(context, digest)))


@dataclass(frozen=True)
class TagSet:
    """Every accepted site's signed tags, as the aggregator relays them in VERIFY (in increasing party order)."""

    tags: tuple[SiteTags, ...]

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        writer = Writer().u32(len(self.tags))
        for item in self.tags:
            writer.blob(item.to_bytes())
        return writer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> TagSet:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        reader = Reader(data)
        tags = tuple(SiteTags.from_bytes(reader.blob()) for _ in range(reader.u32()))
        reader.finish()
        return cls(tags)


def tags_add_up(digest: bytes, claimed: np.ndarray, tags: Mapping[int, SiteTags]) -> bool:
    """Whether the tags sum, row by row, to the claimed share-sum's tags under the record's challenge."""
    expected = tags_of(challenge(digest, claimed.size), claimed)
    return all(sum(item.tags[row] for item in tags.values()) % field.P == expected[row] for row in range(len(expected)))


def verified_total(
    context: BoundedContext,
    digest: bytes,
    accepted: tuple[int, ...],
    claimed: np.ndarray,
    auditor_total: np.ndarray,
    tag_set: TagSet,
    site_keys: Mapping[int, ec.EllipticCurvePublicKey],
) -> np.ndarray:
    """The total S + A (signed integers in the encoded scale), once every accepted site's tags check S.

    ``claimed`` (S) and ``auditor_total`` (A, whose signature the site checked with the record) come from the
    record of ``digest``; ``accepted`` are the sites in the sum; ``site_keys`` their identity keys.

    Raises:
        VerificationError: MALFORMED, the tag set names a site twice or one outside the sum; MISSING_TAG, an
            accepted site's tags are not in it (nobody can check the total; the round is not applied); BAD_TAG,
            tags not signed by their site for this record; FORGED, the tags do not add up to the claimed
            share-sum (it is not the sum of the accepted sites' shares).
    """
    given: dict[int, SiteTags] = {}
    for item in tag_set.tags:
        if item.party in given or item.party not in accepted:
            raise VerificationError(
                context.round,
                VerifyReason.MALFORMED,
                f"the tag set names party {item.party} twice, or a party outside the bounded sum",
            )
        given[item.party] = item
    missing = [party for party in accepted if party not in given]
    if missing:
        raise VerificationError(
            context.round,
            VerifyReason.MISSING_TAG,
            f"no tags of the bounded sum's total from party {', '.join(map(str, missing))}: this site cannot check "
            "it, so it applies nothing of this round",
        )
    for party, item in sorted(given.items()):
        if not item.is_signed(context, digest, site_keys[party]):
            raise VerificationError(
                context.round,
                VerifyReason.BAD_TAG,
                f"party {party}'s tags are not signed by it over this round's verdict record",
            )
    if not tags_add_up(digest, claimed, given):
        raise VerificationError(
            context.round,
            VerifyReason.FORGED,
            "the accepted sites' tags do not add up to the aggregator's claimed share-sum: the record's total is "
            "not the sum of the accepted sites' inputs",
        )
    return field.to_signed(field.add(claimed, auditor_total))
