"""The bounded sum's cast and faults for the one simulator: n sites, the aggregator and the auditor, no network.

The round runs in the one simulator (:func:`~fedfair.secagg.simulate.run_round`), over
:data:`~fedfair.secagg.bounded.stages.BOUNDED_ROUND`'s stages as a runtime runs them, among the parties
:func:`bounded_cast` makes (identity keys generated per call and pinned); what goes wrong is a fault strategy
(:class:`BoundedFaults`). A site's part can be made to go missing (it is then absent), a site can lie (its encoded
update over its bound, with a liar's witness), and the aggregator can lie about the total (its verdict record,
re-signed, or the tags it relays), which every accepted site checks in VERIFY; a site can collude with it (its tags of
the record, made with its key once it saw the record). :class:`BoundedTrace` reads the one simulator's trace in the
bounded sum's terms.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ProtocolError
from fedfair.pki.identity import generate_identity_key
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.messages import Encoded, SiteShare
from fedfair.secagg.bounded.parameters import BoundedParameters
from fedfair.secagg.bounded.peers import Auditor, BoundedSite, bounded_peer
from fedfair.secagg.bounded.record import RoundFindings, VerdictRecord, sign_record
from fedfair.secagg.bounded.server import BoundedServer
from fedfair.secagg.bounded.shares import Witness, honest_witness
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, BoundedStage
from fedfair.secagg.bounded.total import SignedTags, TagSet, record_digest
from fedfair.secagg.bounded.upload import SealedSeed
from fedfair.secagg.bounded.verifier import Role
from fedfair.secagg.bounded.verifying import BoundedSum
from fedfair.secagg.round import AnyStage, Opening
from fedfair.secagg.simulate import Cast, Faults, RoundTrace, run_round


@dataclass
class BoundedTrace:
    """What happened in a simulated bounded sum.

    result: the aggregator's sum and verdicts.
    record: the verdict record as the sites received it; findings: each site's check of it.
    context: the round's public parameters.
    site_seconds: per site, its time making its uploads; aggregator_seconds, auditor_seconds: each verifier's
        time in its steps (its round key, receiving, the exchange, its total, the record, the auditor's tags).
    upload_bytes: per site, its SHARE upload's bytes (both parts); exchange_bytes: per verifier, what it sent the
        other (the auditor: every upload; the aggregator: what it relays to the auditor less the sites' sealed
        seeds, the verdict record included); record_bytes: the record each site downloads; tag_bytes_up: a site's
        DECIDE upload (its signed tags); tag_bytes_down: the tag set each site downloads in VERIFY.
    culprits: the aggregator's server's culprits (:class:`~fedfair.secagg.round.SecureSum`): each excluded site
        with its reasons.
    totals: per accepted site, the total it verified in VERIFY (signed integers, encoded scale).
    refusals: per site, why it refused the record (DECIDE) or the total (VERIFY); such a site applies nothing. Under
        :data:`AUDITOR`, why the auditor withheld its tags of the record.
    withheld: why an aggregator runtime would have voided the round rather than relay the tags (None: it relays).
    site_keys: each site's identity key, which a check of the record needs (:func:`check_round_evidence`).
    stage_bytes: per stage's name, the most bytes a site sent in it and the most it was sent.
    shares: each site's SHARE upload as the aggregator received it (none where a fault lost it), for its bytes part by
        part.
    """

    result: BoundedSum
    record: VerdictRecord
    findings: dict[int, RoundFindings]
    context: BoundedContext
    site_seconds: dict[int, float] = field(default_factory=dict)
    aggregator_seconds: float = 0.0
    auditor_seconds: float = 0.0
    upload_bytes: dict[int, int] = field(default_factory=dict)
    exchange_bytes: dict[Role, int] = field(default_factory=dict)
    record_bytes: int = 0
    tag_bytes_up: int = 0
    tag_bytes_down: int = 0
    culprits: dict[int, str] = field(default_factory=dict)
    totals: dict[int, np.ndarray] = field(default_factory=dict)
    refusals: dict[int, ProtocolError] = field(default_factory=dict)
    withheld: str | None = None
    site_keys: dict[int, ec.EllipticCurvePublicKey] = field(default_factory=dict)
    stage_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)
    shares: dict[int, SiteShare] = field(default_factory=dict)

    @classmethod
    def of(cls, trace: RoundTrace, cast: Cast, faults: BoundedFaults, shares: Mapping[int, SiteShare]) -> BoundedTrace:
        """The one simulator's `trace` of a bounded sum among `cast` under `faults`, in the bounded sum's terms.

        shares: each site's SHARE upload as the aggregator received it; the sealed seeds in them, which it relays to the
        auditor, are not the verifiers' exchange.
        """
        server: BoundedServer = cast.server
        sites = {party: peer for party, peer in cast.parties.items() if isinstance(peer, BoundedSite)}
        findings = {party: site.findings for party, site in sites.items() if site.findings is not None}
        # A site the record leaves out (named a liar, or absent) has nothing to tag: no refusal of its own.
        refusals = {
            party: error
            for party, error in trace.refusals.items()
            if party not in findings or party in findings[party].accepted
        }
        contribution, decide = BOUNDED_ROUND.contribution, BOUNDED_ROUND.committed
        verify = BOUNDED_ROUND.verify_stages[0].stage
        site_seconds: dict[int, float] = {}
        for by_party in trace.party_seconds.values():
            for party in sites.keys() & by_party.keys():
                site_seconds[party] = site_seconds.get(party, 0.0) + by_party[party]
        tags_up = [size for party, size in trace.stage_upload_bytes[decide].items() if party != AUDITOR]
        relayed_seed_bytes = sum(len(share.sealed.to_bytes()) for share in shares.values())
        stage_bytes = {
            stage.name: (
                max(
                    (size for party, size in trace.stage_upload_bytes.get(stage, {}).items() if party in sites),
                    default=0,
                ),
                max(
                    (size for party, size in trace.stage_download_bytes.get(stage, {}).items() if party in sites),
                    default=0,
                ),
            )
            for stage in BoundedStage
        }
        return cls(
            server.outcome,
            VerdictRecord.from_bytes(faults.record),
            findings,
            server.context,
            site_seconds,
            sum(trace.server_seconds.values()),
            sum(by_party.get(AUDITOR, 0.0) for by_party in trace.party_seconds.values()),
            dict(trace.stage_upload_bytes[contribution]),
            {
                Role.HELPER: trace.upload_bytes[AUDITOR],
                Role.LEADER: trace.download_bytes[AUDITOR] - relayed_seed_bytes,
            },
            len(faults.record),
            max(tags_up, default=0),
            max(trace.stage_download_bytes[verify].values(), default=0),
            server.culprits,
            {party: total for party, total in trace.verdicts.items() if party in sites},
            refusals,
            None if faults.forged_record is not None else trace.withheld.get(decide),
            dict(server.parameters.site_keys),
            stage_bytes,
            dict(shares),
        )


def bounded_cast(
    *,
    dimension: int,
    fractional_bits: int,
    update_norm: float,
    weights: Mapping[int, float],
    witnesses: Mapping[int, Witness] | None = None,
    noise_mu: float = 0.0,
    noise_key: bytes | None = None,
    aggregator_noise_key: bytes | None = None,
    floor: int = 2,
) -> Cast:
    """The sites of `weights` (by party id), the auditor (under :data:`AUDITOR`) and the aggregator's server.

    witnesses: per lying site, the witness it proves with (the honest one otherwise).
    noise_key, aggregator_noise_key: what the auditor's noise, and the aggregator's, are drawn from (None: fresh keys).
    floor: the fewest accepted inputs a total may cover (the plan's threshold; 2, the least any plan has).
    """
    site_keys = {party: generate_identity_key() for party in weights}
    aggregator_key, auditor_key = generate_identity_key(), generate_identity_key()
    parameters = BoundedParameters(
        federation_id="simulated",
        round_number=1,
        session_id=b"s" * 16,
        dimension=dimension,
        fractional_bits=fractional_bits,
        update_norm=update_norm,
        weights=dict(weights),
        aggregator_key=aggregator_key.public_key(),
        auditor_key=auditor_key.public_key(),
        site_keys={party: key.public_key() for party, key in site_keys.items()},
        floor=floor,
        noise_mu=noise_mu,
    )
    peers: dict[int, Any] = {
        party: bounded_peer(parameters, party, key, (witnesses or {}).get(party, honest_witness))
        for party, key in site_keys.items()
    }
    peers[AUDITOR] = Auditor(parameters, auditor_key, noise_key)
    server = BoundedServer(parameters, aggregator_key, noise_key=aggregator_noise_key)
    return Cast(server, peers, {**site_keys, AUDITOR: auditor_key}, aggregator_key)


@dataclass
class BoundedFaults(Faults):
    """What goes wrong in a bounded sum, by what travels (a site's parts, the verdict record, tags, the tag set).

    missing_aggregator_part: sites whose SHARE upload never reaches the aggregator (so neither part does).
    missing_auditor_part: sites whose sealed seed reaches the auditor corrupted, so it cannot open it.
    forged_record: a hostile aggregator's change to its verdict record, which it signs again before sending it; it
        then relays the tags it was sent, whatever it signed.
    forged_tags: a hostile aggregator's change to the tag set it relays in VERIFY (relayed even where a runtime
        would withhold it).
    silent_at_decide: sites that check the record but whose tags never reach the aggregator (they left).
    colluder_tags: a site colluding with the aggregator: colluder_tags(the context, the record's digest, its honest
        tags, its identity key) -> the tags it sends instead (return the honest tags unchanged for any other site).
    keys: who signs what (:attr:`Cast.identities`, :attr:`Cast.server_identity`): the forger's and colluders' keys.
    record: the verdict record as the sites were sent it (once DECIDE opened).
    """

    keys: Cast
    missing_aggregator_part: Collection[int] = ()
    missing_auditor_part: Collection[int] = ()
    forged_record: Callable[[VerdictRecord], VerdictRecord] | None = None
    forged_tags: Callable[[TagSet], TagSet] | None = None
    silent_at_decide: Collection[int] = ()
    colluder_tags: Callable[[BoundedContext, bytes, SignedTags, Any], SignedTags] | None = None
    record: bytes = b""
    _tags: list[SignedTags] = field(default_factory=list)

    def opening(self, spec: AnyStage, opening: Opening, server: BoundedServer) -> Opening:
        """The verdict record, forged and signed again; the tag set, rebuilt from the tags sent and forged."""
        if isinstance(opening.inputs, Encoded):
            sent = opening.inputs
            if self.forged_record is not None:
                assert self.keys.server_identity is not None  # the bounded sum's aggregator signs its record
                record = self.forged_record(VerdictRecord.from_bytes(sent.data))
                sent = Encoded(sign_record(server.context, self.keys.server_identity, record).to_bytes(server.context))
                opening = Opening(opening.among, sent)
            self.record = sent.data
        if isinstance(opening.inputs, TagSet) and (self.forged_record is not None or self.forged_tags is not None):
            return _tag_opening(self._tags, opening.inputs.noise_key, self.forged_tags)
        return opening

    def upload(self, spec: AnyStage, party: int, upload: Any, server: BoundedServer) -> Any | None:
        """A site's parts lost or its seed corrupted; tags lost, a colluder's instead, or kept by a forger."""
        if isinstance(upload, SiteShare):
            if party in self.missing_aggregator_part:
                return None
            if party in self.missing_auditor_part:
                return dataclasses.replace(upload, sealed=_corrupted(upload))
        if isinstance(upload, SignedTags):
            if party in self.silent_at_decide:
                return None
            if self.colluder_tags is not None and party != AUDITOR:
                digest = record_digest(self.record)
                upload = self.colluder_tags(server.context, digest, upload, self.keys.identities[party])
            self._tags.append(upload)
            if self.forged_record is not None:
                return None  # the hostile aggregator relays what it was sent, whatever it signed
        return upload


def simulate_bounded_round(
    *,
    dimension: int,
    fractional_bits: int,
    update_norm: float,
    weights: Mapping[int, float],
    encoded_input: Callable[[int], np.ndarray],
    witnesses: Mapping[int, Witness] | None = None,
    noise_mu: float = 0.0,
    noise_key: bytes | None = None,
    aggregator_noise_key: bytes | None = None,
    floor: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    **faults: Any,
) -> BoundedTrace:
    """Run one bounded secure sum among :func:`bounded_cast`'s parties in the one simulator; return its trace.

    encoded_input(party): the site's update in the encoded scale (signed integers, d of them).
    clock: what the seconds are read from (``time.process_time`` for CPU seconds).
    faults: :class:`BoundedFaults`'s fields but its keys (none: an honest round).

    A site that refuses the record or the total, and the auditor that withholds its tags, are kept in the trace's
    refusals; anything else the protocol raises is raised.
    """
    cast = bounded_cast(
        dimension=dimension,
        fractional_bits=fractional_bits,
        update_norm=update_norm,
        weights=weights,
        witnesses=witnesses,
        noise_mu=noise_mu,
        noise_key=noise_key,
        aggregator_noise_key=aggregator_noise_key,
        floor=floor,
    )
    strategy = BoundedFaults(cast, **faults)
    shares: dict[int, SiteShare] = {}

    def observe(message: Any) -> None:
        if isinstance(message, SiteShare):
            shares[message.sender] = message

    refusals = (BOUNDED_ROUND.committed, *(spec.stage for spec in BOUNDED_ROUND.verify_stages))
    trace = run_round(
        BOUNDED_ROUND, cast, encoded_input, strategy, observe, verified=True, clock=clock, refusals=refusals
    )
    return BoundedTrace.of(trace, cast, strategy, shares)


def _tag_opening(tags: list[SignedTags], noise_key: bytes, forged: Callable[[TagSet], TagSet] | None) -> Opening:
    """VERIFY's opening as a hostile aggregator makes it: the tags it was sent and its key, changed by ``forged``."""
    tag_set = TagSet(tuple(sorted(tags, key=lambda item: item.party)), noise_key)
    if forged is not None:
        tag_set = forged(tag_set)
    return Opening(tuple(sorted(item.party for item in tags if item.party != AUDITOR)), tag_set)


def _corrupted(share: SiteShare) -> SealedSeed:
    """The site's sealed seed with one bit of its ciphertext flipped: the auditor cannot open it."""
    sealed = share.sealed
    flipped = bytes([sealed.sealed[0] ^ 1]) + sealed.sealed[1:]
    return dataclasses.replace(sealed, sealed=flipped)
