"""The verifiers' exchange and the DECIDE record: refusals of a verifier's or an aggregator's lie, and disputes."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import AuthenticationError, ProtocolError
from fedfair.pki import identity
from fedfair.secagg.bounded import field, peers
from fedfair.secagg.bounded.exchange import Commitments, Reveal
from fedfair.secagg.bounded.record import Dispute, VerdictRecord, check_round_evidence, framing, sign_record
from fedfair.secagg.bounded.shares import HelperShare, LeaderShare
from fedfair.secagg.bounded.total import decide_upload
from fedfair.secagg.bounded.upload import LeaderUpload, SealedSeed, open_seed
from fedfair.secagg.bounded.verifier import Role, Verifier, VerifierMessage, sign
from tests.secagg.bounded.roundkit import DIMENSION, Round, new_round, over_bound, simulated, vector_at

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


def keys_of(game: Round) -> dict[int, ec.EllipticCurvePublicKey]:
    """Each site's identity key, which signed the digests its verifiers' messages name."""
    return {party: key.public_key() for party, key in game.site_keys.items()}


def resigned(game: Round, record: VerdictRecord, **changes: Any) -> VerdictRecord:
    """``record`` changed and signed again by the aggregator: a record the aggregator lies in."""
    return sign_record(game.context, game.aggregator_key, dataclasses.replace(record, **changes))


def test_the_record_checks_and_names_the_liar() -> None:
    game, record, _ = decided_round()
    findings = check_round_evidence(
        game.context, VerdictRecord.from_bytes(record.to_bytes(game.context)), keys_of(game)
    )
    assert findings.accepted == (HONEST, OTHER) and set(findings.liars) == {LIAR}


def test_a_flipped_verdict_is_refused_whichever_way() -> None:
    game, record, _ = decided_round()
    liar_accepted = resigned(game, record, accepted=(HONEST, LIAR, OTHER), excluded={})
    with pytest.raises(ProtocolError, match="marks party 1 accepted, but the verifiers' signed messages reject it"):
        check_round_evidence(game.context, liar_accepted, keys_of(game))
    honest_excluded = resigned(
        game, record, accepted=(OTHER,), excluded={HONEST: ("norm",), LIAR: record.excluded[LIAR]}
    )
    with pytest.raises(ProtocolError, match="marks party 0 excluded, but the verifiers' signed messages accept it"):
        check_round_evidence(game.context, honest_excluded, keys_of(game))
    dropped_evidence = resigned(game, record, evidence={HONEST: record.evidence[HONEST]})
    with pytest.raises(ProtocolError, match="evidence for exactly the parties it decided"):
        check_round_evidence(game.context, dropped_evidence, keys_of(game))
    unsigned = dataclasses.replace(record, accepted=(HONEST, LIAR), excluded={})
    with pytest.raises(AuthenticationError, match="not signed by the aggregator"):
        check_round_evidence(game.context, unsigned, keys_of(game))


def test_altered_evidence_names_the_verifier_whose_signature_fails() -> None:
    game, record, _ = decided_round()
    item = record.evidence[LIAR]
    bad_signature = dataclasses.replace(item, helper_signature=item.leader_signature)
    with pytest.raises(AuthenticationError, match="party 1's evidence: the auditor's verifier message is not signed"):
        check_round_evidence(
            game.context, resigned(game, record, evidence={**record.evidence, LIAR: bad_signature}), keys_of(game)
        )
    moved = {**record.evidence, LIAR: record.evidence[HONEST]}  # the honest party's evidence filed under the liar
    with pytest.raises(ProtocolError, match="message filed under party 1 is about party 0"):
        check_round_evidence(game.context, resigned(game, record, evidence=moved), keys_of(game))


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
    refit = Reveal(((party, *sign(game.auditor_key, game.context.digest, game.leader.query_seed, fitted)),))
    with pytest.raises(ProtocolError, match="auditor's message about party 0 is not the one it committed to"):
        game.leader.receive_reveal(refit)
    misfiled = dataclasses.replace(honest, received=bytes(32))  # filed under a part the party never signed
    with pytest.raises(ProtocolError, match="auditor's message about party 0 is not of the part party 0 signed for it"):
        game.leader.receive_reveal(
            Reveal(((party, *sign(game.auditor_key, game.context.digest, game.leader.query_seed, misfiled)),))
        )
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


def honest_sites_decided(
    sites: tuple[int, ...] = (HONEST, LIAR, OTHER),
) -> tuple[Round, dict[int, tuple[LeaderUpload, SealedSeed]]]:
    """Honest sites' parts, within their bounds, received and decided by both verifiers; and the parts."""
    game = new_round(dict.fromkeys(sites, 1.0))
    parts = {}
    for party in sites:
        encoded = vector_at(0.5 * np.sqrt(game.context.bounds[party]), game.context.dimension, party)
        parts[party] = game.upload(party, np.round(encoded).astype(np.int64))
        game.leader.receive_upload(parts[party][0])
        game.helper.receive_upload(parts[party][1])
    from_leader, from_helper = game.exchange_until_reveal()
    game.leader.receive_reveal(from_helper)
    game.helper.receive_reveal(from_leader)
    game.leader.finish(game.helper.auditor_total())
    return game, parts


