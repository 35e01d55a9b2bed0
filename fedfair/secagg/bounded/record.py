"""DECIDE: the verdict record every site receives, the check each site runs on it, and how a dispute is settled.

The aggregator signs a :class:`VerdictRecord`: who was accepted, who was excluded and why, for every
decided party the :class:`~fedfair.secagg.bounded.verifier.Evidence` (both verifiers' signed messages), and the
total it applies, once (checked in VERIFY against the accepted sites' tags and the auditor's, :mod:`.total`).
:func:`check_round_evidence` verifies every signature and re-runs the public ``decide`` per party, so a
site refuses a record whose verdicts do not follow from its evidence (an honest party marked excluded,
a liar marked accepted) and names who lied: an excluded party, or the verifier whose message fails.
A site the record excludes by the aggregator's false message shows it with the part it sent the aggregator alone
(:class:`Dispute`, :func:`framing`); its update stays hidden (docs/security.md, "Bounded inputs", "A framed site").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import AuthenticationError, ProtocolError
from fedfair.pki import identity
from fedfair.secagg.bounded import field as prime_field
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.exchange import COMMITMENT_BYTES
from fedfair.secagg.bounded.shares import SEED_BYTES
from fedfair.secagg.bounded.upload import LeaderUpload, check_leader_upload, leader_digest, statement
from fedfair.secagg.bounded.verifier import Evidence, Role, Verdict, Verifier, VerifierMessage, check_evidence, decide
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.wire import SIGNATURE_LIMIT


RECORD_PREFIX = b"fedfair bounded v1 verdict record\x00"


@dataclass(frozen=True)
class VerdictRecord:
    """The aggregator's signed account of a bounded sum's verdicts.

    query_seed: the verifiers' query seed, revealed now that uploads are closed (it lets a dispute be settled). Both
        verifiers signed each of their messages under it, so it is the one they drew, or the evidence fails to check.
    accepted: the parties in the sum, in increasing order.
    excluded: party -> the reasons its proof failed, for each party left out of the sum.
    evidence: party -> both verifiers' signed messages, for every accepted and excluded party.
    noise_commitment: the commitment to the key the aggregator's noise N was drawn from
        (:func:`~fedfair.secagg.bounded.total.noise_commitment`); the key itself goes to the sites in VERIFY only.
    total: the total the aggregator applies (d elements): T = S + N + A mod p, the sum of the accepted parties'
        explicit shares it holds (S), its noise (N), and the auditor's total over them (A, its noise included).
    signature: the aggregator's identity signature over the rest, bound to the round's context.
    """

    query_seed: bytes
    accepted: tuple[int, ...]
    excluded: dict[int, tuple[str, ...]]
    evidence: dict[int, Evidence]
    noise_commitment: bytes
    total: np.ndarray = field(compare=False)
    signature: bytes = b""

    def body(self, context: BoundedContext) -> bytes:
        """The bytes the aggregator signs: the context, then every field but the signature."""
        writer = Writer().blob(context.digest).blob(self.query_seed).ids(self.accepted).u32(len(self.excluded))
        for party in sorted(self.excluded):
            writer.u32(party).u32(len(self.excluded[party]))
            for reason in self.excluded[party]:
                writer.text(reason)
        writer.u32(len(self.evidence))
        for party in sorted(self.evidence):
            item = self.evidence[party]
            writer.u32(party).blob(item.leader_message).blob(item.leader_signature)
            writer.blob(item.helper_message).blob(item.helper_signature).blob(item.party_signature)
        writer.blob(self.noise_commitment).blob(prime_field.to_wire(self.total))
        return RECORD_PREFIX + writer.getvalue()

    def is_signed(self, context: BoundedContext) -> bool:
        """Whether the aggregator signed this record for this round."""
        return identity.is_valid_signature(context.aggregator_key, self.signature, self.body(context))

    def to_bytes(self, context: BoundedContext) -> bytes:
        """Canonical bytes: the signed body, then the signature."""
        return Writer().blob(self.body(context)).blob(self.signature).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> VerdictRecord:
        """Parse :meth:`to_bytes` (the context it claims is checked by :func:`check_round_evidence`).

        Raises:
            ProtocolError: the bytes are malformed.
        """
        outer = Reader(data)
        body, signature = outer.blob(), outer.blob(SIGNATURE_LIMIT)
        outer.finish()
        if not body.startswith(RECORD_PREFIX):
            raise ProtocolError("malformed verdict record: not a fedfair bounded v1 record")
        reader = Reader(body[len(RECORD_PREFIX) :])
        reader.blob(32)  # the context digest, which the signature binds
        query_seed, accepted = reader.blob(SEED_BYTES), reader.ids()
        excluded = {}
        for _ in range(reader.u32()):
            party = reader.u32()
            excluded[party] = tuple(reader.text() for _ in range(reader.u32()))
        evidence = {}
        for _ in range(reader.u32()):
            party = reader.u32()
            evidence[party] = Evidence(
                reader.blob(),
                reader.blob(SIGNATURE_LIMIT),
                reader.blob(),
                reader.blob(SIGNATURE_LIMIT),
                reader.blob(SIGNATURE_LIMIT),
            )
        noise_commitment = reader.blob(COMMITMENT_BYTES)
        total = prime_field.from_wire(reader.blob(), "the verdict record's total")
        reader.finish()
        return cls(query_seed, accepted, excluded, evidence, noise_commitment, total, signature)


def claimed_context(data: bytes | memoryview) -> bytes:
    """The digest of the context a record's bytes claim to be of (its signature binds it); ProtocolError if malformed."""
    body = Reader(data).blob()
    if not body.startswith(RECORD_PREFIX):
        raise ProtocolError("malformed verdict record: not a fedfair bounded v1 record")
    return Reader(body[len(RECORD_PREFIX) :]).fixed(32)


