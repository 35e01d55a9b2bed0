"""VERIFY: every accepted site checks the bounded sum's total, and names why it refuses a false one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ProtocolError, VerificationError, VerifyReason
from fedfair.pki import identity
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.record import VerdictRecord
from fedfair.secagg.bounded.simulate import BoundedTrace
from fedfair.secagg.bounded.total import (
    SignedTags,
    TagSet,
    challenge,
    noise_commitment,
    record_digest,
    sign_tags,
    tags_of,
    verified_total,
)
from tests.secagg.bounded.roundkit import DIMENSION, liar_witness, new_round, simulated
from tests.secagg.bounded.test_round import WEIGHTS, at_bound, liar_at

LIAR = 2
HONEST = (0, 1, 3)


def bounded_round(**faults: object) -> tuple[BoundedTrace, dict[int, np.ndarray]]:
    """The round of WEIGHTS, site 2 lying at 2.5 times its bound, with a hostile aggregator's `faults`."""
    inputs = {party: at_bound(party, weight) for party, weight in WEIGHTS.items()}
    inputs[LIAR] = liar_at(LIAR, WEIGHTS[LIAR], 2.5)
    trace = simulated(inputs, WEIGHTS, witnesses={LIAR: liar_witness}, **faults)
    return trace, inputs


def refused_for(trace: BoundedTrace, reason: VerifyReason, said: str = "") -> None:
    """Every accepted site refused the total for `reason` (its message holding `said`), and none verified one."""
    assert not trace.totals and set(trace.refusals) - {AUDITOR} == set(trace.result.accepted)
    for party in trace.result.accepted:
        error = trace.refusals[party]
        assert isinstance(error, VerificationError) and error.reason is reason, error
        assert said in str(error), error


def test_every_honest_site_verifies_the_exact_sum_and_the_liar_tags_nothing() -> None:
    trace, inputs = bounded_round()
    assert trace.result.accepted == HONEST and not trace.refusals and trace.withheld is None
    assert set(trace.totals) == set(HONEST)  # the liar is named at DECIDE and takes no part in VERIFY
    exact = sum(inputs[party] for party in HONEST)
    for total in trace.totals.values():
        np.testing.assert_array_equal(total, exact)
    np.testing.assert_array_equal(trace.result.total, exact)  # what the aggregator applies is what each verified
    # A site's tags: its id (8 bytes), the row count (4), two elements (16), a signature (DER ECDSA P-256, at most
    # 72 bytes) with its 8-byte length; the tag set it downloads: the count (4), then the three sites' tags and the
    # auditor's, each with its 8-byte length, the aggregator's 32-byte noise key with its length, and the count of
    # disputes (4; none here).
    tags, key = 8 + 4 + 16 + 8, 8 + 32 + 4
    assert tags + 8 < trace.tag_bytes_up <= tags + 72
    assert 4 + 4 * (8 + tags + 8) + key < trace.tag_bytes_down <= 4 + 4 * (8 + tags + 72) + key


@settings(max_examples=10, deadline=None)
@given(
    coordinate=st.integers(0, DIMENSION - 1),
    shift=st.integers(1, field.P - 1),
    spread=st.booleans(),
)
def test_a_total_moved_by_any_nonzero_vector_is_refused_by_every_site(
    coordinate: int, shift: int, spread: bool
) -> None:
    """Its tags would have to match under a challenge drawn after the total: 1/p per row, so p^-2 to pass."""
    moved = np.zeros(DIMENSION, np.uint64)
    moved[coordinate] = shift
    if spread:  # a dense vector too, not only one coordinate
        moved = field.add(moved, field.random_elements(shift.to_bytes(8, "big"), b"test", DIMENSION))

    def forged(record: VerdictRecord) -> VerdictRecord:
        return dataclasses.replace(record, total=field.add(record.total, moved))

    trace, _ = bounded_round(forged_record=forged)
    assert AUDITOR not in trace.refusals  # the auditor tagged its own total under the forged record's challenge
    refused_for(trace, VerifyReason.FORGED, "do not add up to the record's total")


def without_auditor(tags: TagSet) -> TagSet:
    return TagSet(tuple(item for item in tags.tags if item.party != AUDITOR), tags.noise_key)


def test_a_missing_forged_or_doubled_auditor_tag_is_refused_and_named() -> None:
    def forged(tags: TagSet) -> TagSet:
        auditor = tags.tags[-1]
        changed = SignedTags(AUDITOR, ((auditor.tags[0] + 1) % field.P, auditor.tags[1]), auditor.signature)
        return TagSet((*tags.tags[:-1], changed), tags.noise_key)

    trace, _ = bounded_round(forged_tags=without_auditor)
    refused_for(trace, VerifyReason.MISSING_TAG, "no tags of the bounded sum's total from the auditor")
    trace, _ = bounded_round(forged_tags=forged)
    refused_for(trace, VerifyReason.BAD_TAG, "the auditor's tags are not signed by it")
    trace, _ = bounded_round(forged_tags=lambda tags: TagSet((*tags.tags, tags.tags[-1]), tags.noise_key))
    refused_for(trace, VerifyReason.MALFORMED, "names the auditor twice")


