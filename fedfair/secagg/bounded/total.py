"""VERIFY: each accepted site checks the bounded sum's total before any model is made of it.

The aggregator's signed verdict record carries the total T = S + N + A mod p it applies once: S, the sum of the
accepted sites' explicit shares (which it holds), N, its own noise, drawn from a key the record commits to, and A, the
auditor's total over the same sites (its own noise included). Each accepted site tags its own explicit share a_i, and
the auditor its A, under two challenge rows r_1, r_2 drawn from the record's digest (so fixed only once the aggregator
committed to T): t_ik = <r_k, a_i> mod p, t_Ak = <r_k, A> mod p, each signed with its maker's identity key. The
aggregator relays every accepted site's signed tags and the auditor's, and reveals its noise key to the sites (never to
the auditor); a site accepts T only if each tag verifies, the key is the committed one, and
sum_i t_ik + t_Ak + <r_k, N> = <r_k, T> mod p for both rows. A false T passes with probability 1/p per row
(p = 2^52 - 47), so p^-2 < 2^-103 for both, and the aggregator cannot forge a site's or the auditor's tag. Either verifier's
noise alone is the charge. docs/security.md, "Bounded inputs (two verifiers)".
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ProtocolError, VerificationError, VerifyReason
from fedfair.pki import identity
from fedfair.secagg import noise
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.record import DISPUTE_PREFIX, Dispute
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.wire import SIGNATURE_LIMIT

CHALLENGE_ROWS = 2
"""Challenge rows per round: a false total passes each with probability 1/p, both with p^-2."""


@functools.lru_cache(maxsize=1)
def record_digest(record_bytes: bytes) -> bytes:
    """SHA-256 of the signed verdict record's bytes: what the challenge is drawn from and every tag is bound to.

    The last record's digest is kept: the aggregator checks every site's tags against the same record (up to 19 MB
    at d = 10^6), and a record is immutable bytes, so the kept digest is its own or not used.
    """
    digest = hashlib.sha256(b"fedfair bounded v1 record digest\x00")
    digest.update(record_bytes)
    return digest.digest()


def challenge(digest: bytes, dimension: int) -> np.ndarray:
    """The challenge rows (CHALLENGE_ROWS x d uniform field elements), from the record's digest."""
    return field.random_elements(digest, b"total challenge", CHALLENGE_ROWS * dimension).reshape(CHALLENGE_ROWS, -1)


def tags_of(rows: np.ndarray, vector: np.ndarray) -> tuple[int, ...]:
    """<r_k, vector> mod p for each challenge row r_k."""
    return tuple(field.dot(row, vector) for row in rows)


NOISE_KEY_BYTES = 32


def verifier_noise(context: BoundedContext, key: bytes) -> np.ndarray:
    """A verifier's noise on its total (d field elements): Skellam(noise_mu) each from the 32-byte ``key``, or zeros."""
    if context.noise_mu == 0:
        return np.zeros(context.dimension, dtype=np.uint64)
    return field.from_signed(noise.skellam(context.noise_mu, context.dimension, key))


def noise_commitment(context: BoundedContext, key: bytes) -> bytes:
    """SHA-256 of the aggregator's noise key, bound to the round: what its verdict record commits to."""
    return hashlib.sha256(b"fedfair bounded v1 aggregator noise key\x00" + context.digest + key).digest()


@dataclass(frozen=True)
class SignedTags:
    """A party's signed tags of its part of the total under the record's challenge.

    party: a site's id (its tags are of its explicit share) or :data:`AUDITOR` (of its total); the signature is its
    identity key's.
    """

    party: int
    tags: tuple[int, ...]
    signature: bytes

    @property
    def sender(self) -> int:
        """The party the tags are from (its signature binds it)."""
        return self.party

    def signed_bytes(self, context: BoundedContext, digest: bytes) -> bytes:
        """What the maker signs: the round's context, the record's digest, its id and its tags."""
        writer = Writer().blob(context.digest).blob(digest).u64(self.party)
        for tag in self.tags:
            writer.u64(tag)
        return b"fedfair bounded v1 total tags\x00" + writer.getvalue()

    def is_signed(self, context: BoundedContext, digest: bytes, key: ec.EllipticCurvePublicKey) -> bool:
        """Whether the tags are signed by ``key`` for this round's record."""
        return identity.is_valid_signature(key, self.signature, self.signed_bytes(context, digest))

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        writer = Writer().u64(self.party).u32(len(self.tags))
        for tag in self.tags:
            writer.u64(tag)
        return writer.blob(self.signature).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> SignedTags:
        """Parse :meth:`to_bytes`; ProtocolError if malformed, a tag is not a field element or the id is no party's."""
        reader = Reader(data)
        party, count = reader.u64(), reader.u32()
        if party >= 2**32 and party != AUDITOR:
            raise ProtocolError(f"tags from {party}: neither a site's id (a u32) nor the auditor's")
        if count != CHALLENGE_ROWS:
            raise ProtocolError(f"party {party}'s tags are {count}, not one per challenge row ({CHALLENGE_ROWS})")
        tags = tuple(reader.u64() for _ in range(count))
        signature = reader.blob(SIGNATURE_LIMIT)
        reader.finish()
        if any(tag >= field.P for tag in tags):
            raise ProtocolError(f"party {party}'s tag is not a field element")
        return cls(party, tags, signature)


