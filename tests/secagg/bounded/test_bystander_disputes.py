"""A site that missed a bounded round does not apply one whose record names a liar: a dispute may have voided it.

A framed site's dispute is relayed to every accepted site at VERIFY, and a dispute that holds makes the round void
at each of them (FRAMED, every site stops). The tags are signed at DECIDE, before any dispute is relayed, so nothing
an accepted site signs names the disputes it was later sent: the kept tag set is the aggregator's to edit. The red
team (FINDINGS.md F1) kept the tag set without the dispute, and the bystander applied a total no honest site
applied; a record that names a liar is now not applied by a site that missed it (:class:`~fedfair.core.errors.VoidableRoundError`).
"""

from __future__ import annotations

import dataclasses

import pytest

from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.bystander import PastBoundedRound, check_past_total
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.messages import Commitments, Encoded, SeedReveal, ShareOpening
from fedfair.secagg.bounded.peers import BoundedSite
from fedfair.secagg.bounded.simulate import bounded_cast
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, BoundedStage
from fedfair.secagg.bounded.total import TagSet
from fedfair.secagg.bounded.verifier import Role
from fedfair.secagg.bounded.verifying import RoundVerifier
from fedfair.secagg.simulate import run_round
from fedfair.core.errors import VerificationError, VerifyReason, VoidableRoundError
from tests.secagg.bounded.roundkit import DIMENSION, FRACTIONAL_BITS, UPDATE_NORM
from tests.secagg.bounded.test_bystander import Kept
from tests.secagg.bounded.test_round import WEIGHTS, at_bound

FRAMED = 2
"""The honest site the aggregator frames."""


def framing_aggregator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aggregator's verifier message about FRAMED has its first output moved before it commits to it (as
    tests/runtime/forging_aggregator.py's ``frame``, in any round): the record names FRAMED, honest, a liar."""
    receive_seed = RoundVerifier.receive_seed

    def moved(verifier: RoundVerifier, peer: SeedReveal) -> Commitments:
        commitments = receive_seed(verifier, peer)
        if verifier.role is not Role.LEADER or FRAMED not in verifier.present:
            return commitments
        messages = verifier._messages
        assert messages is not None
        message = messages[FRAMED]
        outputs = message.share.outputs.copy()
        outputs[0] = (int(outputs[0]) + 1) % field.P
        message = dataclasses.replace(message, share=dataclasses.replace(message.share, outputs=outputs))
        messages[FRAMED] = message
        pending = verifier._verifier(FRAMED)._pending
        pending[FRAMED] = (pending[FRAMED][0], message)
        return Commitments(tuple((party, messages[party].commitment()) for party, _ in commitments.entries))

    monkeypatch.setattr(RoundVerifier, "receive_seed", moved)


def test_a_bystander_does_not_apply_a_round_whose_relayed_dispute_the_kept_tag_set_drops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    framing_aggregator(monkeypatch)
    cast = bounded_cast(
        dimension=DIMENSION, fractional_bits=FRACTIONAL_BITS, update_norm=UPDATE_NORM, weights=WEIGHTS, witnesses={}
    )
    inputs = {party: at_bound(party, weight) for party, weight in WEIGHTS.items()}
    kept = Kept()
    run_round(BOUNDED_ROUND, cast, inputs.__getitem__, kept, verified=True, refusals=(BoundedStage.DECIDE,))
    opening, record, sent = (
        kept.inputs[stage] for stage in (BoundedStage.SHARE, BoundedStage.DECIDE, BoundedStage.VERIFY)
    )
    assert isinstance(opening, ShareOpening) and isinstance(record, Encoded) and isinstance(sent, TagSet)
    framed = cast.parties[FRAMED]
    assert isinstance(framed, BoundedSite)
    dispute = framed.dispute()
    assert dispute is not None  # it was framed, and its own part shows it
    # What every accepted site is sent at VERIFY: the tags and the dispute that held (the aggregator relays it).
    relayed = dataclasses.replace(sent, disputes=(dispute,))
    honest = [peer for party, peer in cast.parties.items() if party not in (AUDITOR, FRAMED)]
    assert all(isinstance(site, BoundedSite) and FRAMED in site.framings(relayed) for site in honest)
    past = PastBoundedRound.parsed([opening.to_bytes(), record.data, relayed.to_bytes()])
    with pytest.raises(VerificationError) as caught:  # held: the kept round as the sites were sent it is void
        check_past_total(past, cast.server.parameters)
    assert caught.value.reason is VerifyReason.FRAMED
    # The same record and signed tags, the dispute left out of what the aggregator kept: not applied either.
    dropped = PastBoundedRound.parsed(
        [opening.to_bytes(), record.data, dataclasses.replace(relayed, disputes=()).to_bytes()]
    )
    with pytest.raises(VoidableRoundError) as voidable:
        check_past_total(dropped, cast.server.parameters)
    assert voidable.value.accepted == (0, 1, 3) and set(voidable.value.liars) == {FRAMED}
