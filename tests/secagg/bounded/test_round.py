"""A whole bounded secure sum in process: liars excluded and named, honest sums exact, dropouts absent, DP."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import AuthenticationError, VerificationError, VerifyReason
from fedfair.secagg import keys
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.layout import squared_bound
from fedfair.secagg.bounded.messages import SignedRoundKey, round_binding
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.peers import BoundedSite
from fedfair.secagg.bounded.shares import encode_within_bound
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, BoundedStage
from tests.secagg.bounded.roundkit import (
    simulated,
    DIMENSION,
    FRACTIONAL_BITS,
    UPDATE_NORM,
    bounded_parameters,
    liar_witness,
    vector_at,
)

WEIGHTS = {0: 1.0, 1: 0.5, 2: 0.8, 3: 0.3}


def at_bound(party: int, weight: float, dimension: int = DIMENSION, seed: int = 0) -> np.ndarray:
    """An honest site's encoded update at exactly its bound (the encoder keeps it within)."""
    bound_sq = squared_bound(UPDATE_NORM, weight, FRACTIONAL_BITS)
    vector = vector_at(UPDATE_NORM * weight, dimension, 1000 * seed + party)
    return encode_within_bound(vector, bound_sq, FRACTIONAL_BITS, bytes([party]) * 32)


def liar_at(party: int, weight: float, factor: float) -> np.ndarray:
    """A liar's encoded update ``factor`` times its bound (not clipped)."""
    bound = math.sqrt(squared_bound(UPDATE_NORM, weight, FRACTIONAL_BITS))
    return np.round(vector_at(factor * bound, DIMENSION, 77 + party)).astype(np.int64)


@pytest.mark.parametrize("factor", [1.01, 2.5, 3.5])
def test_a_liar_is_excluded_and_named_at_its_first_round_and_the_others_sum_is_exact(factor: float) -> None:
    liar = 2
    inputs = {party: at_bound(party, weight) for party, weight in WEIGHTS.items()}
    inputs[liar] = liar_at(liar, WEIGHTS[liar], factor)
    assert sum(int(v) ** 2 for v in inputs[liar]) > squared_bound(UPDATE_NORM, WEIGHTS[liar], FRACTIONAL_BITS)
    trace = simulated(inputs, WEIGHTS, witnesses={liar: liar_witness})
    honest = (0, 1, 3)
    assert trace.result.accepted == honest and set(trace.result.excluded) == {liar} and trace.result.absent == ()
    assert any(reason.startswith("norm") for reason in trace.result.excluded[liar])
    assert trace.culprits == {liar: "; ".join(trace.result.excluded[liar])}  # the server names it, as SecureSum
    np.testing.assert_array_equal(trace.result.total, sum(inputs[party] for party in honest))
    for findings in trace.findings.values():  # every site checked the evidence and names the liar
        assert findings.accepted == honest and findings.liars == trace.result.excluded
    assert set(trace.record.evidence) == set(WEIGHTS)


@settings(max_examples=20, deadline=None)
@given(
    weights=st.lists(st.floats(0.05, 1.0), min_size=2, max_size=4),  # 2: the least floor (issue 93)
    dimension=st.integers(1, 120),
    seed=st.integers(0, 2**16),
)
def test_honest_sites_at_exactly_their_bounds_are_never_excluded(
    weights: list[float], dimension: int, seed: int
) -> None:
    plan = dict(enumerate(weights))
    inputs = {party: at_bound(party, weight, dimension, seed) for party, weight in plan.items()}
    trace = simulated(inputs, plan)
    assert trace.result.accepted == tuple(plan) and not trace.result.excluded, trace.result.excluded
    np.testing.assert_array_equal(trace.result.total, sum(inputs.values()))
    # and each verifies the total it is in (VERIFY: tests/secagg/bounded/test_total.py)
    assert set(trace.totals) == set(plan) and not trace.refusals
    for total in trace.totals.values():
        np.testing.assert_array_equal(total, sum(inputs.values()))


def test_a_site_whose_part_did_not_arrive_is_absent_not_named() -> None:
    inputs = {party: at_bound(party, weight) for party, weight in WEIGHTS.items()}
    trace = simulated(inputs, WEIGHTS, missing_auditor_part={1}, missing_aggregator_part={3})
    assert trace.result.accepted == (0, 2) and trace.result.absent == (1, 3) and not trace.result.excluded
    assert set(trace.record.evidence) == {0, 2}
    assert all(not findings.liars for findings in trace.findings.values())
    np.testing.assert_array_equal(trace.result.total, inputs[0] + inputs[2])


def test_an_aggregator_that_keeps_one_share_gets_no_total_the_auditor_refuses_naming_the_round() -> None:
    """Issue 93: a total over fewer inputs than the plan's threshold (2 here) shows its reader one site's input; the
    auditor signs no such total, so the aggregator, holding only its own uniform share-sum, learns nothing."""
    inputs = {party: at_bound(party, weight) for party, weight in WEIGHTS.items()}
    with pytest.raises(
        VerificationError, match=r"covers 1 accepted input\(s\) \(0\), fewer than the plan's threshold of 2"
    ) as caught:
        simulated(inputs, WEIGHTS, missing_aggregator_part={1, 2, 3})
    assert caught.value.reason is VerifyReason.BELOW_FLOOR and caught.value.round == 1
    assert "the auditor signs no total of them" in str(caught.value)
    # At the floor (2 of 4 sites) the total is formed and exact.
    trace = simulated(inputs, WEIGHTS, missing_aggregator_part={1, 3}, floor=2)
    assert trace.result.accepted == (0, 2)
    with pytest.raises(VerificationError, match="fewer than the plan's threshold of 3"):
        simulated(inputs, WEIGHTS, missing_aggregator_part={1, 3}, floor=3)