def test_the_auditor_withholds_its_tags_from_a_record_over_other_sites_so_no_site_applies_it() -> None:
    """A record that leaves an accepted site out (absent, with its evidence) checks at every site, but the auditor's
    total covers that site: a total without its share would pass with the auditor's tags, so it gives none."""

    def dropped(record: VerdictRecord) -> VerdictRecord:
        evidence = {party: item for party, item in record.evidence.items() if party != 3}
        return dataclasses.replace(record, accepted=(0, 1), evidence=evidence)

    trace, _ = bounded_round(forged_record=dropped)
    withheld = trace.refusals[AUDITOR]
    assert isinstance(withheld, ProtocolError) and "but the auditor's total covers [0, 1, 3]" in str(withheld)
    assert all(findings.accepted == (0, 1) for findings in trace.findings.values())  # the record itself checks
    assert not trace.totals and set(trace.refusals) == {0, 1, AUDITOR}
    for party in (0, 1):
        error = trace.refusals[party]
        assert isinstance(error, VerificationError) and error.reason is VerifyReason.MISSING_TAG


def test_an_auditor_tag_over_another_record_is_refused() -> None:
    """Tags are bound to the record's digest, which fixes its accepted set: the auditor's tags over a record with
    other sites do not check this one's (BAD_TAG), even where they are the auditor's and of the right total."""
    game = new_round({0: 1.0, 1: 1.0})
    shares = {party: field.random_elements(bytes([party]), b"share", DIMENSION) for party in (0, 1)}
    auditor_total = field.random_elements(b"a", b"auditor", DIMENSION)
    total = field.add(field.add(shares[0], shares[1]), auditor_total)
    digest, other = record_digest(b"this record, accepting 0 and 1"), record_digest(b"a record accepting 0 alone")
    site_tags = [sign_tags(game.context, digest, party, shares[party], game.site_keys[party]) for party in (0, 1)]
    keys = {party: key.public_key() for party, key in game.site_keys.items()}

    def check(auditor: SignedTags) -> np.ndarray:
        noise_key = bytes(32)  # no noise in this round: the key draws zeros, and is the committed one
        committed = noise_commitment(game.context, noise_key)
        return verified_total(
            game.context, digest, (0, 1), total, committed, TagSet((*site_tags, auditor), noise_key), keys
        )

    np.testing.assert_array_equal(
        check(sign_tags(game.context, digest, AUDITOR, auditor_total, game.auditor_key)), field.to_signed(total)
    )
    try:
        check(sign_tags(game.context, other, AUDITOR, auditor_total, game.auditor_key))
    except VerificationError as error:
        assert error.reason is VerifyReason.BAD_TAG and "the auditor's tags are not signed by it" in str(error)
    else:
        raise AssertionError("the auditor's tags over another record passed")


def colluding(party: int, shift: np.ndarray) -> Callable[[BoundedContext, bytes, SignedTags, Any], SignedTags]:
    """A site that, once it saw the record, signs tags of its share plus `shift` (field elements)."""

    def tags(context: BoundedContext, digest: bytes, honest: SignedTags, key: ec.EllipticCurvePrivateKey) -> SignedTags:
        if honest.party != party:
            return honest
        extra = tags_of(challenge(digest, shift.size), shift)
        moved = SignedTags(party, tuple((t + e) % field.P for t, e in zip(honest.tags, extra, strict=True)), b"")
        return SignedTags(party, moved.tags, identity.sign(key, moved.signed_bytes(context, digest)))

    return tags


def test_a_colluding_site_can_move_the_total_as_the_doc_states() -> None:
    """The limit docs/security.md states ("Not against a colluding site"): a site that colludes with the aggregator
    signs <r_k, a_c + E> after the record fixed r, and T + E then passes every honest site's tag check. What still
    holds is the model chain's bound (tests/runtime/test_bounded_round.py)."""
    shift = np.zeros(DIMENSION, np.int64)
    shift[0] = 12345
    moved = field.from_signed(shift)

    def forged(record: VerdictRecord) -> VerdictRecord:
        return dataclasses.replace(record, total=field.add(record.total, moved))

    trace, inputs = bounded_round(forged_record=forged, colluder_tags=colluding(0, moved))
    assert not trace.refusals and set(trace.totals) == set(HONEST)
    for total in trace.totals.values():
        np.testing.assert_array_equal(total, sum(inputs[party] for party in HONEST) + shift)


def test_a_site_that_leaves_at_decide_voids_the_round_and_a_relayed_gap_is_named() -> None:
    """The aggregator withholds tags with a gap (the round is void, the leaver absent next round); relayed, a site
    cannot check the total and applies nothing."""
    trace, _ = bounded_round(silent_at_decide={3})
    assert trace.withheld is not None and "no tags of the bounded sum's total from party 3" in trace.withheld
    assert set(trace.refusals) == {0, 1} and not trace.totals  # the leaver is sent nothing more
    for error in trace.refusals.values():
        assert isinstance(error, VerificationError) and error.reason is VerifyReason.MISSING_TAG
        assert "party 3" in str(error)


def test_tags_that_do_not_add_up_are_withheld_by_an_honest_aggregator() -> None:
    trace, _ = bounded_round(colluder_tags=colluding(0, np.ones(DIMENSION, np.uint64)))
    assert trace.withheld is not None and "do not add up to this aggregator's total" in trace.withheld


def test_a_tag_set_naming_a_site_twice_is_malformed() -> None:
    trace, _ = bounded_round(forged_tags=lambda tags: TagSet((tags.tags[0], *tags.tags), tags.noise_key))
    refused_for(trace, VerifyReason.MALFORMED, "names party 0 twice")


def test_the_record_carries_the_total_once_for_52_bits_a_coordinate() -> None:
    trace, _ = bounded_round()
    record = trace.record
    assert record.total.shape == (DIMENSION,)
    without = dataclasses.replace(record, total=np.zeros(0, np.uint64))
    assert len(record.to_bytes(trace.context)) - len(without.to_bytes(trace.context)) == -(-52 * DIMENSION // 8)
