"""The aggregator's state for one bounded secure sum: the leading verifier, and the relay to the auditor.

Each method is one stage's server step of :data:`~fedfair.secagg.bounded.stages.BOUNDED_ROUND` (a receive, or a
close that opens the next stage); none does I/O. Everything the two verifiers say to each other passes through
here, so the auditor talks to the aggregator only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedfair.core.errors import AuthenticationError, ConfigError, ProtocolError
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.exchange import AuditorTotal, Commitments, Reveal, Roster, SeedReveal
from fedfair.secagg.bounded.messages import Encoded, Exchange, SeedRelay, ShareOpening, SignedRoundKey, SiteShare
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.parameters import BoundedParameters, round_parameters
from fedfair.secagg.bounded.record import Dispute, VerdictRecord, framing
from fedfair.secagg.bounded.total import SignedTags, TagSet, record_digest, tags_add_up
from fedfair.secagg.bounded.upload import SealedSeed, leader_digest
from fedfair.secagg.bounded.verifier import Role
from fedfair.secagg.bounded.verifying import BoundedSum, RoundVerifier
from fedfair.secagg.codec import Writer
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import Decoded
from fedfair.secagg.server import AggregateResult
from fedfair.secagg.round import Opening, RoundSetup


VERIFIERS = 2
"""The verifiers that each add Skellam(noise_mu) to the total: the aggregator and the auditor."""


def noise_key_of(noise_secret: bytes, config: SecAggConfig) -> bytes:
    """The key the aggregator's noise for the round of `config` is drawn from.

    HKDF-SHA256 of the aggregator's noise secret (kept in its output folder, beside its checkpoint) over the round's
    name (federation, session round, the model it trains, `config.context`). A round run again on the same model gets
    the same key, across restarts and a renewal of the aggregator's identity key, so the auditor, which is sent each
    run's verdict record, cannot average two draws; nobody without the secret can tell the noise before the sites
    are told it.
    """
    name = Writer().text(config.federation_id).u64(config.round).blob(config.context).getvalue()
    derived = HKDF(hashes.SHA256(), 32, salt=None, info=b"fedfair bounded v1 aggregator noise key\x00" + name)
    return derived.derive(noise_secret)


class BoundedServer:
    """The aggregator's state for one bounded secure sum.

    It keeps the :class:`~fedfair.secagg.round.SecureSum` interface's names for who is at fault: a site whose
    proof fails is a culprit the server saw itself, and excluded; nobody accuses anybody.
    """

    def __init__(
        self,
        parameters: BoundedParameters,
        identity_key: ec.EllipticCurvePrivateKey,
        public: bytes = b"",
        names: Mapping[int, str] | None = None,
        noise_key: bytes | None = None,
    ) -> None:
        """``identity_key``: the aggregator's, whose public half is ``parameters.aggregator_key``.

        ``public``: the round's public parameters as the runner states them, sent to every site with the round key.
        ``names``: each party's name, for the reasons an operator reads (None: parties are named by id).
        ``noise_key``: what the aggregator's noise is drawn from (None: a fresh key; :func:`noise_key_of`).
        """
        self.parameters = parameters
        self._names = names or {}
        self._identity_key = identity_key
        self._noise_key = noise_key
        self._public = public
        self._verifier: RoundVerifier | None = None
        self._round_key: SignedRoundKey | None = None
        self._half_and_commitments: tuple[SeedReveal, Commitments] | None = None
        self._seeds: list[SealedSeed] = []
        self._reveal: Reveal | None = None
        self._record = b""
        self._verdict_record: VerdictRecord | None = None
        self._total = np.zeros(0, np.uint64)
        self._result: BoundedSum | None = None
        self._tags: dict[int, SignedTags] = {}
        self._disputes: dict[int, Dispute] = {}

    @classmethod
    def for_round(cls, config: SecAggConfig, setup: RoundSetup) -> BoundedServer:
        """The aggregator's server for a round of `config` (:func:`round_parameters`), signing with its identity key.

        Raises:
            ConfigError: the setup lacks the aggregator's identity key, or what :func:`round_parameters` needs.
        """
        if setup.identity_key is None or not setup.noise_secret:
            raise ConfigError(
                "the bounded sum's server signs its verdict record and draws its noise: give it the aggregator's "
                "identity key and noise secret"
            )
        names = {config.party_id(name): name for name in config.parties}
        parameters = round_parameters(config, setup)
        return cls(parameters, setup.identity_key, setup.public, names, noise_key_of(setup.noise_secret, config))

    @property
    def context(self) -> BoundedContext:
        """The round's context (once the auditor's round key arrived)."""
        return self._leader.context

    @property
    def _leader(self) -> RoundVerifier:
        if self._verifier is None:
            raise ProtocolError("the auditor's round key has not arrived: the bounded sum has not begun")
        return self._verifier

    def receive_round_key(self, signed: SignedRoundKey) -> None:
        """AUDITOR_KEY: check the auditor's round key and begin the round's context with it."""
        if self._verifier is not None:
            raise ProtocolError("the auditor sent its round key twice")
        context = self.parameters.context(signed.checked(self.parameters.auditor_key, self.parameters.binding))
        self._verifier = RoundVerifier(
            context, Role.LEADER, self._identity_key, self.parameters.site_keys, noise_key=self._noise_key
        )
        self._round_key = signed

    def open_shares(self) -> Opening:
        """Close AUDITOR_KEY: every site is sent the round's public parameters and the signed round key."""
        if self._round_key is None:
            raise ProtocolError("the auditor's round key has not arrived: the bounded sum cannot begin")
        return Opening(self.parameters.sites, ShareOpening(self._public, self._round_key))

    def receive_share(self, share: SiteShare) -> None:
        """SHARE: take a site's part (refused: ProtocolError or AuthenticationError) and keep its seed to relay.

        Both parts must carry the one signature, over the aggregator's part's digest and the auditor's: a site that
        signed its parts apart could show a dispute of another part than the one it sent (:mod:`.record`).
        """
        if share.sealed.party != share.leader.party:
            raise ProtocolError(f"party {share.leader.party} sent the auditor's part of another party")
        if share.sealed.signature != share.leader.signature or share.sealed.leader_digest != leader_digest(
            share.leader.share
        ):
            raise ProtocolError(f"party {share.leader.party} signed its two parts apart: one signature binds both")
        self._leader.receive_upload(share.leader)
        self._seeds.append(share.sealed)

    def relay_seeds(self) -> Opening:
        """Close SHARE: the auditor is sent the sealed seeds and this verifier's roster."""
        seeds = tuple(sorted(self._seeds, key=lambda seed: seed.party))
        return Opening((AUDITOR,), SeedRelay(seeds, self._leader.close_uploads()))

    def receive_auditor_roster(self, exchange: Exchange[Roster, SeedReveal]) -> None:
        """EXCHANGE_1: the auditor's roster, then its half of the query seed."""
        self._half_and_commitments = (
            self._leader.receive_roster(exchange.first),
            self._leader.receive_seed(exchange.second),
        )

    def send_seed(self) -> Opening:
        """Close EXCHANGE_1: the auditor is sent this verifier's half of the query seed and its commitments."""
        if self._half_and_commitments is None:
            raise ProtocolError("the auditor's roster has not arrived")
        return Opening((AUDITOR,), Exchange(*self._half_and_commitments))

    def receive_auditor_messages(self, exchange: Exchange[Commitments, Reveal]) -> None:
        """EXCHANGE_2: the auditor's commitments, then its signed messages; every present site is decided."""
        self._reveal = self._leader.receive_commitments(exchange.first)
        self._leader.receive_reveal(exchange.second)

    def send_reveal(self) -> Opening:
        """Close EXCHANGE_2: the auditor is sent this verifier's signed messages."""
        if self._reveal is None:
            raise ProtocolError("the auditor's messages have not arrived")
        return Opening((AUDITOR,), self._reveal)

    def receive_total(self, total: AuditorTotal) -> None:
        """TOTAL: the auditor's signed total; the sum is made with it."""
        self._result = self._leader.finish(total)

    def send_record(self) -> Opening:
        """Close TOTAL: every present site, and the auditor, is sent the signed verdict record, once the sum is made.

        Without the auditor's total there is no sum, so no site is asked to decide on one (ProtocolError).
        """
        if self._result is None:
            raise ProtocolError("the auditor's total has not arrived: no site decides on a round without its sum")
        record = self._leader.record()
        self._verdict_record = record
        self._record, self._total = record.to_bytes(self.context), record.total
        return Opening((*self._leader.present, AUDITOR), Encoded(self._record))

    def receive_tags(self, tags: SignedTags | Dispute) -> None:
        """DECIDE: an accepted site's signed tags of its share, the auditor's of its total, or an excluded site's dispute.

        A dispute that holds (:func:`~fedfair.secagg.bounded.record.framing`: this aggregator's own message about the
        site was not the one its part gives) is kept for VERIFY, where every accepted site is sent it, and the site is
        no culprit.

        Raises:
            ProtocolError: the tags are from a party outside the sum, or sent twice; the dispute does not hold.
            AuthenticationError: they are not signed by their maker over this round's record.
        """
        if isinstance(tags, Dispute):
            assert self._verdict_record is not None  # DECIDE opens with the record
            party = tags.sender
            if party not in self.parameters.site_keys or party in self._disputes:
                raise ProtocolError(f"party {party} is not a site of this round, or sent its dispute twice")
            framing(self.context, self._verdict_record, tags, self.parameters.site_keys[party])
            self._disputes[party] = tags
            return
        if tags.party not in (*self.outcome.accepted, AUDITOR) or tags.party in self._tags:
            raise ProtocolError(f"party {tags.party} is not in the bounded sum, or sent its tags twice")
        key = self.parameters.auditor_key if tags.party == AUDITOR else self.parameters.site_keys[tags.party]
        if not tags.is_signed(self.context, record_digest(self._record), key):
            raise AuthenticationError(f"party {tags.party}'s tags are not signed by it over this round's record")
        self._tags[tags.party] = tags

    def tags_withheld(self) -> str | None:
        """Why the tags must not be relayed: a site's or the auditor's is missing, or they do not add up to the total.

        Relayed, either would make every accepted site refuse the total; withheld, the round is void and the model
        stays as it was. Without noise the next round on it is held to this round's roster (a site that left at
        DECIDE is waited for once; docs/security.md, "A site that leaves at DECIDE"). The auditor withholds its tags
        from a record that is not signed by this aggregator or accepts other sites than its total covers.
        """
        untagged = [
            self._names.get(party, f"party {party}") for party in self.outcome.accepted if party not in self._tags
        ]
        if AUDITOR not in self._tags:
            untagged.append("the auditor")
        if untagged:
            return f"no tags of the bounded sum's total from {', '.join(untagged)}: nobody could check it"
        if not tags_add_up(record_digest(self._record), field.subtract(self._total, self._leader.noise()), self._tags):
            return (
                "the tags do not add up to this aggregator's total: a site tagged another share, or the auditor "
                "another total"
            )
        return None

    def framed(self) -> str | None:
        """Why the round is void once VERIFY is over: an excluded site's dispute held.

        This aggregator's own signed message about the site was false (a fault of its own, or a hostile aggregator's);
        every accepted site was shown the dispute and refuses the round, and the site is no culprit (:attr:`culprits`).
        """
        if not self._disputes:
            return None
        names = ", ".join(self._names.get(party, f"party {party}") for party in sorted(self._disputes))
        return (
            f"{names} showed, with the part it sent, that this aggregator's signed verifier message about it was not "
            "the one the part gives: the verdict record framed it, every site refuses the round, and it is not excluded"
        )

    def tag_set(self) -> Opening:
        """Open VERIFY: every site that tagged is sent the tags, this verifier's noise key and the disputes that held.

        The tags are every accepted site's and the auditor's; the auditor, which tagged already, is sent nothing, so
        it never learns the key, nor a disputed part (with the auditor's seed, a site's update).
        """
        tags = TagSet(
            tuple(self._tags[party] for party in sorted(self._tags)),
            self._leader.noise_key,
            tuple(self._disputes[party] for party in sorted(self._disputes)),
        )
        return Opening(tuple(party for party in sorted(self._tags) if party != AUDITOR), tags)

    @property
    def outcome(self) -> BoundedSum:
        """The sum of the accepted sites' updates and both verifiers' noise, and who is in it and out."""
        if self._result is None:
            raise ProtocolError("the auditor's total has not arrived: the bounded sum is not finished")
        return self._result

    def finish(self) -> AggregateResult:
        """The sum as a :class:`~fedfair.secagg.round.SecureSum` hands it over: decoded, weighed, its contributors.

        The weighted sum is the accepted sites' updates (w times delta) in the update's units; the total weight is the
        sum of their plan weights, which are public, so no word of the sum carries it; each site's stochastic
        rounding moved each coordinate by under 2^-f. An update within update_norm w moves no coordinate of the mean
        by more than update_norm, so that is its clip. The noise, each verifier's Skellam(noise_mu), has variance
        2 noise_mu each, 4 noise_mu in all, in the encoded scale.
        """
        result = self.outcome
        scale = 2.0**-self.parameters.fractional_bits
        decoded = Decoded(
            weighted_sum=result.decoded(),
            total_weight=math.fsum(self.parameters.weights[party] for party in result.accepted),
            error_bound=len(result.accepted) * scale,
            clip=self.parameters.update_norm,
            noise_std=math.sqrt(2.0 * VERIFIERS * self.parameters.noise_mu) * scale,
        )
        return AggregateResult(result.total, decoded, result.accepted, {}, self.culprits, {})

    @property
    def record(self) -> bytes:
        """The signed verdict record's bytes, as the sites were sent them (empty before TOTAL closed)."""
        return self._record

    @property
    def culprits(self) -> dict[int, str]:
        """Site -> why its proof failed (the sites left out of the sum for it), but a site whose dispute held."""
        verifier = self._verifier
        if verifier is None:
            return {}
        return {
            party: "; ".join(verdict.reasons)
            for party, verdict in sorted(verifier.verdicts.items())
            if not verdict.accepted and party not in self._disputes
        }

    @property
    def accusations(self) -> dict[int, tuple[int, ...]]:
        """Nobody accuses anybody in a bounded sum."""
        return {}

    def excluded(self) -> dict[int, str]:
        """Every culprit: the server checked each failed proof itself, so no accuser could have lied."""
        return self.culprits