def sign_tags(
    context: BoundedContext, digest: bytes, party: int, part: np.ndarray, key: ec.EllipticCurvePrivateKey
) -> SignedTags:
    """``party``'s signed tags of its ``part`` of the total under the challenge of the record ``digest``.

    ``part``: d elements, a site's explicit share or the auditor's total.
    """
    unsigned = SignedTags(party, tags_of(challenge(digest, context.dimension), part), b"")
    return SignedTags(party, unsigned.tags, identity.sign(key, unsigned.signed_bytes(context, digest)))


@dataclass(frozen=True)
class TagSet:
    """What the aggregator relays in VERIFY: the accepted sites' and the auditor's tags, its noise key, the disputes.

    tags: in increasing party order, so the auditor's last.
    noise_key: the key the aggregator's noise was drawn from (:func:`verifier_noise`), revealed to the sites only once
        the auditor tagged: the auditor never learns it, so it cannot take that noise off the total.
    disputes: each excluded site's :class:`~fedfair.secagg.bounded.record.Dispute` that held at the aggregator's own
        check, in increasing party order: a site checks each (:func:`~fedfair.secagg.bounded.record.framing`) before
        it names anyone a liar.
    """

    tags: tuple[SignedTags, ...]
    noise_key: bytes
    disputes: tuple[Dispute, ...] = ()

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        writer = Writer().u32(len(self.tags))
        for item in self.tags:
            writer.blob(item.to_bytes())
        writer.blob(self.noise_key).u32(len(self.disputes))
        for dispute in self.disputes:
            writer.blob(dispute.to_bytes())
        return writer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> TagSet:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        reader = Reader(data)
        tags = tuple(SignedTags.from_bytes(reader.blob()) for _ in range(reader.u32()))
        noise_key = reader.blob(NOISE_KEY_BYTES)
        disputes = tuple(Dispute.from_bytes(reader.blob()) for _ in range(reader.u32()))
        reader.finish()
        return cls(tags, noise_key, disputes)


def decide_upload(data: bytes | memoryview) -> SignedTags | Dispute:
    """Parse a DECIDE upload: an accepted site's or the auditor's signed tags, or an excluded site's dispute."""
    if bytes(data[: len(DISPUTE_PREFIX)]) == DISPUTE_PREFIX:
        return Dispute.from_bytes(data)
    return SignedTags.from_bytes(data)


def tags_add_up(digest: bytes, total: np.ndarray, tags: Mapping[int, SignedTags]) -> bool:
    """Whether the tags sum, row by row, to the total's tags under the record's challenge."""
    expected = tags_of(challenge(digest, total.size), total)
    return all(sum(item.tags[row] for item in tags.values()) % field.P == expected[row] for row in range(len(expected)))


def verified_total(
    context: BoundedContext,
    digest: bytes,
    accepted: tuple[int, ...],
    total: np.ndarray,
    committed_noise: bytes,
    tag_set: TagSet,
    site_keys: Mapping[int, ec.EllipticCurvePublicKey],
) -> np.ndarray:
    """The total T (signed integers in the encoded scale), once every accepted site's tags and the auditor's check it.

    ``total`` (T) and ``committed_noise`` (:func:`noise_commitment` of the aggregator's noise key) come from the record
    of ``digest``; ``accepted`` are the sites in the sum; ``site_keys`` their identity keys (the auditor's is the
    context's).

    Raises:
        VerificationError: MALFORMED, the tag set names a party twice or one outside the sum; MISSING_TAG, an
            accepted site's tags or the auditor's are not in it (nobody can check the total; the round is not
            applied); BAD_TAG, tags not signed by their maker for this record; FORGED, the aggregator's noise key is
            not the committed one, or the tags do not add up to the total less that noise (it is not the sum of the
            accepted sites' inputs and the two verifiers' noise).
    """
    makers = (*accepted, AUDITOR)
    given: dict[int, SignedTags] = {}
    for item in tag_set.tags:
        if item.party in given or item.party not in makers:
            raise VerificationError(
                context.round,
                VerifyReason.MALFORMED,
                f"the tag set names {_maker(item.party)} twice, or a party outside the bounded sum",
            )
        given[item.party] = item
    missing = [_maker(party) for party in makers if party not in given]
    if missing:
        raise VerificationError(
            context.round,
            VerifyReason.MISSING_TAG,
            f"no tags of the bounded sum's total from {', '.join(missing)}: this site cannot check it, so it applies "
            "nothing of this round",
        )
    for party, item in sorted(given.items()):
        key = context.auditor_key if party == AUDITOR else site_keys[party]
        if not item.is_signed(context, digest, key):
            raise VerificationError(
                context.round,
                VerifyReason.BAD_TAG,
                f"{_maker(party)}'s tags are not signed by it over this round's verdict record",
            )
    if noise_commitment(context, tag_set.noise_key) != committed_noise:
        raise VerificationError(
            context.round,
            VerifyReason.FORGED,
            "the aggregator's noise key is not the one its verdict record committed to",
        )
    if not tags_add_up(digest, field.subtract(total, verifier_noise(context, tag_set.noise_key)), given):
        raise VerificationError(
            context.round,
            VerifyReason.FORGED,
            "the accepted sites' tags and the auditor's do not add up to the record's total: it is not the sum of the "
            "accepted sites' inputs and the two verifiers' noise",
        )
    return field.to_signed(total)


def _maker(party: int) -> str:
    """Whom tags are from, as an error names it."""
    return "the auditor" if party == AUDITOR else f"party {party}"