def test_a_total_below_the_floor_that_the_verifiers_formed_anyway_is_refused_by_every_site_it_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With both verifiers' floors removed (a colluding pair), each site's own check of the record still refuses it:
    it tags nothing, verifies nothing and applies nothing."""
    check_floor = BoundedContext.check_floor

    def sites_only(context: BoundedContext, accepted: tuple[int, ...], who: str) -> None:
        if "site" in who:
            check_floor(context, accepted, who)

    monkeypatch.setattr(BoundedContext, "check_floor", sites_only)
    inputs = {party: at_bound(party, weight) for party, weight in WEIGHTS.items()}
    trace = simulated(inputs, WEIGHTS, missing_aggregator_part={1, 2, 3})
    assert trace.result.accepted == (0,) and set(trace.refusals) == {0} and not trace.totals
    refusal = trace.refusals[0]
    assert isinstance(refusal, VerificationError) and refusal.reason is VerifyReason.BELOW_FLOOR
    assert "this site tags no total of them and applies nothing" in str(refusal)


def test_each_verifier_adds_its_own_noise_outside_the_bound() -> None:
    """The sum carries each verifier's Skellam(mu): mean 0, variance 2 x 2 mu per coordinate; the bound is unchanged.

    The sample variance of d = 4000 coordinates is within 6 sigma of 4 mu, sigma = 4 mu sqrt(2 / d) (plus Skellam's
    small excess kurtosis at this mu, 1 / (4 mu)): about 0.13 relative, so noise at one verifier only (2 mu) would
    fail it. The sample mean is within 6 sqrt(4 mu / d). What each verifier alone is left with: test_views.py.
    """
    mu, dimension = 50.0, 4000
    weights = {0: 1.0, 1: 0.5}
    inputs = {party: at_bound(party, weight, dimension) for party, weight in weights.items()}
    trace = simulated(inputs, weights, noise_mu=mu)
    assert trace.result.accepted == (0, 1)  # sites at exactly their bound: the noise is not theirs to prove
    assert trace.context.bounds == {p: squared_bound(UPDATE_NORM, w, FRACTIONAL_BITS) for p, w in weights.items()}
    noise = (trace.result.total - inputs[0] - inputs[1]).astype(np.float64)
    variance = 2 * 2 * mu
    assert abs(noise.mean()) < 6 * math.sqrt(variance / dimension)
    assert abs(noise.var() / variance - 1) < 6 * math.sqrt((2 + 1 / (4 * mu)) / dimension)
    for total in trace.totals.values():  # every site verified the noised total the aggregator applies
        np.testing.assert_array_equal(total, trace.result.total)


def test_the_verifiers_noise_follows_their_keys_so_a_round_run_again_carries_the_same() -> None:
    """Totals of the same inputs with the same two noise keys are equal (nothing to average); another key of either
    verifier draws other noise."""
    weights, dimension = {0: 1.0, 1: 0.5}, 500
    inputs = {party: at_bound(party, weight, dimension) for party, weight in weights.items()}

    def total(auditor: bytes, aggregator: bytes) -> np.ndarray:
        trace = simulated(inputs, weights, noise_mu=50.0, noise_key=auditor, aggregator_noise_key=aggregator)
        return trace.result.total

    first, again = total(b"k" * 32, b"a" * 32), total(b"k" * 32, b"a" * 32)
    np.testing.assert_array_equal(first, again)
    assert np.any(total(b"o" * 32, b"a" * 32) != first) and np.any(total(b"k" * 32, b"o" * 32) != first)


def test_the_declaration_runs_every_stage_once_in_order_and_the_sites_last_verdict_ends_it() -> None:
    stages = [spec.stage for spec in BOUNDED_ROUND.stages(True)]
    assert stages == list(BoundedStage)
    assert len({spec.wire for spec in BOUNDED_ROUND.stages(True)}) == len(BoundedStage)
    decide = BOUNDED_ROUND.sum_stages[-1]
    assert decide.stage is BoundedStage.DECIDE and decide.upload is not None and decide.close is None
    (verify,) = BOUNDED_ROUND.verify_stages
    assert verify.stage is BoundedStage.VERIFY and verify.upload is None and verify.close is None


def test_a_round_key_not_signed_by_the_auditor_is_refused_by_every_site() -> None:
    """A key swapped in by the aggregator would let it open every seed: the sites check the auditor's signature."""
    parameters, private, aggregator_key = bounded_parameters((0,))
    auditor_key = private[AUDITOR]
    site = BoundedSite(parameters, 0, private[0])
    swapped = SignedRoundKey.sign(aggregator_key, parameters.binding, keys.public_bytes(keys.generate_key_pair()))
    with pytest.raises(AuthenticationError, match="not signed by the auditor"):
        site.share(swapped, at_bound(0, 1.0))
    other_round = round_binding("f", 2, b"s" * 16)
    replayed = SignedRoundKey.sign(auditor_key, other_round, keys.public_bytes(keys.generate_key_pair()))
    with pytest.raises(AuthenticationError, match="not signed by the auditor"):
        site.share(replayed, at_bound(0, 1.0))
