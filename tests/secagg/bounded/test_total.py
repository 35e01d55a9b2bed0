"""VERIFY: every accepted site checks the bounded sum's total, and names why it refuses a false one."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import AuthenticationError, VerificationError, VerifyReason
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.exchange import AuditorTotal
from fedfair.secagg.bounded.record import VerdictRecord
from fedfair.secagg.bounded.simulate import BoundedTrace
from fedfair.secagg.bounded.total import SiteTags, TagSet
from tests.secagg.bounded.roundkit import DIMENSION, liar_witness, simulated
from tests.secagg.bounded.test_round import WEIGHTS, at_bound, liar_at

LIAR = 2


def bounded_round(**faults: object) -> tuple[BoundedTrace, dict[int, np.ndarray]]:
    """The round of WEIGHTS, site 2 lying at 2.5 times its bound, with a hostile aggregator's `faults`."""
    inputs = {party: at_bound(party, weight) for party, weight in WEIGHTS.items()}
    inputs[LIAR] = liar_at(LIAR, WEIGHTS[LIAR], 2.5)
    trace = simulated(inputs, WEIGHTS, witnesses={LIAR: liar_witness}, **faults)
    return trace, inputs


def refused_for(trace: BoundedTrace, reason: VerifyReason) -> None:
    """Every accepted site refused the total for `reason`, and none verified one."""
    assert not trace.totals and set(trace.refusals) == set(trace.result.accepted)
    for error in trace.refusals.values():
        assert isinstance(error, VerificationError) and error.reason is reason, error


def test_every_honest_site_verifies_the_exact_sum_and_the_liar_tags_nothing() -> None:
    trace, inputs = bounded_round()
    honest = (0, 1, 3)
    assert trace.result.accepted == honest and not trace.refusals and trace.withheld is None
    assert set(trace.totals) == set(honest)  # the liar is named at DECIDE and takes no part in VERIFY
    exact = sum(inputs[party] for party in honest)
    for total in trace.totals.values():
        np.testing.assert_array_equal(total, exact)
    np.testing.assert_array_equal(trace.result.total, exact)  # what the aggregator applies is what each verified


@settings(max_examples=10, deadline=None)
@given(
    coordinate=st.integers(0, DIMENSION - 1),
    shift=st.integers(1, field.P - 1),
    spread=st.booleans(),
)
def test_a_claimed_share_sum_moved_by_any_nonzero_vector_is_refused_by_every_site(
    coordinate: int, shift: int, spread: bool
) -> None:
    """Its tags would have to match under a challenge drawn after the claim: 1/p per row, so p^-2 to pass."""
    moved = np.zeros(DIMENSION, np.uint64)
    moved[coordinate] = shift
    if spread:  # a dense vector too, not only one coordinate
        moved = field.add(moved, field.random_elements(shift.to_bytes(8, "big"), b"test", DIMENSION))

    def forged(record: VerdictRecord) -> VerdictRecord:
        return dataclasses.replace(record, claimed=field.add(record.claimed, moved))

    trace, _ = bounded_round(forged_record=forged)
    refused_for(trace, VerifyReason.FORGED)
    assert all("do not add up to the aggregator's claimed share-sum" in str(e) for e in trace.refusals.values())


def test_an_auditor_total_swapped_or_moved_is_refused_by_every_site_at_the_record() -> None:
    def moved(record: VerdictRecord) -> VerdictRecord:
        shifted = field.add(record.auditor.total, np.ones(DIMENSION, np.uint64))
        return dataclasses.replace(record, auditor=dataclasses.replace(record.auditor, total=shifted))

    def other_sites(record: VerdictRecord) -> VerdictRecord:
        auditor = record.auditor
        return dataclasses.replace(record, auditor=AuditorTotal((0, 1), auditor.total, auditor.signature))

    for forgery, said in ((moved, "not signed by the auditor"), (other_sites, "not signed by the auditor")):
        trace, _ = bounded_round(forged_record=forgery)
        assert set(trace.refusals) == set(WEIGHTS) and not trace.totals  # the liar too: the record is false
        for error in trace.refusals.values():
            assert isinstance(error, AuthenticationError) and said in str(error)


def test_a_forged_tag_is_named_and_refused() -> None:
    def forged(tags: TagSet) -> TagSet:
        first = tags.tags[0]
        changed = SiteTags(first.party, ((first.tags[0] + 1) % field.P, first.tags[1]), first.signature)
        return TagSet((changed, *tags.tags[1:]))

    trace, _ = bounded_round(forged_tags=forged)
    refused_for(trace, VerifyReason.BAD_TAG)
    assert all("party 0's tags are not signed by it" in str(e) for e in trace.refusals.values())


def test_a_site_that_leaves_at_decide_voids_the_round_and_a_relayed_gap_is_named() -> None:
    """The aggregator withholds tags with a gap (the round is void, the leaver absent next round); relayed, a site
    cannot check the total and applies nothing."""
    trace, _ = bounded_round(silent_at_decide={3})
    assert trace.withheld is not None and "no tags of the bounded sum's total from party 3" in trace.withheld
    assert set(trace.refusals) == {0, 1} and not trace.totals  # the leaver is sent nothing more
    for error in trace.refusals.values():
        assert isinstance(error, VerificationError) and error.reason is VerifyReason.MISSING_TAG
        assert "party 3" in str(error)


def test_a_tag_set_naming_a_site_twice_is_malformed() -> None:
    trace, _ = bounded_round(forged_tags=lambda tags: TagSet((tags.tags[0], *tags.tags)))
    refused_for(trace, VerifyReason.MALFORMED)


def test_the_record_carries_the_claim_and_the_auditors_total_for_eight_bytes_a_coordinate_each() -> None:
    trace, _ = bounded_round()
    record = trace.record
    assert record.claimed.shape == (DIMENSION,) and record.auditor.accepted == record.accepted
    without = dataclasses.replace(
        record, claimed=np.zeros(0, np.uint64), auditor=AuditorTotal((), np.zeros(0, np.uint64), b"")
    )
    grown = len(record.to_bytes(trace.context)) - len(without.to_bytes(trace.context))
    extra = len(record.auditor.signature) + 4 * len(record.accepted) + 4 * 6  # its signature, ids, length prefixes
    assert 2 * 8 * DIMENSION <= grown <= 2 * 8 * DIMENSION + extra