def sign_record(context: BoundedContext, key: ec.EllipticCurvePrivateKey, record: VerdictRecord) -> VerdictRecord:
    """``record`` signed by the aggregator's identity key."""
    return dataclasses.replace(record, signature=identity.sign(key, record.body(context)))


@dataclass(frozen=True)
class RoundFindings:
    """What a site concludes from a record that checks: who is in the sum, and who was caught lying and why.

    liars: party -> the reasons the site's own ``decide`` gave (not the aggregator's words).
    """

    accepted: tuple[int, ...]
    liars: dict[int, tuple[str, ...]]


def check_round_evidence(
    context: BoundedContext, record: VerdictRecord, site_keys: Mapping[int, ec.EllipticCurvePublicKey]
) -> RoundFindings:
    """Check the aggregator's record against its evidence: the verdicts a site can reach on its own.

    ``site_keys``: each party's identity key, which signed the digests of its two parts that the messages name.

    Raises:
        AuthenticationError: the record is not signed by the aggregator for this round, or a verifier message
            is not signed by the verifier it is from under the record's query seed (the aggregator's record is false:
            a seed other than the one both verifiers drew, or a message moved; the error names the aggregator).
        ProtocolError: a verdict does not follow from its evidence, a party is both accepted and excluded, a
            decided party has no evidence, or its messages are not of the parts it signed (the aggregator's record is
            false; the error names the party).
        ProtocolError: the record's total is not d elements.
        VerificationError: BELOW_FLOOR, the record accepts fewer parties than the context's floor (a total of them
            would show their sum, one site's input where it accepts one).
    """
    if not record.is_signed(context):
        raise AuthenticationError("the verdict record is not signed by the aggregator for this round")
    decided = set(record.accepted) | set(record.excluded)
    if set(record.accepted) & set(record.excluded):
        raise ProtocolError("the aggregator's record marks a party both accepted and excluded")
    if decided != set(record.evidence):
        raise ProtocolError("the aggregator's record does not give evidence for exactly the parties it decided")
    liars = {}
    for party in sorted(decided):
        layout = context.layout(party)
        evidence = record.evidence[party]
        received = []
        for name, data in (("aggregator", evidence.leader_message), ("auditor", evidence.helper_message)):
            try:
                message = VerifierMessage.from_bytes(layout, data)
            except ProtocolError as error:
                raise ProtocolError(f"the {name}'s message about party {party} is malformed: {error}") from None
            if message.party != party:
                raise ProtocolError(f"the {name}'s message filed under party {party} is about party {message.party}")
            received.append(message.received)
        signed = statement(context, party, *received)
        if party not in site_keys or not identity.is_valid_signature(
            site_keys[party], evidence.party_signature, signed
        ):
            raise ProtocolError(f"the verifiers' messages about party {party} are not of two parts it signed")
        try:
            verdict = check_evidence(
                layout, context.digest, record.query_seed, evidence, context.aggregator_key, context.auditor_key
            )
        except ProtocolError as error:
            # The record is the aggregator's: a message it files there that its verifier did not sign under the
            # record's query seed (a false seed, or a message moved) is the aggregator's lie, whichever verifier's.
            raise AuthenticationError(f"the aggregator's record is false: party {party}'s evidence: {error}") from None
        if verdict.accepted != (party in record.accepted):
            marked = "accepted" if party in record.accepted else "excluded"
            raise ProtocolError(
                f"the aggregator's record marks party {party} {marked}, but the verifiers' signed messages "
                f"{'accept' if verdict.accepted else 'reject'} it: the record does not follow from its evidence"
            )
        if not verdict.accepted:
            liars[party] = verdict.reasons
    if record.total.shape != (context.dimension,):
        raise ProtocolError(f"the verdict record's total is not {context.dimension} field elements")
    context.check_floor(tuple(sorted(record.accepted)), "this site tags no total of them and applies nothing")
    return RoundFindings(tuple(sorted(record.accepted)), liars)