def framed_round(
    monkeypatch: pytest.MonkeyPatch, framed: tuple[int, ...] = (LIAR,), sites: tuple[int, ...] = (HONEST, LIAR, OTHER)
) -> tuple[Round, VerdictRecord, dict[int, Dispute]]:
    """Honest sites; the aggregator's message about each of ``framed`` (the second) has one output moved before it
    commits to it, so both verifiers reject it; and each one's dispute: the part it sent the aggregator."""
    receive = Verifier.receive

    def moved(verifier: Verifier, party: int, share: LeaderShare | HelperShare) -> VerifierMessage:
        message = receive(verifier, party, share)
        if verifier.role is Role.LEADER and party in framed:
            outputs = message.share.outputs.copy()
            outputs[0] = (int(outputs[0]) + 1) % field.P
            message = dataclasses.replace(message, share=dataclasses.replace(message.share, outputs=outputs))
            verifier._pending[party] = (verifier._pending[party][0], message)
        return message

    monkeypatch.setattr(Verifier, "receive", moved)
    game, parts = honest_sites_decided(sites)
    monkeypatch.undo()  # the message is recomputed honestly from here on
    return game, game.leader.record(), {party: Dispute(parts[party][0]) for party in framed}


def test_a_framed_site_shows_the_aggregators_message_false_with_its_own_part_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    game, record, disputes = framed_round(monkeypatch)
    dispute = disputes[LIAR]
    key = game.site_keys[LIAR].public_key()
    findings = check_round_evidence(game.context, record, keys_of(game))
    assert findings.accepted == (HONEST, OTHER) and set(findings.liars) == {LIAR}  # the evidence alone brands it
    verdict = framing(game.context, record, Dispute.from_bytes(dispute.to_bytes()), key)
    assert verdict.accepted and verdict.party == LIAR  # with the true message, its proof checks
    assert isinstance(decide_upload(dispute.to_bytes()), Dispute)
    with pytest.raises(AuthenticationError, match="not signed by it"):
        framing(game.context, record, dispute, game.site_keys[HONEST].public_key())


def test_an_aggregator_that_frames_two_sites_is_shown_by_each_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each framed site's dispute holds on its own part and clears it; neither needs the other's. (Four sites: two
    left of three would be below the floor of 2, and the auditor signs no total.)"""
    game, record, disputes = framed_round(monkeypatch, (LIAR, OTHER), (HONEST, LIAR, OTHER, 3))
    findings = check_round_evidence(game.context, record, keys_of(game))
    assert findings.accepted == (HONEST, 3) and set(findings.liars) == {LIAR, OTHER}
    for party, dispute in disputes.items():
        verdict = framing(game.context, record, dispute, game.site_keys[party].public_key())
        assert verdict.accepted and verdict.party == party
    # One framed site cannot show the other's part as its own: the part is signed for its party.
    borrowed = Dispute(dataclasses.replace(disputes[OTHER].upload, party=LIAR))
    with pytest.raises(AuthenticationError, match="not signed by it"):
        framing(game.context, record, borrowed, game.site_keys[LIAR].public_key())


def test_a_message_filed_under_a_part_the_site_never_signed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aggregator that frames a site names another part's digest in its message, so the site's own part would
    not be the one the message is of and its dispute would not hold: every site refuses the record instead."""
    game, record, _ = framed_round(monkeypatch)
    item = record.evidence[LIAR]
    layout = game.context.layout(LIAR)
    message = VerifierMessage.from_bytes(layout, item.leader_message)
    elsewhere = dataclasses.replace(message, received=bytes(32))
    data, signature = sign(game.aggregator_key, game.context.digest, record.query_seed, elsewhere)
    moved = {**record.evidence, LIAR: dataclasses.replace(item, leader_message=data, leader_signature=signature)}
    with pytest.raises(ProtocolError, match="messages about party 1 are not of two parts it signed"):
        check_round_evidence(game.context, resigned(game, record, evidence=moved), keys_of(game))


def test_a_liars_dispute_does_not_hold_whatever_part_it_shows() -> None:
    game, record, (liar_part, _) = decided_round()
    key = game.site_keys[LIAR].public_key()
    with pytest.raises(ProtocolError, match="is the one its part gives: its own proof failed"):
        framing(game.context, record, Dispute(liar_part), key)
    # Another part, signed by the liar too (it equivocates): not the part the aggregator's message is of.
    other = game.upload(LIAR, over_bound(game.context, LIAR, 0.5, 3))[0]
    with pytest.raises(ProtocolError, match="not the one the aggregator's message about it is of"):
        framing(game.context, record, Dispute(other), key)
    accepted = game.upload(HONEST, over_bound(game.context, HONEST, 0.5, 4))[0]
    with pytest.raises(ProtocolError, match="does not exclude it"):
        framing(game.context, record, Dispute(accepted), game.site_keys[HONEST].public_key())


