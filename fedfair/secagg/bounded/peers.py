"""The peers of a bounded secure sum that upload to the aggregator: a site, and the auditor.

Each method is one stage's client step of :data:`~fedfair.secagg.bounded.stages.BOUNDED_ROUND`: it takes the
stage's input and returns the upload; none does I/O. A site uploads in SHARE (its two parts, once the auditor's
round key checks), DECIDE (once the verdict record holds up, its signed tags of its share) and VERIFY (its verdict
on the total, once every accepted site's tags and the auditor's check it); the auditor, the second verifier, in every
other stage and in DECIDE (its signed tags of its own total), through the aggregator, which relays what the two
verifiers say to each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import AuthenticationError, ProtocolError, VerificationError, VerifyReason
from fedfair.secagg import keys
from fedfair.secagg.bounded.bystander import framings
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.exchange import AuditorTotal, Commitments, Reveal, Roster, SeedReveal
from fedfair.secagg.bounded.messages import Exchange, SeedRelay, SignedRoundKey, SiteShare
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.parameters import BoundedParameters
from fedfair.secagg.bounded.record import Dispute, RoundFindings, VerdictRecord, check_round_evidence, framing
from fedfair.secagg.bounded.shares import SEED_BYTES, HelperShare, Witness, honest_witness
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.bounded.total import SignedTags, TagSet, record_digest, sign_tags, verified_total
from fedfair.secagg.bounded.upload import LeaderUpload, make_uploads
from fedfair.secagg.bounded.verifier import Role, Verdict, Verifier
from fedfair.secagg.bounded.verifying import RoundVerifier


SETTLEMENT_PREFIX = b"fedfair bounded v1 settlement\x00"


@dataclass(frozen=True)
class Settlement:
    """What a site that shared needs to answer the round's verdict record, kept so that a restart does not lose it.

    auditor_cipher_key: the auditor's round key, as the site checked its signature (the round's context follows).
    upload: the part the site sent the aggregator: what its tags are of, and what its dispute shows.
    helper_share: the auditor's share, as the auditor opens it: what the auditor's message about the site is of.

    Secret: the two shares together are the site's update. Its witness and the update itself are not needed.
    """

    auditor_cipher_key: bytes
    upload: LeaderUpload
    helper_share: HelperShare

    def to_bytes(self) -> bytes:
        """Canonical bytes: a prefix, then each field."""
        writer = Writer().blob(self.auditor_cipher_key).blob(self.upload.to_bytes())
        return SETTLEMENT_PREFIX + writer.blob(self.helper_share.to_bytes()).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Settlement:
        """Parse :meth:`to_bytes`.

        Raises:
            ProtocolError: the bytes are not a settlement (damaged, or another file).
        """
        if not data.startswith(SETTLEMENT_PREFIX):
            raise ProtocolError("not a fedfair bounded v1 settlement")
        reader = Reader(data[len(SETTLEMENT_PREFIX) :])
        cipher_key, upload = reader.blob(64), LeaderUpload.from_bytes(reader.blob())
        helper_share = HelperShare.from_bytes(reader.blob(3 * SEED_BYTES))
        reader.finish()
        if helper_share is None:
            raise ProtocolError("a settlement's auditor share is not a seed and two parts")
        return cls(cipher_key, upload, helper_share)


class BoundedSite:
    """A site's state for one bounded secure sum."""

    def __init__(
        self,
        parameters: BoundedParameters,
        party: int,
        identity_key: ec.EllipticCurvePrivateKey,
        witness: Witness = honest_witness,
    ) -> None:
        """``identity_key``: the site's, whose public half is ``parameters.site_keys[party]``.

        ``witness`` is the honest one but for tests, which hand in a liar's.
        """
        self.parameters = parameters
        self.party = party
        self._identity_key = identity_key
        self._witness = witness
        self._context: BoundedContext | None = None
        self._upload: LeaderUpload | None = None
        """This site's part for the aggregator, as it sent it: its explicit share is what its tags are of, and the
        whole part is what it disputes a verdict record with."""
        self._helper_share: HelperShare | None = None
        """The auditor's share of this site's input, as the auditor opens it: what its message about this site is of."""
        self._record: tuple[bytes, VerdictRecord, RoundFindings] | None = None
        """The verdict record this site checked (its digest, itself, the findings), once DECIDE took it."""
        self.tagged = False
        """Whether this site tagged the record's total (DECIDE): only then does it verify it (VERIFY)."""

    def share(self, round_key: SignedRoundKey, encoded: np.ndarray) -> SiteShare:
        """SHARE: the site's two parts of its ``encoded`` update, the auditor's sealed to the checked round key.

        Raises:
            AuthenticationError: the round key is not signed by the auditor for this round.
            ConfigError: the update is over the site's bound, or not the round's dimension.
        """
        checked = round_key.checked(self.parameters.auditor_key, self.parameters.binding)
        self._context = self.parameters.context(checked)
        leader, sealed, self._helper_share = make_uploads(
            self._context, self.party, self._identity_key, encoded, self._witness
        )
        self._upload = leader
        return SiteShare(leader, sealed)

    def settlement(self) -> Settlement:
        """What this site needs past SHARE (:class:`Settlement`), to keep for a restart (ProtocolError before SHARE)."""
        if self._context is None or self._upload is None or self._helper_share is None:
            raise ProtocolError(f"party {self.party} has not shared its update: it has nothing to settle")
        return Settlement(self._context.auditor_cipher_key, self._upload, self._helper_share)

    @classmethod
    def resumed(
        cls,
        parameters: BoundedParameters,
        party: int,
        identity_key: ec.EllipticCurvePrivateKey,
        settlement: Settlement,
    ) -> BoundedSite:
        """The site as it stood after SHARE, from its kept :meth:`settlement`: it checks, tags or disputes the record.

        Raises:
            ConfigError: the kept round key is not an X25519 key.
            ProtocolError: the kept part is another party's.
        """
        if settlement.upload.party != party:
            raise ProtocolError(f"the kept part is party {settlement.upload.party}'s, not party {party}'s")
        site = cls(parameters, party, identity_key)
        site._context = parameters.context(settlement.auditor_cipher_key)
        site._upload, site._helper_share = settlement.upload, settlement.helper_share
        return site

    def check(self, record: VerdictRecord) -> RoundFindings:
        """The site's own check of the verdict record (who is in the sum, who was excluded and why); kept for VERIFY.

        Raises:
            AuthenticationError, ProtocolError: the record does not hold up (:func:`check_round_evidence`); a
                VerificationError (BELOW_FLOOR) when it accepts fewer sites than the floor.
        """
        if self._context is None:
            raise ProtocolError(f"party {self.party} was sent a verdict record before it shared its update")
        findings = check_round_evidence(self._context, record, self.parameters.site_keys)
        self._record = (record_digest(record.to_bytes(self._context)), record, findings)
        return findings

    def decide(self, record: VerdictRecord) -> SignedTags:
        """DECIDE: once the record holds up (:meth:`check`), this site's signed tags of its share under its challenge.

        Raises:
            AuthenticationError, ProtocolError: the record does not hold up, or leaves this site out of the sum (it
                has nothing to tag).
        """
        checked = self._record
        findings = checked[2] if checked is not None and checked[1] is record else self.check(record)
        assert self._context is not None and self._upload is not None and self._record is not None  # set by share
        if self.party not in findings.accepted:
            raise ProtocolError(f"the verdict record leaves party {self.party}'s update out of the sum")
        share = self._upload.share.inputs[: self._context.dimension]
        tags = sign_tags(self._context, self._record[0], self.party, share, self._identity_key)
        self.tagged = True
        return tags

    def dispute(self) -> Dispute | None:
        """DECIDE, for a site the checked record excludes: its dispute when the aggregator's message about it is false.

        False: not the one the part this site sent the aggregator gives under the record's query seed
        (:func:`framing`); the aggregator is then shown to lie whatever the verdict with the true message. None: the
        aggregator's message is the one the part gives under the record's query seed, a seed both verifiers signed
        their messages under (:meth:`auditor_framed`).

        Raises:
            ProtocolError: this site has checked no record this round, or the record does not exclude it (it accepts
                it, or leaves it out as absent).
        """
        record = self._excluding_record()
        assert self._context is not None and self._upload is not None  # set by share, before any record
        dispute = Dispute(self._upload)
        try:
            framing(self._context, record, dispute, self.parameters.site_keys[self.party])
        except (AuthenticationError, ProtocolError):
            return None
        return dispute

    def auditor_framed(self) -> bool:
        """DECIDE, for an excluded site with no :meth:`dispute`: whether the auditor's message about it is false.

        False: not the one this site's own share for the auditor gives under the record's query seed. The auditor
        signed its message under that seed (a record with another seed does not check), so the auditor framed this
        site. It cannot show that to anyone without that share, which with the aggregator's part is its update.

        Raises:
            ProtocolError: this site has checked no record this round, or the record does not exclude it (it accepts
                it, or leaves it out as absent).
        """
        record = self._excluding_record()
        assert self._context is not None and self._helper_share is not None  # set by share, before any record
        layout = self._context.layout(self.party)
        true = Verifier(layout, Role.HELPER, record.query_seed).receive(self.party, self._helper_share)
        return true.to_bytes() != record.evidence[self.party].helper_message

    def _excluding_record(self) -> VerdictRecord:
        """The record this site checked, which leaves it out of the sum (ProtocolError otherwise)."""
        if self._record is None:
            raise ProtocolError(f"party {self.party} has checked no verdict record this round")
        record = self._record[1]
        if self.party in record.accepted:
            raise ProtocolError(f"the verdict record accepts party {self.party}: there is nothing to dispute")
        if self.party not in record.excluded:
            # Left out as absent: no verifier message about it, so neither verifier can be shown to have lied.
            raise ProtocolError(
                f"the verdict record neither accepts nor excludes party {self.party}: it leaves it out as absent, "
                "with no verifier message to dispute"
            )
        return record

    def framings(self, tag_set: TagSet) -> dict[int, Verdict]:
        """VERIFY: every relayed dispute, checked against the record: disputing site -> its verdict with the true message.

        Any entry shows the aggregator signed a false message about that site (:func:`framing`).

        Raises:
            VerificationError: MALFORMED, a relayed dispute does not hold (the aggregator relays only those that held
                at its own check).
            ProtocolError: this site has checked no verdict record this round.
        """
        if self._context is None or self._record is None:
            raise ProtocolError(f"party {self.party} was sent disputes before it checked a verdict record")
        return framings(self._context, self._record[1], tag_set, self.parameters.site_keys)

    @property
    def findings(self) -> RoundFindings | None:
        """This site's own check of the verdict record it was sent (:meth:`check`; None before one held up)."""
        return None if self._record is None else self._record[2]

    @property
    def accepted(self) -> tuple[int, ...]:
        """The sites in the sum, as the verdict record this site checked says (none before DECIDE)."""
        findings = self.findings
        return () if findings is None else findings.accepted

    def verify(self, tag_set: TagSet) -> np.ndarray:
        """VERIFY: the round's total (signed integers, encoded scale), once the sites' and the auditor's tags check it.

        Raises:
            VerificationError: the total cannot be checked or is not the accepted sites' sum (:func:`verified_total`);
                FRAMED, a relayed dispute shows the aggregator framed a site (:meth:`framings`): nothing of the
                round is applied.
            ProtocolError: this site has checked no verdict record this round.
        """
        if self._context is None or self._record is None:
            raise ProtocolError(f"party {self.party} was sent tags before it checked a verdict record")
        framed = self.framings(tag_set)
        if framed:
            raise VerificationError(
                self._context.round,
                VerifyReason.FRAMED,
                f"the aggregator framed part{'ies' if len(framed) > 1 else 'y'} {', '.join(map(str, sorted(framed)))}: "
                "its signed verifier message is not the one the site's signed part gives",
            )
        digest, record, findings = self._record
        return verified_total(
            self._context,
            digest,
            findings.accepted,
            record.total,
            record.noise_commitment,
            tag_set,
            self.parameters.site_keys,
        )


