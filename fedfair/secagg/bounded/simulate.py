"""Run one bounded secure sum inside one process: n sites, the aggregator and the auditor, no network.

The parties are the real state machines and every message goes through its bytes, as a transport would
carry it, following :data:`~fedfair.secagg.bounded.stages.BOUNDED_ROUND`. Identity keys are generated per
call and pinned. A site's part can be made to go missing (it is then absent), and a site can lie (its encoded
update over its bound, with a liar's witness).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedfair.pki.identity import generate_identity_key
from fedfair.secagg import keys
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.record import RoundFindings, VerdictRecord, check_round_evidence
from fedfair.secagg.bounded.shares import Witness, honest_witness
from fedfair.secagg.bounded.stages import BoundedStage, BoundedStep, steps
from fedfair.secagg.bounded.upload import make_uploads
from fedfair.secagg.bounded.verifier import Role
from fedfair.secagg.bounded.verifying import BoundedSum, RoundVerifier


@dataclass
class BoundedTrace:
    """What happened in a simulated bounded sum.

    result: the aggregator's sum and verdicts.
    record: the verdict record as the sites received it; findings: each site's check of it.
    context: the round's public parameters.
    site_seconds: per site, its time making its uploads; aggregator_seconds, auditor_seconds: each verifier's
        time in its steps (receiving, the VERIFY exchange, its total).
    upload_bytes: per site, its two parts' bytes; exchange_bytes: per verifier, what it sent the other
        (VERIFY and, for the auditor, TOTAL); record_bytes: the record each site downloads.
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
    clock: Callable[[], float] = time.perf_counter,
) -> BoundedTrace:
    """Run one bounded secure sum and return its trace.

    encoded_input(party): the site's update in the encoded scale (signed integers, d of them).
    witnesses: per lying site, the witness it proves with (the honest one otherwise).
    missing_aggregator_part, missing_auditor_part: sites whose part to that verifier never arrives.
    clock: what the seconds are read from (``time.process_time`` for CPU seconds).

    Raises whatever the protocol raises, e.g. AuthenticationError or ProtocolError when a site refuses the record.
    """
    site_keys = {party: generate_identity_key() for party in weights}
    aggregator_key, auditor_key = generate_identity_key(), generate_identity_key()
    auditor_cipher = keys.generate_key_pair()
    context = BoundedContext.from_plan(
        federation_id="simulated",
        round_number=1,
        session_id=b"s" * 16,
        dimension=dimension,
        fractional_bits=fractional_bits,
        update_norm=update_norm,
        weights=dict(weights),
        aggregator_key=aggregator_key.public_key(),
        auditor_key=auditor_key.public_key(),
        auditor_cipher_key=keys.public_bytes(auditor_cipher),
        noise_mu=noise_mu,
    )
    public = {party: key.public_key() for party, key in site_keys.items()}
    verifiers = {
        Role.LEADER: RoundVerifier(context, Role.LEADER, aggregator_key, public),
        Role.HELPER: RoundVerifier(context, Role.HELPER, auditor_key, public, auditor_cipher),
    }
    seconds = dict.fromkeys(Role, 0.0)
    trace_bytes = dict.fromkeys(Role, 0)

    def timed(role: Role, work: Callable[..., Any], *arguments: Any) -> Any:
        """``work(*arguments)``, its seconds counted to ``role``'s verifier."""
        started = clock()
        outcome = work(*arguments)
        seconds[role] += clock() - started
        return outcome

    def receive(role: Role, step: BoundedStep, data: bytes) -> Any:
        """``role``'s verifier parses ``data`` and takes ``step``; what it sends next."""
        handler = step.receive
        assert handler is not None  # a verifier receives every step this is called for
        return timed(role, handler, verifiers[role], timed(role, step.parse, data))

    # SHARE: each site makes its two parts; each verifier receives the part meant for it.
    share_steps = steps(BoundedStage.SHARE)
    missing = {Role.LEADER: set(missing_aggregator_part), Role.HELPER: set(missing_auditor_part)}
    site_seconds, upload_bytes = {}, {}
    for party in context.parties:
        encoded = encoded_input(party)
        started = clock()
        witness = (witnesses or {}).get(party, honest_witness)
        leader_part, helper_part = make_uploads(context, party, site_keys[party], encoded, witness)
        site_seconds[party] = clock() - started
        parts = (leader_part.to_bytes(), helper_part.to_bytes())
        upload_bytes[party] = sum(len(data) for data in parts)
        for role, step, data in zip((Role.LEADER, Role.HELPER), share_steps, parts, strict=True):
            if party not in missing[role]:
                receive(role, step, data)

    # VERIFY: each exchange step is sent by both verifiers, each to the other.
    outgoing: dict[Role, Any] = {role: timed(role, verifiers[role].close_uploads) for role in Role}
    for step in steps(BoundedStage.VERIFY):
        sent = {role: outgoing[role].to_bytes() for role in Role}
        for role in Role:
            trace_bytes[role] += len(sent[role])
        outgoing = {
            Role.LEADER: receive(Role.LEADER, step, sent[Role.HELPER]),
            Role.HELPER: receive(Role.HELPER, step, sent[Role.LEADER]),
        }

    # DECIDE: the aggregator's record to every site, which checks it on its own.
    (decide_step,) = steps(BoundedStage.DECIDE)
    record_data = timed(Role.LEADER, lambda: verifiers[Role.LEADER].record().to_bytes(context))
    record = decide_step.parse(record_data)
    findings = {party: check_round_evidence(context, record) for party in context.parties}

    # TOTAL: the auditor's total to the aggregator, which adds its own.
    (total_step,) = steps(BoundedStage.TOTAL)
    total_data = timed(Role.HELPER, lambda: verifiers[Role.HELPER].auditor_total().to_bytes())
    trace_bytes[Role.HELPER] += len(total_data)
    result = timed(Role.LEADER, lambda: verifiers[Role.LEADER].finish(total_step.parse(total_data)))
    return BoundedTrace(
        result,
        record,
        findings,
        context,
        site_seconds,
        seconds[Role.LEADER],
        seconds[Role.HELPER],
        upload_bytes,
        trace_bytes,
        len(record_data),
    )
