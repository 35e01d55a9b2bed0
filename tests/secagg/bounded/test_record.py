"""The verifiers' exchange and the DECIDE record: refusals of a verifier's or an aggregator's lie, and disputes."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from fedfair.core.errors import AuthenticationError, ProtocolError
from fedfair.pki import identity
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.exchange import Commitments, Reveal
from fedfair.secagg.bounded.record import VerdictRecord, check_round_evidence, settle, sign_record
from fedfair.secagg.bounded.shares import HelperShare
from fedfair.secagg.bounded.upload import LeaderUpload, open_seed
from fedfair.secagg.bounded.verifier import Evidence, VerifierMessage, sign
from tests.secagg.bounded.roundkit import Round, new_round, over_bound, vector_at

HONEST, LIAR, OTHER = 0, 1, 2


def decided_round() -> tuple[Round, VerdictRecord, tuple[LeaderUpload, HelperShare]]:
    """Three sites, the second over its bound, decided (the other two are the floor's 2); and the liar's two parts as
    received (for a dispute)."""
    game = new_round({HONEST: 1.0, LIAR: 1.0, OTHER: 1.0})
    honest = np.round(vector_at(0.5 * np.sqrt(game.context.bounds[HONEST]), game.context.dimension, 1)).astype(np.int64)
    liar_parts = game.upload(LIAR, over_bound(game.context, LIAR, 2.5, 2), liar=True)
    for parts in (game.upload(HONEST, honest), liar_parts, game.upload(OTHER, -honest)):
        game.leader.receive_upload(parts[0])
        game.helper.receive_upload(parts[1])
    liar_helper_share = open_seed(game.context, liar_parts[1], game.auditor_cipher, game.site_keys[LIAR].public_key())
    from_leader, from_helper = game.exchange_until_reveal()
    game.leader.receive_reveal(from_helper)
    game.helper.receive_reveal(from_leader)
    game.leader.finish(game.helper.auditor_total())
    return game, game.leader.record(), (liar_parts[0], liar_helper_share)


def resigned(game: Round, record: VerdictRecord, **changes: Any) -> VerdictRecord:
    """``record`` changed and signed again by the aggregator: a record the aggregator lies in."""
    return sign_record(game.context, game.aggregator_key, dataclasses.replace(record, **changes))


def test_the_record_checks_and_names_the_liar() -> None:
    game, record, _ = decided_round()
    findings = check_round_evidence(game.context, VerdictRecord.from_bytes(record.to_bytes(game.context)))
    assert findings.accepted == (HONEST, OTHER) and set(findings.liars) == {LIAR}


def test_a_flipped_verdict_is_refused_whichever_way() -> None:
    game, record, _ = decided_round()
    liar_accepted = resigned(game, record, accepted=(HONEST, LIAR, OTHER), excluded={})
    with pytest.raises(ProtocolError, match="marks party 1 accepted, but the verifiers' signed messages reject it"):
        check_round_evidence(game.context, liar_accepted)
    honest_excluded = resigned(
        game, record, accepted=(OTHER,), excluded={HONEST: ("norm",), LIAR: record.excluded[LIAR]}
    )
    with pytest.raises(ProtocolError, match="marks party 0 excluded, but the verifiers' signed messages accept it"):
        check_round_evidence(game.context, honest_excluded)
    dropped_evidence = resigned(game, record, evidence={HONEST: record.evidence[HONEST]})
    with pytest.raises(ProtocolError, match="evidence for exactly the parties it decided"):
        check_round_evidence(game.context, dropped_evidence)
    unsigned = dataclasses.replace(record, accepted=(HONEST, LIAR), excluded={})
    with pytest.raises(AuthenticationError, match="not signed by the aggregator"):
        check_round_evidence(game.context, unsigned)


def test_altered_evidence_names_the_verifier_whose_signature_fails() -> None:
    game, record, _ = decided_round()
    item = record.evidence[LIAR]
    bad_signature = Evidence(item.leader_message, item.leader_signature, item.helper_message, item.leader_signature)
    with pytest.raises(AuthenticationError, match="party 1's evidence: the auditor's verifier message is not signed"):
        check_round_evidence(game.context, resigned(game, record, evidence={**record.evidence, LIAR: bad_signature}))
    moved = {**record.evidence, LIAR: record.evidence[HONEST]}  # the honest party's evidence filed under the liar
    with pytest.raises(ProtocolError, match="message filed under party 1 is about party 0"):
        check_round_evidence(game.context, resigned(game, record, evidence=moved))


def test_a_verifier_revealing_another_message_than_it_committed_to_is_refused() -> None:
    game = new_round({HONEST: 1.0})
    encoded = np.round(vector_at(0.5 * np.sqrt(game.context.bounds[HONEST]), game.context.dimension, 4)).astype(
        np.int64
    )
    leader_part, helper_part = game.upload(HONEST, encoded)
    game.leader.receive_upload(leader_part)
    game.helper.receive_upload(helper_part)
    _, from_helper = game.exchange_until_reveal()
    ((party, data, _signature),) = from_helper.entries
    honest = VerifierMessage.from_bytes(game.context.layout(party), data)
    outputs = honest.share.outputs.copy()
    outputs[0] = (int(outputs[0]) + 1) % field.P
    fitted = dataclasses.replace(honest, share=dataclasses.replace(honest.share, outputs=outputs))
    refit = Reveal(((party, *sign(game.auditor_key, game.context.digest, fitted)),))
    with pytest.raises(ProtocolError, match="auditor's message about party 0 is not the one it committed to"):
        game.leader.receive_reveal(refit)
    forged = Reveal(((party, data, identity.sign(game.aggregator_key, b"anything")),))
    with pytest.raises(AuthenticationError, match="not signed by the auditor"):
        game.leader.receive_reveal(forged)
    assert not game.leader.verdicts  # refused, nothing decided
    assert game.leader.receive_reveal(from_helper)[party].accepted
    with pytest.raises(ProtocolError, match="its messages twice"):
        game.leader.receive_reveal(from_helper)


def test_a_query_seed_half_other_than_the_committed_one_is_refused() -> None:
    game = new_round({HONEST: 1.0})
    rosters = game.leader.close_uploads(), game.helper.close_uploads()
    game.leader.receive_roster(rosters[1])
    helper_half = game.helper.receive_roster(rosters[0])
    with pytest.raises(ProtocolError, match="half of the query seed is not the one it committed to"):
        game.leader.receive_seed(dataclasses.replace(helper_half, half=bytes(32)))
    with pytest.raises(ProtocolError, match="closed its uploads already"):
        game.leader.close_uploads()
    # A second roster could commit to another half once the leader's own is out: it is refused.
    with pytest.raises(ProtocolError, match="its roster twice"):
        game.leader.receive_roster(rosters[1])


def test_each_verifier_step_refuses_what_it_has_and_asks_for_what_it_builds_on() -> None:
    """The order is the runner's; a verifier still takes nothing twice from the other, nor before its basis."""
    game = new_round({HONEST: 1.0})
    leader_part, _ = game.upload(HONEST, np.zeros(game.context.dimension, np.int64))
    with pytest.raises(ProtocolError, match="has not closed its uploads"):
        game.leader.receive_roster(game.helper.close_uploads())
    with pytest.raises(ProtocolError, match="no roster: its half has no commitment"):
        game.leader.receive_seed(game.helper.receive_roster(game.leader.close_uploads()))
    with pytest.raises(ProtocolError, match="after the aggregator closed the uploads"):
        game.leader.receive_upload(leader_part)
    with pytest.raises(ProtocolError, match="no query seed yet"):
        game.leader.receive_commitments(Commitments(()))
    with pytest.raises(ProtocolError, match="revealed no messages of its own"):
        game.leader.receive_reveal(Reveal(()))
    with pytest.raises(ProtocolError, match="has no total yet"):
        game.leader.share_sum()


def test_a_dispute_is_settled_from_the_two_parts_the_site_signed() -> None:
    game, record, (leader_part, helper_share) = decided_round()
    liar_key = game.site_keys[LIAR].public_key()
    verdict = settle(game.context, record.query_seed, leader_part, helper_share, liar_key)
    assert not verdict.accepted and verdict.reasons == record.excluded[LIAR]
    other = game.upload(LIAR, over_bound(game.context, LIAR, 0.5, 3))[0]  # parts the liar never sent
    with pytest.raises(AuthenticationError, match="did not sign these two parts"):
        settle(game.context, record.query_seed, other, helper_share, liar_key)
