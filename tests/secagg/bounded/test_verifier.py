"""The verifiers' messages, signatures and evidence, and their refusals of misuse."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ProtocolError
from fedfair.secagg.bounded import field, flp
from fedfair.secagg.bounded.layout import QUERIES, Layout, squared_bound
from fedfair.secagg.bounded.shares import make_report
from fedfair.secagg.bounded.verifier import Evidence, Role, Verifier, VerifierMessage, check_evidence, sign
from tests.secagg.bounded.roundkit import packed_raw

LAYOUT = Layout(120, squared_bound(1.0, 1.0, 8))
CONTEXT = b"session 1, round 3"


def _messages(x: np.ndarray) -> tuple[VerifierMessage, VerifierMessage]:
    leader_share, helper_share = make_report(LAYOUT, field.from_signed(x))
    leader, helper = Verifier(LAYOUT, Role.LEADER, b"q" * 32), Verifier(LAYOUT, Role.HELPER, b"q" * 32)
    return leader.receive(5, leader_share), helper.receive(5, helper_share)


def test_a_message_survives_its_bytes() -> None:
    message, _ = _messages(np.full(120, 20, dtype=np.int64))
    data = message.to_bytes()
    again = VerifierMessage.from_bytes(LAYOUT, data)
    assert again.to_bytes() == data and again.party == 5
    with pytest.raises(ProtocolError, match="does not match"):
        VerifierMessage.from_bytes(LAYOUT, data[:-1])
    elements = LAYOUT.outputs + QUERIES * (2 * LAYOUT.chunk + 1)
    header = len(data) - field.wire_bytes(elements)
    at_p = np.full(elements, field.P, dtype=np.uint64)
    with pytest.raises(ProtocolError, match="not a field element"):
        VerifierMessage.from_bytes(LAYOUT, data[:header] + packed_raw(at_p))


def test_evidence_is_checked_by_signature_and_decided_by_anyone() -> None:
    leader_key, helper_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    leader_share, helper_share = make_report(LAYOUT, field.from_signed(np.full(120, 20, dtype=np.int64)))
    leader, helper = Verifier(LAYOUT, Role.LEADER, b"q" * 32), Verifier(LAYOUT, Role.HELPER, b"q" * 32)
    leader_data, leader_signature = sign(leader_key, CONTEXT, b"q" * 32, leader.receive(1, leader_share))
    helper_data, helper_signature = sign(helper_key, CONTEXT, b"q" * 32, helper.receive(1, helper_share))
    evidence = Evidence(
        leader_data, leader_signature, helper_data, helper_signature, b""
    )  # the party's: not checked here
    public = (leader_key.public_key(), helper_key.public_key())
    assert check_evidence(LAYOUT, CONTEXT, b"q" * 32, evidence, *public).accepted
    with pytest.raises(ProtocolError, match="auditor's verifier message is not signed"):
        check_evidence(
            LAYOUT,
            CONTEXT,
            b"q" * 32,
            Evidence(leader_data, leader_signature, helper_data, leader_signature, b""),
            *public,
        )
    with pytest.raises(ProtocolError, match="aggregator's verifier message is not signed"):
        check_evidence(LAYOUT, b"another round", b"q" * 32, evidence, *public)
    with pytest.raises(ProtocolError, match="aggregator's verifier message is not signed by the aggregator under"):
        check_evidence(LAYOUT, CONTEXT, b"r" * 32, evidence, *public)  # the seed is bound by the signatures


def test_a_verifier_refuses_misrouted_repeated_and_malformed_shares() -> None:
    leader_share, helper_share = make_report(LAYOUT, field.from_signed(np.full(120, 20, dtype=np.int64)))
    leader = Verifier(LAYOUT, Role.LEADER, b"q" * 32)
    with pytest.raises(ProtocolError, match="meant for the other verifier"):
        leader.receive(1, helper_share)
    leader.receive(1, leader_share)
    with pytest.raises(ProtocolError, match="second share"):
        leader.receive(1, leader_share)
    with pytest.raises(ProtocolError, match="no share from party 2"):
        leader.conclude(2, leader.receive(3, leader_share))
    other_layout = Verifier(Layout(121, LAYOUT.bound_sq), Role.LEADER, b"q" * 32)
    with pytest.raises(ProtocolError, match="does not match the round's layout"):
        other_layout.receive(1, leader_share)


def test_a_verifier_message_must_be_the_one_its_sender_committed_to() -> None:
    leader_share, helper_share = make_report(LAYOUT, field.from_signed(np.full(120, 20, dtype=np.int64)))
    leader, helper = Verifier(LAYOUT, Role.LEADER, b"q" * 32), Verifier(LAYOUT, Role.HELPER, b"q" * 32)
    leader.receive(1, leader_share)
    honest = helper.receive(1, helper_share)
    with pytest.raises(ProtocolError, match="not the one it committed to"):
        leader.conclude(1, honest)  # no commitment yet: a message sent after seeing the other's is refused
    outputs = honest.share.outputs.copy()
    outputs[0] = (int(outputs[0]) + 1) % field.P  # fitted after the fact
    fitted = VerifierMessage(
        honest.party,
        honest.received,
        honest.own_parts,
        honest.claimed_peer_parts,
        flp.VerifierShare(outputs, honest.share.wire_values, honest.share.polynomial_values),
    )
    leader.commit(1, honest.commitment())
    with pytest.raises(ProtocolError, match="committed twice"):
        leader.commit(1, fitted.commitment())
    with pytest.raises(ProtocolError, match="not the one it committed to"):
        leader.conclude(1, fitted)
    assert leader.conclude(1, honest).accepted
