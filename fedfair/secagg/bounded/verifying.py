"""One verifier's state for one bounded secure sum, from the uploads to its total, without I/O.

The aggregator and the auditor each run a :class:`RoundVerifier`; each step takes what the other sent and returns
what to send it, in :data:`~fedfair.secagg.bounded.stages.BOUNDED_ROUND`'s order, which its runners keep
(:class:`~fedfair.secagg.round_order.ServerOrder`, :class:`~fedfair.secagg.round_order.PartyOrder`): a step refuses only what is
inconsistent, missing what it builds on, or taken twice from the other verifier (ProtocolError). The steps: receive
each party's signed part (a refused or missing part leaves it absent); close the uploads (:class:`Roster`: present =
both parts arrived, with a commitment to a half of the query seed); reveal the half; commit to a message per present
party; reveal the signed messages (one not the committed one is refused); decide. Then the auditor's signed total,
the aggregator's verdict record (DECIDE) and the sum. DP: each verifier adds Skellam(noise_mu) to its total, from a
key only it holds, so the total carries noise either alone cannot take off (docs/security.md, "Bounded inputs").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedfair.core.errors import AuthenticationError, ConfigError, ProtocolError
from fedfair.pki import identity
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.exchange import (
    AuditorTotal,
    Commitments,
    Reveal,
    Roster,
    SeedReveal,
    query_seed,
    seed_commitment,
)
from fedfair.secagg.bounded.record import VerdictRecord, sign_record
from fedfair.secagg.bounded.shares import SEED_BYTES, HelperShare, LeaderShare
from fedfair.secagg.bounded.total import noise_commitment, verifier_noise
from fedfair.secagg.bounded.upload import LeaderUpload, SealedSeed, check_leader_upload, open_seed
from fedfair.secagg.bounded.verifier import Evidence, Role, Verdict, Verifier, VerifierMessage, is_signed, sign


@dataclass(frozen=True)
class BoundedSum:
    """The outcome of a bounded secure sum at the aggregator.

    total: the sum of the accepted parties' encoded updates and of both verifiers' noise (signed integers).
    accepted: the parties in the sum; excluded: party -> why its proof failed; absent: parties whose two
        parts did not both arrive (neither in the sum nor named).
    fractional_bits: f, so that ``total / 2^f`` is the sum in the update's units (:meth:`decoded`).
    """

    total: np.ndarray
    accepted: tuple[int, ...]
    excluded: dict[int, tuple[str, ...]]
    absent: tuple[int, ...]
    fractional_bits: int

    def decoded(self) -> np.ndarray:
        """The sum in the update's units (float64)."""
        return np.ldexp(self.total.astype(np.float64), -self.fractional_bits)


