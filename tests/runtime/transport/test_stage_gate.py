"""The stage gate: every message bound to (federation, round, stage); replays, late and foreign messages refused."""

from __future__ import annotations

import grpc
import pytest

from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.transport import (
    NOT_EXPECTED,
    StageGate,
    make_binding,
    pb,
)
from fedfair.runtime.transport.stage_gate import STATUS_CODES
from tests.runtime.wire_stages import WIRE

FEDERATION = "test-federation"


def test_stage_gate_refuses_replays_late_and_foreign_messages() -> None:
    now = [0.0]
    gate = StageGate(FEDERATION, clock=lambda: now[0])
    assert gate.current is None
    keys = gate.open(1, WIRE["STAGE_ADVERTISE_KEYS"], timeout_seconds=10, participants=["alpha", "beta"])
    assert gate.current == keys
    gate.admit(keys, "alpha")
    assert gate.submitted() == {"alpha"}

    def refused_by_gate(binding: pb.Binding, peer: str) -> None:
        with pytest.raises(RefusedError) as caught:
            gate.admit(binding, peer)
        assert STATUS_CODES[caught.value.reason] == grpc.StatusCode.FAILED_PRECONDITION
        assert str(caught.value) == NOT_EXPECTED and peer not in str(caught.value)

    refused_by_gate(keys, "alpha")  # replay
    refused_by_gate(keys, "gamma")  # not a participant of this stage
    refused_by_gate(make_binding("other", 1, WIRE["STAGE_ADVERTISE_KEYS"]), "beta")
    refused_by_gate(make_binding(FEDERATION, 1, WIRE["STAGE_SHARE_KEYS"]), "beta")  # early
    now[0] = 11.0
    refused_by_gate(keys, "beta")  # past the deadline

    shares = gate.open(1, WIRE["STAGE_SHARE_KEYS"])
    refused_by_gate(keys, "beta")  # late: that stage has closed
    gate.admit(shares, "beta")
    gate.check_read(keys)  # reads of an earlier stage of this round are fine
    with pytest.raises(RefusedError):
        gate.check_read(make_binding(FEDERATION, 1, WIRE["STAGE_MASKED_INPUT"]))
    with pytest.raises(RefusedError):
        gate.check_read(make_binding(FEDERATION, 0, WIRE["STAGE_JOIN"]))
    with pytest.raises(ValueError, match="only move forward"):
        gate.open(1, WIRE["STAGE_ADVERTISE_KEYS"])
    gate.close()
    refused_by_gate(shares, "alpha")
    gate.check_federation(shares)
    with pytest.raises(RefusedError):
        gate.check_federation(make_binding("other", 0, WIRE["STAGE_JOIN"]))


def test_an_upload_a_recent_stage_still_awaited_is_late_and_anything_else_is_refused_as_before() -> None:
    """A LATE refusal (logged quietly) is only for a peer a stage closed in this round or the one before, or the
    open stage past its deadline, was still waiting for; every refusal gives the caller the same status."""
    now = [0.0]
    gate = StageGate(FEDERATION, clock=lambda: now[0])
    unmask = gate.open(1, WIRE["STAGE_UNMASK"], timeout_seconds=10, participants=["alpha", "beta", "gamma"])
    gate.admit(unmask, "alpha")

    def refusal(binding: pb.Binding, peer: str) -> Refusal:
        with pytest.raises(RefusedError) as caught:
            gate.admit(binding, peer)
        assert (STATUS_CODES[caught.value.reason], str(caught.value)) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            NOT_EXPECTED,
        )
        return caught.value.reason

    now[0] = 11.0  # past the deadline, still open
    assert refusal(unmask, "beta") is Refusal.LATE
    assert refusal(unmask, "alpha") is Refusal.NOT_EXPECTED  # a replay is not late
    gate.close()
    assert refusal(unmask, "beta") is Refusal.LATE
    assert refusal(unmask, "delta") is Refusal.NOT_EXPECTED  # never a participant
    assert refusal(make_binding("other", 1, WIRE["STAGE_UNMASK"]), "beta") is Refusal.NOT_EXPECTED
    assert refusal(make_binding(FEDERATION, 1, WIRE["STAGE_CONSISTENCY"]), "beta") is Refusal.NOT_EXPECTED
    train = gate.open(2, WIRE["STAGE_TRAIN"])
    assert refusal(unmask, "gamma") is Refusal.LATE  # the stage closed last, though another is open
    keys = gate.open(2, WIRE["STAGE_ADVERTISE_KEYS"])
    # Two stages back, as an honest site's unmask is when the evaluation's keys open at once.
    assert refusal(unmask, "gamma") is Refusal.LATE
    assert refusal(train, "gamma") is Refusal.LATE  # the train stage awaited anyone
    gate.admit(keys, "gamma")
    gate.open(3, WIRE["STAGE_TRAIN"])
    assert refusal(unmask, "gamma") is Refusal.NOT_EXPECTED  # two rounds back: no longer tracked
    assert refusal(train, "gamma") is Refusal.LATE  # the round before
    assert refusal(keys, "gamma") is Refusal.NOT_EXPECTED  # it answered that stage: a replay


def test_a_gate_restarted_at_a_round_opens_its_stages_again_and_no_earlier_round() -> None:
    gate = StageGate(FEDERATION)
    gate.open(2, WIRE["STAGE_ADVERTISE_KEYS"])
    gate.open(2, WIRE["STAGE_MASKED_INPUT"])
    with pytest.raises(ValueError, match="only move forward"):
        gate.open(2, WIRE["STAGE_ADVERTISE_KEYS"])
    gate.restart_at(2)
    assert gate.open(2, WIRE["STAGE_ADVERTISE_KEYS"]) == make_binding(FEDERATION, 2, WIRE["STAGE_ADVERTISE_KEYS"])
    with pytest.raises(ValueError, match="only move forward"):
        gate.open(1, WIRE["STAGE_MASKED_INPUT"])