class Auditor:
    """The auditor's state for one bounded secure sum: the second verifier, holding the round's cipher key."""

    def __init__(
        self, parameters: BoundedParameters, identity_key: ec.EllipticCurvePrivateKey, noise_key: bytes | None = None
    ) -> None:
        """The auditor's state, before its round key.

        ``identity_key``: the auditor's, whose public half is ``parameters.auditor_key``; ``noise_key``: what its
        noise is drawn from (:class:`RoundVerifier`).
        """
        self.parameters = parameters
        self._identity_key = identity_key
        self._noise_key = noise_key
        self._verifier: RoundVerifier | None = None
        self.tagged = False
        """Whether the auditor tagged its total under a verdict record this round (it tags one record only)."""
        self.unopened: dict[int, str] = {}
        """Site -> why its sealed seed was refused: it is absent (the auditor cannot tell its fault from a relay's)."""

    @property
    def _helper(self) -> RoundVerifier:
        if self._verifier is None:
            raise ProtocolError("the auditor has not made its round key: the bounded sum has not begun")
        return self._verifier

    def round_key(self) -> SignedRoundKey:
        """AUDITOR_KEY: a fresh X25519 key for this round, signed with the auditor's identity key."""
        if self._verifier is not None:
            raise ProtocolError("the auditor makes one round key per round")
        cipher = keys.generate_key_pair()
        public = keys.public_bytes(cipher)
        context = self.parameters.context(public)
        self._verifier = RoundVerifier(
            context, Role.HELPER, self._identity_key, self.parameters.site_keys, cipher, self._noise_key
        )
        return SignedRoundKey.sign(self._identity_key, self.parameters.binding, public)

    def exchange_rosters(self, relay: SeedRelay) -> Exchange[Roster, SeedReveal]:
        """EXCHANGE_1: open the relayed seeds; this verifier's roster, then its half of the query seed.

        Its half is drawn before it saw the aggregator's, which it holds only a commitment to, and the aggregator
        revealed its half after committing to it: neither chose the query seed.
        """
        for seed in relay.seeds:
            try:
                self._helper.receive_upload(seed)
            except (AuthenticationError, ProtocolError) as error:
                self.unopened[seed.party] = str(error)
        return Exchange(self._helper.close_uploads(), self._helper.receive_roster(relay.roster))

    def exchange_messages(self, aggregator: Exchange[SeedReveal, Commitments]) -> Exchange[Commitments, Reveal]:
        """EXCHANGE_2: from the aggregator's half, this verifier's commitments; then its signed messages.

        The messages are revealed once the aggregator committed to its own, and it reveals its own only after
        they arrive, bound by those commitments.
        """
        commitments = self._helper.receive_seed(aggregator.first)
        return Exchange(commitments, self._helper.receive_commitments(aggregator.second))

    def total(self, reveal: Reveal) -> AuditorTotal:
        """TOTAL: decide every present site from the aggregator's messages; the signed total of the accepted ones."""
        self._helper.receive_reveal(reveal)
        return self._helper.auditor_total()

    def decide(self, record: VerdictRecord) -> SignedTags:
        """DECIDE: the auditor's signed tags of its total under the challenge of the aggregator's verdict record.

        The record fixes the total the aggregator applies before the challenge is drawn from it; tagged by the
        auditor, that total can only pass the sites' check if it holds the auditor's total, noise included.

        Raises:
            AuthenticationError: the record is not signed by the aggregator for this round.
            ProtocolError: the auditor sent no total this round, tagged a record already, the record carries another
                query seed than the verifiers drew, or accepts other sites than its total covers (its tags would let a
                total over other sites pass): it withholds them.
        """
        helper = self._helper
        context = helper.context
        if not record.is_signed(context):
            raise AuthenticationError("the verdict record is not signed by the aggregator for this round")
        if self.tagged:
            raise ProtocolError("the auditor tags one verdict record per round, and it tagged one already")
        if record.query_seed != helper.query_seed:
            raise ProtocolError(
                "the verdict record carries another query seed than the one both verifiers drew: it withholds its tags"
            )
        if tuple(record.accepted) != helper.accepted:
            raise ProtocolError(
                f"the verdict record accepts parties {list(record.accepted)}, but the auditor's total covers "
                f"{list(helper.accepted)}: it withholds its tags"
            )
        digest = record_digest(record.to_bytes(context))
        tags = sign_tags(context, digest, AUDITOR, helper.noised_total(), self._identity_key)
        self.tagged = True
        return tags


def bounded_peer(
    parameters: BoundedParameters,
    party: int,
    identity_key: ec.EllipticCurvePrivateKey,
    witness: Witness = honest_witness,
) -> BoundedSite | Auditor:
    """``party``'s state for a round: the auditor's for :data:`AUDITOR`, a site's otherwise."""
    if party == AUDITOR:
        return Auditor(parameters, identity_key)
    return BoundedSite(parameters, party, identity_key, witness)
