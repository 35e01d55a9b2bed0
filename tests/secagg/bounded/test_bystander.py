"""A site that missed a bounded round checks it from what the accepted sites were sent (issue 98), as one of them.

An honest round's total is the one every accepted site verified, and a liar is named as every site named it (that
round is not applied: a dispute may have voided it); a tag set short of one accepted site's or the
auditor's signed tags, a tag not signed by its maker, a total moved in a re-signed record, and a round key the
auditor did not sign are each refused, with the reason an accepted site would give.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from fedfair.core.errors import VerificationError, VerifyReason, VoidableRoundError
from fedfair.pki.identity import generate_identity_key, sign
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.bystander import PastBoundedRound, check_past_total
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.messages import Encoded, ShareOpening, SignedRoundKey
from fedfair.secagg.bounded.record import VerdictRecord, sign_record
from fedfair.secagg.bounded.simulate import bounded_cast
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, BoundedStage
from fedfair.secagg.bounded.total import TagSet, record_digest
from fedfair.secagg.round import AnyStage, Opening
from fedfair.secagg.simulate import Cast, Faults, RoundTrace, run_round
from tests.secagg.bounded.roundkit import DIMENSION, FRACTIONAL_BITS, UPDATE_NORM, liar_witness
from tests.secagg.bounded.test_round import WEIGHTS, at_bound, liar_at


class Kept(Faults):
    """An honest aggregator that keeps what every site was sent alike, as the runtime's past rounds keep it."""

    def __init__(self) -> None:
        self.inputs: dict[BoundedStage, Any] = {}

    def opening(self, spec: AnyStage, opening: Opening, server: Any) -> Opening:
        if spec.stage in (BoundedStage.SHARE, BoundedStage.DECIDE, BoundedStage.VERIFY):
            self.inputs[spec.stage] = opening.inputs
        return opening


def kept_round(liar: int | None = None) -> tuple[Cast, RoundTrace, PastBoundedRound]:
    """A round of WEIGHTS' sites at their bounds (`liar` at 2.5 times its own), and what it kept for a site that
    missed it."""
    witnesses = {} if liar is None else {liar: liar_witness}
    cast = bounded_cast(
        dimension=DIMENSION,
        fractional_bits=FRACTIONAL_BITS,
        update_norm=UPDATE_NORM,
        weights=WEIGHTS,
        witnesses=witnesses,
    )
    inputs = {party: at_bound(party, weight) for party, weight in WEIGHTS.items()}
    if liar is not None:
        inputs[liar] = liar_at(liar, WEIGHTS[liar], 2.5)
    kept = Kept()
    # The liar's refusal at DECIDE (the record leaves it out) is kept, as simulate_bounded_round keeps it.
    trace = run_round(BOUNDED_ROUND, cast, inputs.__getitem__, kept, verified=True, refusals=(BoundedStage.DECIDE,))
    opening, record, tag_set = (
        kept.inputs[stage] for stage in (BoundedStage.SHARE, BoundedStage.DECIDE, BoundedStage.VERIFY)
    )
    assert isinstance(opening, ShareOpening) and isinstance(record, Encoded) and isinstance(tag_set, TagSet)
    past = PastBoundedRound.parsed([opening.to_bytes(), record.data, tag_set.to_bytes()])  # as the files hold them
    return cast, trace, past


def refused(past: PastBoundedRound, cast: Cast) -> VerificationError:
    with pytest.raises(VerificationError) as caught:
        check_past_total(past, cast.server.parameters)
    return caught.value


def test_a_bystander_verifies_the_total_every_accepted_site_verified() -> None:
    cast, trace, past = kept_round()
    checked = check_past_total(past, cast.server.parameters)
    assert checked.findings.accepted == tuple(sorted(WEIGHTS)) and checked.findings.liars == {}
    assert set(trace.verdicts) == set(WEIGHTS)
    for total in trace.verdicts.values():
        np.testing.assert_array_equal(checked.total, total)


def test_a_bystander_names_the_liar_every_site_named_and_does_not_apply_the_round() -> None:
    cast, trace, past = kept_round(liar=2)
    with pytest.raises(VoidableRoundError) as caught:  # a dispute, which no tag covers, may have voided it
        check_past_total(past, cast.server.parameters)
    assert caught.value.accepted == (0, 1, 3) and set(caught.value.liars) == {2}
    sites = [peer for party, peer in cast.parties.items() if party != AUDITOR]  # each site's own check of the record
    assert all(tuple(sorted(site.findings.liars)) == caught.value.liars for site in sites)
    assert set(trace.verdicts) == {0, 1, 3}


@pytest.mark.parametrize("short_of", [0, AUDITOR])
def test_a_tag_set_short_of_one_signer_is_refused(short_of: int) -> None:
    cast, _, past = kept_round()
    tags = tuple(item for item in past.tag_set.tags if item.party != short_of)
    error = refused(dataclasses.replace(past, tag_set=dataclasses.replace(past.tag_set, tags=tags)), cast)
    assert error.reason is VerifyReason.MISSING_TAG, error
    assert ("the auditor" if short_of == AUDITOR else f"party {short_of}") in str(error), error


def test_a_tag_not_signed_by_its_maker_is_refused() -> None:
    cast, _, past = kept_round()
    first, *rest = past.tag_set.tags
    moved = (first.tags[0] + 1) % field.P, *first.tags[1:]
    # Moved and signed again, by a key that is not the site's (the aggregator's, say): it does not pass as the site's.
    unsigned = dataclasses.replace(first, tags=moved, signature=b"")
    forger = generate_identity_key()
    forged = dataclasses.replace(
        unsigned, signature=sign(forger, unsigned.signed_bytes(_context(past, cast), _digest(past, cast)))
    )
    error = refused(dataclasses.replace(past, tag_set=dataclasses.replace(past.tag_set, tags=(forged, *rest))), cast)
    assert error.reason is VerifyReason.BAD_TAG and f"party {first.party}'s tags" in str(error), error


def test_a_total_moved_in_a_record_the_aggregator_signs_again_is_refused() -> None:
    cast, _, past = kept_round()
    context = _context(past, cast)
    moved = past.record.total.copy()
    moved[0] = (int(moved[0]) + 1) % field.P
    assert cast.server_identity is not None
    record = sign_record(context, cast.server_identity, dataclasses.replace(past.record, total=moved))
    error = refused(dataclasses.replace(past, record=VerdictRecord.from_bytes(record.to_bytes(context))), cast)
    # The sites' tags are bound to the record they tagged: over this one they are not signed.
    assert error.reason is VerifyReason.BAD_TAG, error


def test_a_round_key_the_auditor_did_not_sign_is_refused() -> None:
    cast, _, past = kept_round()
    key = past.opening.round_key
    forged = SignedRoundKey(
        key.cipher_key, sign(generate_identity_key(), cast.server.parameters.binding + key.cipher_key)
    )
    error = refused(dataclasses.replace(past, opening=ShareOpening(past.opening.public, forged)), cast)
    assert error.reason is VerifyReason.FORGED and "round key" in str(error), error


def _context(past: PastBoundedRound, cast: Cast) -> Any:
    parameters = cast.server.parameters
    return parameters.context(past.opening.round_key.checked(parameters.auditor_key, parameters.binding))


def _digest(past: PastBoundedRound, cast: Cast) -> bytes:
    return record_digest(past.record.to_bytes(_context(past, cast)))