class RoundVerifier:
    """The aggregator's (Role.LEADER) or the auditor's (Role.HELPER) state for one bounded secure sum."""

    def __init__(
        self,
        context: BoundedContext,
        role: Role,
        identity_key: ec.EllipticCurvePrivateKey,
        client_keys: dict[int, ec.EllipticCurvePublicKey],
        auditor_cipher: X25519PrivateKey | None = None,
        noise_key: bytes | None = None,
    ) -> None:
        """``auditor_cipher``: the auditor's X25519 round key (the auditor only), whose public half is in the context.

        ``noise_key``: the 32-byte key this verifier's noise is drawn from; None draws one from the OS's CSPRNG. A key
        derived per round lets a round run again carry the same noise (the auditor's:
        :mod:`fedfair.runtime.auditor.totals`; the aggregator's: :func:`~fedfair.secagg.bounded.server.noise_key_of`).
        """
        if (role is Role.HELPER) != (auditor_cipher is not None):
            raise ConfigError(
                "the auditor, and only the auditor, holds the round's cipher key: pass it to the auditor's"
            )
        self.context = context
        self.role = role
        self._identity_key = identity_key
        self._client_keys = client_keys
        self._auditor_cipher = auditor_cipher
        self._noise_key = os.urandom(32) if noise_key is None else noise_key
        self._shares: dict[int, LeaderShare | HelperShare] = {}
        self._signed_parts: dict[int, tuple[bytes, bytes]] = {}
        """Party -> its signature over both parts' digests, and the digest it signed for the other verifier's part."""
        self._seed_half = os.urandom(SEED_BYTES)
        self._roster: Roster | None = None
        """This verifier's roster, once it closed the uploads."""
        self._peer_roster: Roster | None = None
        self.present: tuple[int, ...] = ()
        self._verifiers: dict[int, Verifier] = {}
        self._messages: dict[int, VerifierMessage] | None = None
        """A message per present party, once the query seed is drawn."""
        self._signed: dict[int, tuple[bytes, bytes]] | None = None
        """This verifier's signed messages, once it took the other's commitments."""
        self.query_seed = b""
        """The round's query seed, once both halves are in (empty before): what both verifiers sign their messages under,
        and what the auditor checks the verdict record carries before it tags it."""
        self._decided = False
        """Whether every present party was decided (the other verifier's messages taken)."""
        self.verdicts: dict[int, Verdict] = {}
        self.evidence: dict[int, Evidence] = {}
        self._noised_total: np.ndarray | None = None
        self._auditor_total: AuditorTotal | None = None

    def receive_upload(self, upload: LeaderUpload | SealedSeed) -> None:
        """Keep a party's part once its signature checks.

        Raises:
            AuthenticationError: the part is not signed by its party for this round, or the seal does not open.
            ProtocolError: uploads are closed, the party is unknown, sent twice, sent the other verifier's part, or
                a share of the wrong shape or outside the field.
        """
        if self._roster is not None:
            raise ProtocolError(f"party {upload.party}'s part arrived after the {self.role.value} closed the uploads")
        party = upload.party
        if party not in self._client_keys or party not in self.context.bounds:
            raise ProtocolError(f"party {party} is not in this round")
        if party in self._shares:
            raise ProtocolError(f"party {party} sent its part twice this round")
        if isinstance(upload, LeaderUpload) and self.role is Role.LEADER:
            check_leader_upload(self.context, upload, self._client_keys[party])
            _check_shape(self.context, upload)
            self._shares[party] = upload.share
            self._signed_parts[party] = (upload.signature, upload.helper_digest)
        elif isinstance(upload, SealedSeed) and self._auditor_cipher is not None:
            self._shares[party] = open_seed(self.context, upload, self._auditor_cipher, self._client_keys[party])
            self._signed_parts[party] = (upload.signature, upload.leader_digest)
        else:
            raise ProtocolError(f"party {party} sent the {self.role.value} the other verifier's part")

    def close_uploads(self) -> Roster:
        """Close the uploads: whom this verifier holds a part from, and its commitment to its half of the query seed."""
        if self._roster is not None:
            raise ProtocolError(f"the {self.role.value} closed its uploads already this round")
        self._roster = Roster(tuple(sorted(self._shares)), seed_commitment(self.context.digest, self._seed_half))
        return self._roster

    def receive_roster(self, peer: Roster) -> SeedReveal:
        """Take the other verifier's roster: the present parties are those both hold a part from.

        Raises:
            ProtocolError: this verifier has not closed its uploads, or took a roster already (a second could commit
                to another half of the query seed once this verifier's half is out).
        """
        if self._roster is None:
            raise ProtocolError(f"the {self.role.value} has not closed its uploads: it takes no roster yet")
        if self._peer_roster is not None:
            raise ProtocolError(f"the other verifier sent the {self.role.value} its roster twice")
        self._peer_roster = peer
        self.present = tuple(sorted(set(self._shares) & set(peer.parties)))
        return SeedReveal(self._seed_half)

    def receive_seed(self, peer: SeedReveal) -> Commitments:
        """Take the other verifier's half of the query seed; compute and commit to a message per present party.

        Raises:
            ProtocolError: the half is not the one the other verifier committed to in its roster, no roster committed
                to one, or a half was taken already.
        """
        if self._peer_roster is None:
            raise ProtocolError(f"the other verifier sent the {self.role.value} no roster: its half has no commitment")
        if self._messages is not None:
            raise ProtocolError(f"the other verifier sent the {self.role.value} its half of the query seed twice")
        if seed_commitment(self.context.digest, peer.half) != self._peer_roster.seed_commitment:
            raise ProtocolError("the other verifier's half of the query seed is not the one it committed to")
        halves = (self._seed_half, peer.half) if self.role is Role.LEADER else (peer.half, self._seed_half)
        self.query_seed = query_seed(self.context.digest, *halves)
        messages = {}
        for party in self.present:
            bound = self.context.bounds[party]
            if bound not in self._verifiers:
                self._verifiers[bound] = Verifier(self.context.layout(party), self.role, self.query_seed)
            messages[party] = self._verifiers[bound].receive(party, self._shares.pop(party))
        self._shares.clear()  # an absent party's part is dropped unread
        self._messages = messages
        return Commitments(tuple((party, messages[party].commitment()) for party in self.present))

    def receive_commitments(self, peer: Commitments) -> Reveal:
        """Record the other verifier's commitments; reveal this verifier's signed messages.

        Raises:
            ProtocolError: the commitments are not for exactly the present parties, this verifier has no messages
                yet (no query seed), or took commitments already (a second set could fit messages it revealed).
        """
        messages = self._messages
        if messages is None:
            raise ProtocolError(f"the {self.role.value} has no query seed yet: it takes no commitments")
        if self._signed is not None:
            raise ProtocolError(f"the other verifier sent the {self.role.value} its commitments twice")
        if tuple(party for party, _ in peer.entries) != self.present:
            raise ProtocolError("the other verifier committed to messages about other parties than the present ones")
        for party, commitment in peer.entries:
            self._verifier(party).commit(party, commitment)
        seed = self.query_seed
        signed = {party: sign(self._identity_key, self.context.digest, seed, messages[party]) for party in self.present}
        self._signed = signed
        return Reveal(tuple((party, *signed[party]) for party in self.present))

    def receive_reveal(self, peer: Reveal) -> dict[int, Verdict]:
        """Decide every present party from the two messages; the accepted ones' shares join this verifier's total.

        Raises:
            AuthenticationError: a message is not signed by the other verifier for this round.
            ProtocolError: the messages are not for exactly the present parties, one does not parse, or one is
                not the message its sender committed to (the other verifier misbehaved; no party is judged on it);
                this verifier revealed no messages of its own yet, or decided already.
        """
        signed = self._signed
        if signed is None:
            raise ProtocolError(f"the {self.role.value} has revealed no messages of its own: it takes none yet")
        if self._decided:
            raise ProtocolError(f"the other verifier sent the {self.role.value} its messages twice")
        if tuple(party for party, _, _ in peer.entries) != self.present:
            raise ProtocolError("the other verifier revealed messages about other parties than the present ones")
        peer_key = self.context.auditor_key if self.role is Role.LEADER else self.context.aggregator_key
        peer_name = Role.HELPER.value if self.role is Role.LEADER else Role.LEADER.value
        parsed = {}
        for party, data, signature in peer.entries:
            if not is_signed(peer_key, self.context.digest, self.query_seed, data, signature):
                raise AuthenticationError(
                    f"the {peer_name}'s message about party {party} is not signed by the {peer_name}"
                )
            message = VerifierMessage.from_bytes(self.context.layout(party), data)
            if message.received != self._signed_parts[party][1]:
                raise ProtocolError(
                    f"the {peer_name}'s message about party {party} is not of the part party {party} signed for it"
                )
            if not self._verifier(party).committed_to(party, message):
                raise ProtocolError(f"the {peer_name}'s message about party {party} is not the one it committed to")
            parsed[party] = (message, data, signature)
        for party, (message, data, signature) in parsed.items():
            self.verdicts[party] = self._verifier(party).conclude(party, message)
            own = signed[party]
            leader, helper = (own, (data, signature)) if self.role is Role.LEADER else ((data, signature), own)
            self.evidence[party] = Evidence(*leader, *helper, self._signed_parts[party][0])
        self._decided = True
        return dict(self.verdicts)

    @property
    def accepted(self) -> tuple[int, ...]:
        """The present parties whose proofs were accepted."""
        return tuple(party for party in self.present if self.verdicts.get(party, Verdict(party, False)).accepted)

    def noised_total(self) -> np.ndarray:
        """This verifier's total over the accepted parties (field elements) with its Skellam(noise_mu) added.

        The auditor's noise is bound to what the sites check by its tags of its total; the aggregator's by its record's
        commitment to its noise key, which it reveals to the sites (not the auditor) in VERIFY, so the sites recompute
        that noise and it can hide no shift. The noise is drawn once per key: asked again, the same total comes back.
        """
        if self._noised_total is None:
            self._noised_total = field.add(self.share_sum(), self.noise())
        return self._noised_total

    def noise(self) -> np.ndarray:
        """This verifier's noise (field elements), from its key (:func:`~fedfair.secagg.bounded.total.verifier_noise`)."""
        return verifier_noise(self.context, self._noise_key)

    @property
    def noise_key(self) -> bytes:
        """The key this verifier's noise is drawn from: the aggregator reveals its own to the sites in VERIFY."""
        return self._noise_key

    def share_sum(self) -> np.ndarray:
        """The sum of this verifier's shares of the accepted parties' inputs (field elements), without noise.

        The aggregator's is its part of the total its verdict record carries, which each accepted site checks against
        the tags (:mod:`.total`).
        """
        self._refuse_undecided()
        total = np.zeros(self.context.dimension, dtype=np.uint64)
        for verifier in self._verifiers.values():
            total = field.add(total, verifier.total())
        return total

    def auditor_total(self) -> AuditorTotal:
        """TOTAL: the auditor's noised total over the accepted parties, signed for the aggregator.

        Raises:
            ProtocolError: this verifier is the aggregator.
            VerificationError: BELOW_FLOOR, the accepted parties are fewer than the context's floor: no total of
                them is signed, so no sum of them can be formed.
        """
        if self.role is not Role.HELPER:
            raise ProtocolError("only the auditor sends its total to the aggregator")
        self.context.check_floor(self.accepted, "the auditor signs no total of them")
        unsigned = AuditorTotal(self.accepted, self.noised_total(), b"")
        signature = identity.sign(self._identity_key, unsigned.signed_bytes(self.context.digest))
        return AuditorTotal(unsigned.accepted, unsigned.total, signature)

    def record(self) -> VerdictRecord:
        """DECIDE: the aggregator's signed verdict record, with both verifiers' signed messages for every party.

        It carries the total the aggregator applies once: its noised share-sum plus the auditor's total (so it is made
        once :meth:`finish` took the auditor's total), and the commitment to its noise key.
        """
        self._refuse_undecided()
        if self.role is not Role.LEADER:
            raise ProtocolError("the aggregator, not the auditor, sends the verdict record to the sites")
        if self._auditor_total is None:
            raise ProtocolError("the auditor's total has not arrived: the verdict record carries it")
        excluded = {party: self.verdicts[party].reasons for party in self.present if party not in self.accepted}
        total = field.add(self.noised_total(), self._auditor_total.total)
        commitment = noise_commitment(self.context, self._noise_key)
        unsigned = VerdictRecord(self.query_seed, self.accepted, excluded, dict(self.evidence), commitment, total)
        return sign_record(self.context, self._identity_key, unsigned)

    def finish(self, auditor: AuditorTotal) -> BoundedSum:
        """The sum of the accepted parties' updates (and both verifiers' noise), from the auditor's total.

        Raises:
            AuthenticationError: the total is not signed by the auditor for this round.
            ProtocolError: it covers other parties than the ones both verifiers accepted.
            VerificationError: BELOW_FLOOR, they are fewer than the context's floor.
        """
        if self.role is not Role.LEADER:
            raise ProtocolError("the aggregator, not the auditor, adds the two totals")
        if not identity.is_valid_signature(
            self.context.auditor_key, auditor.signature, auditor.signed_bytes(self.context.digest)
        ):
            raise AuthenticationError("the auditor's total is not signed by the auditor for this round")
        if auditor.accepted != self.accepted or auditor.total.shape != (self.context.dimension,):
            raise ProtocolError("the auditor's total covers other parties, or another dimension, than this round's")
        self.context.check_floor(self.accepted, "the aggregator forms no sum of them")
        self._auditor_total = auditor
        total = field.to_signed(field.add(self.noised_total(), auditor.total))
        excluded = {party: self.verdicts[party].reasons for party in self.present if party not in self.accepted}
        absent = tuple(party for party in self.context.parties if party not in self.present)
        return BoundedSum(total, self.accepted, excluded, absent, self.context.fractional_bits)

    def _verifier(self, party: int) -> Verifier:
        return self._verifiers[self.context.bounds[party]]

    def _refuse_undecided(self) -> None:
        if not self._decided:
            raise ProtocolError(f"the {self.role.value} has not decided the present parties: it has no total yet")


def _check_shape(context: BoundedContext, upload: LeaderUpload) -> None:
    """Refuse, at upload, a share that the verifier's query could not take: it would stop the round at VERIFY."""
    layout, share = context.layout(upload.party), upload.share
    if not share.fits(layout):
        raise ProtocolError(f"party {upload.party}'s share does not match its layout (d and its bound)")
    if np.any(share.inputs >= np.uint64(field.P)) or np.any(share.values >= np.uint64(field.P)):
        raise ProtocolError(f"party {upload.party}'s share holds a value that is not a field element")