DISPUTE_PREFIX = b"fedfair bounded v1 dispute\x00"


@dataclass(frozen=True)
class Dispute:
    """An excluded site's answer to a verdict record: the part it sent the aggregator, signed for this round.

    The aggregator's message about a party is a function of that part and the record's query seed alone
    (:class:`~fedfair.secagg.bounded.verifier.VerifierMessage`), so anyone holding the record and the part can
    recompute it (:func:`framing`). The aggregator holds the part already, and only the sites are sent it, never the
    auditor: the part alone is a uniformly random vector; with the seed the auditor holds it is the site's update.
    """

    upload: LeaderUpload

    @property
    def sender(self) -> int:
        """The disputing site (its signature over the part binds it)."""
        return self.upload.party

    def to_bytes(self) -> bytes:
        """Canonical bytes: a prefix no signed tags begin with, then the part."""
        return DISPUTE_PREFIX + self.upload.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Dispute:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        if bytes(data[: len(DISPUTE_PREFIX)]) != DISPUTE_PREFIX:
            raise ProtocolError("malformed dispute: not a fedfair bounded v1 dispute")
        return cls(LeaderUpload.from_bytes(bytes(data[len(DISPUTE_PREFIX) :])))


def framing(
    context: BoundedContext, record: VerdictRecord, dispute: Dispute, client_key: ec.EllipticCurvePublicKey
) -> Verdict:
    """The aggregator's lie a dispute shows: the verdict the disputing party gets with the aggregator's true message.

    ``record`` must have passed :func:`check_round_evidence`. The dispute holds when the part is the disputing party's
    (its signature for this round), it is the part the aggregator's signed message names (its digest), and that
    message is not the one the part gives under the record's query seed: the aggregator signed a false message, and
    is named whatever the verdict. With the true message and the auditor's, the party's proof is decided again: an
    accepted verdict clears it (it was framed); a rejected one leaves it a liar as well.

    Raises:
        AuthenticationError: the part is not signed by the disputing party for this round.
        ProtocolError: the dispute does not hold: the record does not exclude the party, the part is not the one the
            aggregator's message is of, or that message is the one the part gives (its own proof failed).
    """
    party = dispute.upload.party
    if party not in record.excluded or party not in record.evidence:
        raise ProtocolError(f"party {party} disputes a verdict record that does not exclude it")
    check_leader_upload(context, dispute.upload, client_key)
    layout = context.layout(party)
    evidence = record.evidence[party]
    claimed = VerifierMessage.from_bytes(layout, evidence.leader_message)
    if claimed.received != leader_digest(dispute.upload.share):
        raise ProtocolError(f"party {party}'s disputed part is not the one the aggregator's message about it is of")
    true = Verifier(layout, Role.LEADER, record.query_seed).receive(party, dispute.upload.share)
    if true.to_bytes() == evidence.leader_message:
        raise ProtocolError(
            f"the aggregator's message about party {party} is the one its part gives: its own proof failed"
        )
    return decide(layout, true, VerifierMessage.from_bytes(layout, evidence.helper_message))
