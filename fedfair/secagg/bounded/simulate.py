"""Run one bounded secure sum inside one process: n sites, the aggregator and the auditor, no network.

The parties are the real state machines and every message goes through its bytes, as a transport would
carry it, looping over the stages of :data:`~fedfair.secagg.bounded.stages.BOUNDED_ROUND` as a runtime does:
each stage's addressed parties take its step, the aggregator receives each upload and closes the stage. Identity
keys are generated per call and pinned. A site's part can be made to go missing (it is then absent), a site
can lie (its encoded update over its bound, with a liar's witness), and the aggregator can lie about the total (its
verdict record, re-signed, or the tags it relays), which every accepted site checks in VERIFY; a site can collude with
it (its tags of the record, made with its key once it saw the record).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.pki.identity import generate_identity_key
from fedfair.core.errors import AuthenticationError, ProtocolError
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.messages import SeedRelay, SiteShare
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.parameters import BoundedParameters
from fedfair.secagg.bounded.messages import Encoded
from fedfair.secagg.bounded.peers import Auditor
from fedfair.secagg.bounded.record import RoundFindings, VerdictRecord, sign_record
from fedfair.secagg.bounded.server import BoundedServer
from fedfair.secagg.bounded.shares import Witness, honest_witness
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, BoundedStage
from fedfair.secagg.bounded.total import SignedTags, TagSet, record_digest
from fedfair.secagg.bounded.upload import SealedSeed
from fedfair.secagg.bounded.verifier import Role
from fedfair.secagg.bounded.verifying import BoundedSum
from fedfair.secagg.round import AnyStage, Opening


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


def simulate_bounded_round(
    *,
    dimension: int,
    fractional_bits: int,
    update_norm: float,
    weights: Mapping[int, float],
    encoded_input: Callable[[int], np.ndarray],
    witnesses: Mapping[int, Witness] | None = None,
    missing_aggregator_part: Collection[int] = (),
    missing_auditor_part: Collection[int] = (),
    noise_mu: float = 0.0,
    noise_key: bytes | None = None,
    aggregator_noise_key: bytes | None = None,
    floor: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    forged_record: Callable[[VerdictRecord], VerdictRecord] | None = None,
    forged_tags: Callable[[TagSet], TagSet] | None = None,
    silent_at_decide: Collection[int] = (),
    colluder_tags: Callable[[BoundedContext, bytes, SignedTags, Any], SignedTags] | None = None,
) -> BoundedTrace:
    """Run one bounded secure sum and return its trace.

    encoded_input(party): the site's update in the encoded scale (signed integers, d of them).
    witnesses: per lying site, the witness it proves with (the honest one otherwise).
    missing_aggregator_part: sites whose SHARE upload never reaches the aggregator (so neither part does).
    missing_auditor_part: sites whose sealed seed reaches the auditor corrupted, so it cannot open it.
    noise_key, aggregator_noise_key: what the auditor's noise, and the aggregator's, are drawn from (None: fresh keys).
    floor: the fewest accepted inputs a total may cover (the plan's threshold; 2, the least any plan has).
    clock: what the seconds are read from (``time.process_time`` for CPU seconds).
    forged_record: a hostile aggregator's change to its verdict record, which it signs again before sending it.
    forged_tags: a hostile aggregator's change to the tag set it relays in VERIFY (relayed even where a runtime
        would withhold it).
    silent_at_decide: sites that check the record but whose tags never reach the aggregator (they left).
    colluder_tags: a site colluding with the aggregator: colluder_tags(the context, the record's digest, its honest
        tags, its identity key) -> the tags it sends instead (return the honest tags unchanged for any other site).

    A site that refuses the record or the total is kept in the trace's refusals; anything else the protocol raises
    is raised.
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
        party: BOUNDED_ROUND.client(parameters, party, key, (witnesses or {}).get(party, honest_witness))
        for party, key in site_keys.items()
    }
    peers[AUDITOR] = Auditor(parameters, auditor_key, noise_key)
    server = BoundedServer(parameters, aggregator_key, noise_key=aggregator_noise_key)
    seconds = dict.fromkeys(Role, 0.0)
    trace_bytes = dict.fromkeys(Role, 0)
    site_seconds: dict[int, float] = {}
    upload_bytes: dict[int, int] = {}
    findings: dict[int, RoundFindings] = {}
    totals: dict[int, np.ndarray] = {}
    refusals: dict[int, ProtocolError] = {}
    tags: list[SignedTags] = []
    tag_bytes = {"up": 0, "down": 0}

    def timed(role: Role, work: Callable[..., Any], *arguments: Any) -> Any:
        """``work(*arguments)``, its seconds counted to ``role``'s verifier."""
        started = clock()
        outcome = work(*arguments)
        seconds[role] += clock() - started
        return outcome

    def take(spec: AnyStage, party: int, received: Any) -> None:
        """``party`` takes the stage's step; the aggregator receives its upload (a site's verified total: kept)."""
        if spec.stage is BoundedStage.DECIDE and party != AUDITOR:
            try:
                findings[party] = peers[party].check(received)
            except (AuthenticationError, ProtocolError) as error:
                refusals[party] = error
                return
            if party not in findings[party].accepted:
                return  # named a liar (or left out): it has nothing to tag
        if party == AUDITOR:
            try:
                outcome = timed(Role.HELPER, spec.step, peers[party], received, lambda: None)
            except (AuthenticationError, ProtocolError) as error:
                if spec.stage is not BoundedStage.DECIDE:
                    raise
                refusals[party] = error  # it withholds its tags of a record it cannot stand behind
                return
        else:
            encoded = encoded_input(party)
            started = clock()
            try:
                outcome = spec.step(peers[party], received, lambda: encoded)
            except ProtocolError as error:
                if spec.stage is not BoundedStage.VERIFY:
                    raise
                refusals[party] = error
                return
            site_seconds[party] = site_seconds.get(party, 0.0) + clock() - started
        if spec.upload is None:
            totals[party] = outcome
            return
        if isinstance(outcome, SignedTags):
            if party in silent_at_decide:
                return
            if colluder_tags is not None and party != AUDITOR:
                outcome = colluder_tags(server.context, record_digest(record_data), outcome, site_keys[party])
            tags.append(outcome)
            if forged_record is not None:
                return  # the hostile aggregator relays what it was sent, whatever it signed
        data = outcome.to_bytes()
        if party == AUDITOR:
            trace_bytes[Role.HELPER] += len(data)
        elif spec.stage is BoundedStage.SHARE:
            upload_bytes[party] = len(data)
        elif spec.stage is BoundedStage.DECIDE:
            tag_bytes["up"] = len(data)
        if party in missing_aggregator_part:
            return
        message = timed(Role.LEADER, spec.upload, data)
        if isinstance(message, SiteShare) and party in missing_auditor_part:
            message = dataclasses.replace(message, sealed=_corrupted(message))
        assert spec.receive is not None  # a stage whose parties upload a message has a server that takes it
        timed(Role.LEADER, spec.receive, server, message)

    opening: Opening | None = BOUNDED_ROUND.open_sum(server)
    withheld, record_data = None, b""
    for spec in BOUNDED_ROUND.stages(True):
        if spec.stage is BoundedStage.VERIFY:
            withheld = None if forged_record is not None else timed(Role.LEADER, server.tags_withheld)
            if forged_record is not None or forged_tags is not None:
                opening = _tag_opening(tags, server.tag_set().inputs.noise_key, forged_tags)
            else:
                opening = timed(Role.LEADER, BOUNDED_ROUND.open_verification, server, server.outcome)
        assert opening is not None  # every stage of the sum but its last opens the next
        if spec.stage is BoundedStage.DECIDE and forged_record is not None:
            record = forged_record(VerdictRecord.from_bytes(opening.inputs.to_bytes()))
            forged = sign_record(server.context, aggregator_key, record).to_bytes(server.context)
            opening = Opening(opening.among, Encoded(forged))
        data = None if opening.inputs is None else opening.inputs.to_bytes()
        if spec.stage is BoundedStage.DECIDE:
            record_data = data or b""
        if spec.stage is BoundedStage.VERIFY:
            tag_bytes["down"] = len(data or b"")
        if AUDITOR in opening.among and data is not None:
            relayed = opening.inputs.seeds if isinstance(opening.inputs, SeedRelay) else ()
            trace_bytes[Role.LEADER] += len(data) - sum(len(seed.to_bytes()) for seed in relayed)
        for party in opening.among:
            received = None
            if data is not None and spec.received is not None:
                role = Role.HELPER if party == AUDITOR else None
                received = spec.received(data) if role is None else timed(role, spec.received, data)
            take(spec, party, received)
        opening = None if spec.close is None else timed(Role.LEADER, spec.close, server)
    result: BoundedSum = timed(Role.LEADER, lambda: server.outcome)
    return BoundedTrace(
        result,
        VerdictRecord.from_bytes(record_data),
        findings,
        server.context,
        site_seconds,
        seconds[Role.LEADER],
        seconds[Role.HELPER],
        upload_bytes,
        trace_bytes,
        len(record_data),
        tag_bytes["up"],
        tag_bytes["down"],
        server.culprits,
        totals,
        refusals,
        withheld,
        dict(parameters.site_keys),
    )


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
