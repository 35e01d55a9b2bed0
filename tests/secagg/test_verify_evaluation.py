"""Verified aggregation of an evaluation's sums: any change the aggregator makes to them is refused (issue 79)."""

from __future__ import annotations

import dataclasses
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import VerificationError, VerifyReason
from fedfair.fairness import sums
from fedfair.secagg import config as config_module
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.resum import resum_decides
from fedfair.secagg.verify_messages import AggregateClaim, TagSet
from tests.secagg.helpers import Harness
from tests.secagg.test_verify import reasons, tag_and_verify

PARTIES = 3


def evaluation_round(seed: int) -> tuple[Harness, AggregateClaim]:
    """An evaluation's secure sum through UNMASK and the claim: each site's answers on its held-out losses."""
    names = tuple(f"site-{party}" for party in range(1, PARTIES + 1))
    # Session 2 r + 1: the evaluation of round r (runtime.contract.session_round), its plan's length and encoding.
    config = SecAggConfig("test-federation", 3, names, sums.vector_length(), sums.ENCODING)
    harness = Harness(config, verified=True)
    rng = np.random.default_rng(seed)
    thresholds = sums.threshold_grid()
    for party in range(1, PARTIES + 1):
        losses, errors = rng.exponential(0.7, 200), (rng.random(200) < 0.2).astype(float)
        answer = sums.local_answers(losses, errors, thresholds)
        harness.inputs[party] = (answer, 1.0)
        harness.encoded[party] = config.encoder.encode(answer, 1.0, randomness_key=bytes([party]) * 32)
    everyone = list(range(1, PARTIES + 1))
    harness.unmask(harness.through_consistency(everyone, None), None)
    harness.server.finish()
    return harness, harness.server.claim()


def test_the_true_evaluation_sum_is_accepted_by_every_site() -> None:
    harness, claim = evaluation_round(0)
    expected = sum((harness.encoded[party] for party in range(1, PARTIES + 1)), np.zeros_like(claim.vector))
    np.testing.assert_array_equal(claim.vector, expected)
    assert reasons(tag_and_verify(harness, claim, (1, 2, 3))) == {"accepted"}


def refusals(harness: Harness, claim: AggregateClaim) -> set[object]:
    """Each site's verdict on ``claim``: a re-summing site refuses it before tagging, the others at VERIFY."""
    if not harness.server.config.resummed:
        return reasons(tag_and_verify(harness, claim, tuple(range(1, PARTIES + 1))))
    found: set[object] = set()
    for party in range(1, PARTIES + 1):
        try:
            harness.clients[party].tag(claim)
            found.add("accepted")
        except VerificationError as error:
            found.add(error.reason)
    return found


@pytest.mark.parametrize("resummed", [True, False], ids=["re-summed", "tags alone"])
@settings(max_examples=25, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_any_change_to_an_evaluation_sum_is_refused_by_every_site(
    resummed: bool, data: st.DataObject, seed: int
) -> None:
    """Property: a count, an offset sum, the error count or the weight word moved by any nonzero amount.

    Re-summed (an evaluation's sum is below RESUMMED_WORDS) a changed word is refused exactly; with the tags
    alone (as above RESUMMED_WORDS) one check misses a given change with probability at most 2^-126
    (docs/security.md): one miss is a bug.
    """
    with pytest.MonkeyPatch.context() as patch:
        if not resummed:
            patch.setattr(config_module, "RESUMMED_WORDS", 0)
        harness, claim = evaluation_round(seed)
        assert harness.server.config.resummed is resummed
        vector = claim.vector.copy()
        positions = data.draw(st.lists(st.integers(0, vector.size - 1), min_size=1, max_size=4, unique=True))
        for position in positions:
            change = data.draw(st.integers(1, 2**64 - 1))  # nonzero modulo 2^64: the word really changes
            vector[position] = (int(vector[position]) + change) % 2**64
        assert refusals(harness, dataclasses.replace(claim, vector=vector)) == {VerifyReason.FORGED}


def test_a_site_that_leaves_before_its_evaluation_tag_leaves_the_others_the_whole_sum() -> None:
    """An evaluation's sum is always re-summed (it is small), so a site silent at VERIFY costs nothing: the others
    accept the sum its answers are in (a changed sum is refused all the same, the property above)."""
    harness, claim = evaluation_round(1)
    assert resum_decides(harness.server.config)
    tags = tuple(harness.clients[party].tag(claim) for party in (1, 2))
    expected = sum((harness.encoded[party] for party in range(1, PARTIES + 1)), np.zeros_like(claim.vector))
    for party in (1, 2):
        np.testing.assert_array_equal(harness.clients[party].verify(TagSet(claim.header, tags)), expected)