def test_a_site_that_signs_its_two_parts_apart_is_refused_at_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """A site that could sign a second statement for the auditor's part could later show a dispute of another part
    than the one it sent: the aggregator takes its parts only under one signature, naming the site."""
    made = peers.make_uploads

    def apart(context: Any, party: int, key: Any, encoded: np.ndarray, witness: Any) -> Any:
        leader, sealed, helper = made(context, party, key, encoded, witness)
        if party == LIAR:
            sealed = dataclasses.replace(sealed, signature=identity.sign(key, b"another statement"))
        return leader, sealed, helper

    monkeypatch.setattr(peers, "make_uploads", apart)
    inputs = {party: np.zeros(DIMENSION, dtype=np.int64) for party in (HONEST, LIAR, OTHER)}
    with pytest.raises(ProtocolError, match="party 1 signed its two parts apart"):
        simulated(inputs, dict.fromkeys(inputs, 1.0))


def test_a_false_query_seed_is_named_as_the_aggregators() -> None:
    """Red team of issue 94: an aggregator that accepted an honest site with the auditor writes another seed in the
    record, its own message about the site recomputed and signed under it, and marks the site excluded. Both
    verifiers sign their messages under the seed they drew, so the auditor's does not check under the record's: every
    site refuses the record naming the aggregator, and the site is never brought to suspect the auditor."""
    game, parts = honest_sites_decided()
    victim = LIAR  # honest here: the aggregator frames it
    honest_record = game.leader.record()
    assert victim in honest_record.accepted  # both verifiers accepted it under the seed they drew

    seed = bytes(range(32))
    assert seed != honest_record.query_seed
    evidence = {}
    for party, item in honest_record.evidence.items():  # every message of its own recomputed and signed under it
        moved = Verifier(game.context.layout(party), Role.LEADER, seed).receive(party, parts[party][0].share)
        data, signature = sign(game.aggregator_key, game.context.digest, seed, moved)
        evidence[party] = dataclasses.replace(item, leader_message=data, leader_signature=signature)
    accepted = tuple(party for party in honest_record.accepted if party != victim)
    record = resigned(
        game, honest_record, query_seed=seed, accepted=accepted, excluded={victim: ("moved",)}, evidence=evidence
    )
    refused = "the aggregator's record is false: party 0's evidence: the auditor's verifier message is not signed"
    with pytest.raises(AuthenticationError, match=refused):
        check_round_evidence(game.context, record, keys_of(game))
    # The seed alone changed, every message as both verifiers signed it: still refused, naming the aggregator.
    with pytest.raises(
        AuthenticationError, match="the aggregator's record is false: party 0's evidence: the aggregator"
    ):
        check_round_evidence(game.context, resigned(game, honest_record, query_seed=seed), keys_of(game))


def test_an_auditor_that_frames_a_site_is_shown_to_that_site_under_the_seed_it_signed() -> None:
    """An auditor that moves its own message about an honest site, signed under the seed both drew, makes both
    verifiers reject the site: the record checks, the site has no dispute (the aggregator's message is the true one),
    and the auditor's signed message is not the one the site's share for the auditor gives under that seed, which the
    auditor's own signature binds: the auditor lied."""
    game, parts = honest_sites_decided()
    victim = LIAR  # honest here: the auditor frames it
    honest_record = game.leader.record()
    layout = game.context.layout(victim)
    item = honest_record.evidence[victim]
    true = VerifierMessage.from_bytes(layout, item.helper_message)
    outputs = true.share.outputs.copy()
    outputs[0] = (int(outputs[0]) + 1) % field.P
    false = dataclasses.replace(true, share=dataclasses.replace(true.share, outputs=outputs))
    data, signature = sign(game.auditor_key, game.context.digest, honest_record.query_seed, false)
    evidence = {
        **honest_record.evidence,
        victim: dataclasses.replace(item, helper_message=data, helper_signature=signature),
    }
    accepted = tuple(party for party in honest_record.accepted if party != victim)
    record = resigned(game, honest_record, accepted=accepted, excluded={victim: ("framed",)}, evidence=evidence)
    findings = check_round_evidence(game.context, record, keys_of(game))
    assert findings.accepted == accepted and set(findings.liars) == {victim}
    key = game.site_keys[victim].public_key()
    with pytest.raises(ProtocolError, match="its own proof failed"):
        framing(game.context, record, Dispute(parts[victim][0]), key)  # the aggregator's message is true
    helper_share = open_seed(game.context, parts[victim][1], game.auditor_cipher, key)
    recomputed = Verifier(layout, Role.HELPER, record.query_seed).receive(victim, helper_share)
    assert recomputed.to_bytes() == item.helper_message != data  # the auditor's signed message is the false one
