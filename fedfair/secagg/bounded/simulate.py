"""Run one bounded secure sum inside one process: n sites, the aggregator and the auditor, no network.

The parties are the real state machines and every message goes through its bytes, as a transport would
carry it, looping over the stages of :data:`~fedfair.secagg.bounded.stages.BOUNDED_ROUND` as a runtime does:
each stage's addressed parties take its step, the aggregator receives each upload and closes the stage. Identity
keys are generated per call and pinned. A site's part can be made to go missing (it is then absent), and a site
can lie (its encoded update over its bound, with a liar's witness).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedfair.pki.identity import generate_identity_key
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.messages import SeedRelay, SiteShare
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.parameters import BoundedParameters
from fedfair.secagg.bounded.peers import Auditor
from fedfair.secagg.bounded.record import RoundFindings, VerdictRecord
from fedfair.secagg.bounded.server import BoundedServer
from fedfair.secagg.bounded.shares import Witness, honest_witness
from fedfair.secagg.bounded.stages import BOUNDED_ROUND
from fedfair.secagg.bounded.upload import SealedSeed
from fedfair.secagg.bounded.verifier import Role
from fedfair.secagg.bounded.verifying import BoundedSum
from fedfair.secagg.round import Opening, StageSpec


@dataclass
class BoundedTrace:
    """What happened in a simulated bounded sum.

    result: the aggregator's sum and verdicts.
    record: the verdict record as the sites received it; findings: each site's check of it.
    context: the round's public parameters.
    site_seconds: per site, its time making its uploads; aggregator_seconds, auditor_seconds: each verifier's
        time in its steps (its round key, receiving, the exchange, its total, the record).
    upload_bytes: per site, its SHARE upload's bytes (both parts); exchange_bytes: per verifier, what it sent the
        other (the auditor: every upload; the aggregator: what it relays to the auditor less the sites' sealed
        seeds); record_bytes: the record each site downloads.
    culprits: the aggregator's server's culprits (:class:`~fedfair.secagg.round.SecureSum`): each excluded site
        with its reasons.
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
    culprits: dict[int, str] = field(default_factory=dict)


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
    clock: Callable[[], float] = time.perf_counter,
) -> BoundedTrace:
    """Run one bounded secure sum and return its trace.

    encoded_input(party): the site's update in the encoded scale (signed integers, d of them).
    witnesses: per lying site, the witness it proves with (the honest one otherwise).
    missing_aggregator_part: sites whose SHARE upload never reaches the aggregator (so neither part does).
    missing_auditor_part: sites whose sealed seed reaches the auditor corrupted, so it cannot open it.
    noise_key: what the auditor's noise is drawn from (None: a fresh key).
    clock: what the seconds are read from (``time.process_time`` for CPU seconds).

    Raises whatever the protocol raises, e.g. AuthenticationError or ProtocolError when a site refuses the record.
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
        noise_mu=noise_mu,
    )
    peers: dict[int, Any] = {
        party: BOUNDED_ROUND.client(parameters, party, key, (witnesses or {}).get(party, honest_witness))
        for party, key in site_keys.items()
    }
    peers[AUDITOR] = Auditor(parameters, auditor_key, noise_key)
    server = BoundedServer(parameters, aggregator_key)
    seconds = dict.fromkeys(Role, 0.0)
    trace_bytes = dict.fromkeys(Role, 0)
    site_seconds: dict[int, float] = {}
    upload_bytes: dict[int, int] = {}
    findings: dict[int, RoundFindings] = {}

    def timed(role: Role, work: Callable[..., Any], *arguments: Any) -> Any:
        """``work(*arguments)``, its seconds counted to ``role``'s verifier."""
        started = clock()
        outcome = work(*arguments)
        seconds[role] += clock() - started
        return outcome

    def take(spec: StageSpec, party: int, received: Any) -> None:
        """``party`` takes the stage's step; the aggregator receives its upload (a site's verdict: kept)."""
        if party == AUDITOR:
            outcome = timed(Role.HELPER, spec.step, peers[party], received, lambda: None)
        else:
            encoded = encoded_input(party)
            started = clock()
            outcome = spec.step(peers[party], received, lambda: encoded)
            site_seconds[party] = site_seconds.get(party, 0.0) + clock() - started
        if spec.upload is None:
            findings[party] = outcome
            return
        data = outcome.to_bytes()
        if party == AUDITOR:
            trace_bytes[Role.HELPER] += len(data)
        else:
            upload_bytes[party] = len(data)
        if party in missing_aggregator_part:
            return
        message = timed(Role.LEADER, spec.upload, data)
        if isinstance(message, SiteShare) and party in missing_auditor_part:
            message = dataclasses.replace(message, sealed=_corrupted(message))
        assert spec.receive is not None  # a stage whose parties upload a message has a server that takes it
        timed(Role.LEADER, spec.receive, server, message)

    opening: Opening | None = BOUNDED_ROUND.open_sum(server)
    for spec in BOUNDED_ROUND.sum_stages:
        assert opening is not None  # every stage of the sum but its last opens the next
        data = None if opening.inputs is None else opening.inputs.to_bytes()
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
    record_data = server.record
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
        server.culprits,
    )


def _corrupted(share: SiteShare) -> SealedSeed:
    """The site's sealed seed with one bit of its ciphertext flipped: the auditor cannot open it."""
    sealed = share.sealed
    flipped = bytes([sealed.sealed[0] ^ 1]) + sealed.sealed[1:]
    return dataclasses.replace(sealed, sealed=flipped)
