"""What the auditor computes from each stage's input, and what it refuses (no network: its process moves the bytes).

The round's parameters are the aggregator's driver's for the template federation under the two-verifier mode, with
the federation's real certificates (tests/runtime/test_bounded_round.py); the auditor's settings and identity are
its own, checked as its process checks them.
"""

from __future__ import annotations

import dataclasses

import pytest

from fedfair.core.errors import IdentityError, ProtocolError
from fedfair.runtime.auditor.config import check_auditor_identity
from fedfair.runtime.auditor.kinds.bounded import AuditorRounds
from tests.runtime.wire_stages import BOUNDED_TRAINING
from fedfair.runtime.plan import aggregator_plan as plan
from fedfair.runtime.transport import make_binding, pb
from fedfair.secagg.bounded.exchange import Reveal
from fedfair.secagg.bounded.messages import SignedRoundKey
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, BoundedStage
from tests.runtime.test_auditor_process import auditor_config
from tests.runtime.test_bounded_round import Federation, bounded, certificate  # noqa: F401 (the fixture)
from tests.runtime.test_input_bound import AUDITOR, federation  # noqa: F401 (the fixture)


def rounds_of(bounded: Federation) -> AuditorRounds:  # noqa: F811
    config = auditor_config(bounded.folder, "127.0.0.1:9")
    shared = plan.load_shared_settings(plan.shared_settings(bounded.loaded))
    return AuditorRounds(config, check_auditor_identity(config), shared)


def at(stage: BoundedStage, round_number: int = 1) -> pb.Binding:
    return make_binding("fedfair-demo", round_number, BOUNDED_TRAINING.wire(BOUNDED_ROUND.spec(stage)))


def test_its_round_key_is_signed_for_the_round_the_parameters_describe(bounded: Federation) -> None:  # noqa: F811
    rounds = rounds_of(bounded)
    parameters = bounded.parameters()
    upload = SignedRoundKey.from_bytes(rounds.step(at(BoundedStage.AUDITOR_KEY), parameters.to_bytes()))
    assert rounds.current is not None and rounds.current.number == 1
    # Signed with its certificate's key, over this round's session: what every site checks before it shares.
    own = rounds.identity.key.public_key()
    assert len(upload.checked(own, rounds.current.auditor.parameters.binding)) == 32
    # Its later stages' inputs are admitted up to the round's largest message, its first up to the parameters'.
    assert rounds.input_limit(at(BoundedStage.ROSTERS)) >= len(parameters.to_bytes())
    # Its runner keeps the round's order: a stage's input before the stages it follows is refused, naming both.
    with pytest.raises(
        ProtocolError, match=r"stage TOTAL \(BOUNDED_TOTAL\) is out of order: .* waiting for stage ROSTERS"
    ):
        rounds.step(at(BoundedStage.TOTAL), Reveal(()).to_bytes())
    rounds.leave(1)
    with pytest.raises(ProtocolError, match="round 1's auditor never made its round key"):
        rounds.step(at(BoundedStage.ROSTERS), b"")


def test_it_refuses_what_is_not_its_rounds_stage_or_parameters(bounded: Federation) -> None:  # noqa: F811
    rounds = rounds_of(bounded)
    parameters = bounded.parameters()
    with pytest.raises(ProtocolError, match="STAGE_BOUNDED_SHARE is not a stage the auditor uploads in"):
        rounds.step(at(BoundedStage.SHARE), parameters.to_bytes())
    with pytest.raises(ProtocolError, match="state round 1, 'train', 'bounded-v2'.* verifies round 2's"):
        rounds.step(at(BoundedStage.AUDITOR_KEY, 2), parameters.to_bytes())
    with pytest.raises(ProtocolError, match="never made its round key"):
        rounds.step(at(BoundedStage.MESSAGES), b"")
    # A certificate for the auditor's name that its manifest does not pin (a collaborator's here) is refused.
    identities = tuple(
        (name, certificate(bounded.folder, "hospital-a").hex() if name == AUDITOR else der)
        for name, der in parameters.identities
    )
    forged = dataclasses.replace(parameters, identities=identities)
    with pytest.raises(IdentityError, match="'audit-co'"):
        rounds.step(at(BoundedStage.AUDITOR_KEY), forged.to_bytes())
    # A collusion bound other than the plan's would move the floor on the sites a total covers (issue 93).
    raised = dataclasses.replace(parameters.security, max_colluding=parameters.security.max_colluding + 1)
    lowered = dataclasses.replace(parameters, security=raised)
    with pytest.raises(ProtocolError, match="max_colluding 1, the plan None and 0: the floor"):
        rounds.step(at(BoundedStage.AUDITOR_KEY), lowered.to_bytes())
    assert rounds.current is None
