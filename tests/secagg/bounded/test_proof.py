"""The two-verifier proof: completeness at the bound, soundness against liars, what one share shows, the sum."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.secagg.bounded import field, flp
from fedfair.secagg.bounded.layout import QUERIES, Layout, squared_bound
from fedfair.secagg.bounded.shares import (
    HelperShare,
    LeaderShare,
    Parts,
    encode_within_bound,
    honest_witness,
    make_report,
)
from fedfair.secagg.bounded.verifier import Role, Verdict, Verifier, combine_totals
from tests.secagg.bounded.roundkit import liar_witness, vector_at

QUERY_SEED = b"q" * 32


def verify(layout: Layout, leader_share: LeaderShare, helper_share: HelperShare) -> Verdict:
    """Both verifiers receive, exchange and decide; they must agree."""
    leader, helper = Verifier(layout, Role.LEADER, QUERY_SEED), Verifier(layout, Role.HELPER, QUERY_SEED)
    from_leader, from_helper = leader.receive(0, leader_share), helper.receive(0, helper_share)
    leader.commit(0, from_helper.commitment())
    helper.commit(0, from_leader.commitment())
    verdict = leader.conclude(0, from_helper)
    assert helper.conclude(0, from_leader) == verdict
    return verdict


@settings(max_examples=40)
@given(
    dimension=st.integers(1, 400),
    update_norm=st.floats(0.01, 10.0),
    weight=st.floats(0.05, 1.0),
    fractional_bits=st.integers(4, 16),
    seed=st.integers(0, 2**32 - 1),
)
def test_an_honest_input_at_exactly_its_bound_is_accepted(
    dimension: int, update_norm: float, weight: float, fractional_bits: int, seed: int
) -> None:
    bound_sq = squared_bound(update_norm, weight, fractional_bits)
    assume(bound_sq >= 1)  # a bound below one unit of the encoding is refused (tested in test_layout)
    layout = Layout(dimension, bound_sq)
    encoded = encode_within_bound(
        vector_at(update_norm * weight, dimension, seed), bound_sq, fractional_bits, seed.to_bytes(32, "little")
    )
    assert sum(int(v) ** 2 for v in encoded) <= bound_sq
    verdict = verify(layout, *make_report(layout, field.from_signed(encoded)))
    assert verdict.accepted, verdict.reasons


def test_encoding_at_the_bound_keeps_all_but_rounding() -> None:
    bound_sq = squared_bound(1.0, 0.5, 12)
    vector = vector_at(0.5, 1000, 3)
    encoded = encode_within_bound(vector, bound_sq, 12, b"r" * 32)
    assert sum(int(v) ** 2 for v in encoded) <= bound_sq
    assert np.max(np.abs(encoded - vector * 2**12)) < 1  # each coordinate one of its two neighbours
    with pytest.raises(ConfigError, match="exceeds the bound"):
        encode_within_bound(vector * 1.01, bound_sq, 12, b"r" * 32)


@pytest.mark.parametrize("factor", [1.01, 2.5, 3.5])
def test_an_input_over_its_bound_is_rejected_on_its_norm(factor: float) -> None:
    bound_sq = squared_bound(1.0, 1.0, 12)
    layout = Layout(500, bound_sq)
    x = np.round(vector_at(factor * 2**12, 500, 4)).astype(np.int64)
    with pytest.raises(ConfigError, match="exceeds its bound"):
        make_report(layout, field.from_signed(x))  # an honest client refuses to prove it
    verdict = verify(layout, *make_report(layout, field.from_signed(x), witness=liar_witness))
    assert not verdict.accepted
    assert verdict.reasons == ("norm: ||x||^2 plus the claimed slack is not B^2",)


def test_a_slack_claimed_with_a_bit_that_is_not_a_bit_is_rejected() -> None:
    layout = Layout(300, squared_bound(1.0, 1.0, 10))
    x = np.round(vector_at(2.5 * 2**10, 300, 5)).astype(np.int64)

    def field_slack(layout: Layout, x: np.ndarray, projections: np.ndarray) -> np.ndarray:
        bits = liar_witness(layout, x, projections)
        bits[: layout.norm_bits] = 0
        bits[0] = (layout.bound_sq - sum(int(v) ** 2 for v in x)) % field.P  # the norm equation holds
        return bits

    verdict = verify(layout, *make_report(layout, field.from_signed(x), witness=field_slack))
    assert verdict.reasons == ("bits: a witness bit is not 0 or 1",)


def test_a_vector_whose_square_wraps_to_a_small_residue_fails_its_range_tests() -> None:
    layout = Layout(200, squared_bound(1.0, 1.0, 10))
    residue = next(t for t in range(2, 1000) if pow(t, (field.P - 1) // 2, field.P) == 1)
    root = square_root(residue)
    assert root * root % field.P == residue and min(root, field.P - root) > 2 * layout.test_offset
    inputs = np.zeros(200, dtype=np.uint64)
    inputs[7] = root  # ||x||^2 = residue <= B^2 in the field: only the tests can see it is not small

    def field_norm(layout: Layout, x: np.ndarray, projections: np.ndarray) -> np.ndarray:
        values = [layout.bound_sq - residue, *(int(v) + layout.test_offset for v in projections)]
        widths = [layout.norm_bits] + [layout.test_bits] * layout.tests
        return np.array([(v >> b) & 1 for v, w in zip(values, widths) for b in range(w)], np.uint64)

    verdict = verify(layout, *make_report(layout, inputs, witness=field_norm))
    assert len(verdict.reasons) == 1 and verdict.reasons[0].startswith("range: ")


def test_a_proof_that_understates_the_norm_fails_the_gadget_identity() -> None:
    layout = Layout(400, squared_bound(1.0, 1.0, 10))
    x = np.round(vector_at(2.5 * 2**10, 400, 6)).astype(np.int64)
    excess = sum(int(v) ** 2 for v in x) - layout.bound_sq

    def zero_slack(layout: Layout, x: np.ndarray, projections: np.ndarray) -> np.ndarray:
        bits = liar_witness(layout, x, projections)
        bits[: layout.norm_bits] = 0
        return bits

    leader, helper = make_report(layout, field.from_signed(x), witness=zero_slack)
    values = leader.values.copy()
    first_call = QUERIES  # p at the first call's point, which the norm equation sums
    values[first_call] = (int(values[first_call]) - excess) % field.P
    verdict = verify(layout, dataclasses.replace(leader, values=values), helper)
    assert verdict.reasons and all(reason.startswith("gadget") for reason in verdict.reasons)


@pytest.mark.parametrize("where", ["input", "proof seed", "proof value", "blind", "claimed parts"])
def test_a_tampered_share_is_rejected(where: str) -> None:
    layout = Layout(100, squared_bound(1.0, 1.0, 10))
    x = np.round(vector_at(2**10, 100, 7) * 0.9).astype(np.int64)
    leader, helper = make_report(layout, field.from_signed(x))
    inputs, values = leader.inputs.copy(), leader.values.copy()
    wire_seed, blind, parts = leader.wire_seed, leader.blind, leader.peer_parts
    if where == "input":
        inputs[3] = (int(inputs[3]) + 1) % field.P
    elif where == "proof seed":
        wire_seed = bytes([wire_seed[0] ^ 1]) + wire_seed[1:]
    elif where == "proof value":
        values[-1] = (int(values[-1]) + 1) % field.P
    elif where == "blind":
        blind = bytes(32)
    else:
        parts = Parts(parts.tests, bytes(32))
    assert not verify(layout, LeaderShare(inputs, wire_seed, values, blind, parts), helper).accepted


def test_one_share_alone_is_uniform_whatever_the_input() -> None:
    layout = Layout(20_000, squared_bound(1.0, 1.0, 12))
    # 20,000 uniform draws in [0, 1): their mean is within 6 sigma = 6 / sqrt(12 * 20,000) = 0.0123 of 1/2.
    for x in (np.zeros(20_000, dtype=np.int64), np.round(vector_at(0.99 * 2**12, 20_000, 8)).astype(np.int64)):
        leader, _ = make_report(layout, field.from_signed(x))
        share = leader.inputs[: layout.dimension].astype(np.float64) / field.P
        assert abs(share.mean() - 0.5) < 0.0123
        assert abs(np.mean(share < 0.25) - 0.25) < 6 * math.sqrt(0.25 * 0.75 / 20_000)
    first, _ = make_report(layout, field.from_signed(x))
    second, _ = make_report(layout, field.from_signed(x))
    assert not np.array_equal(first.inputs, second.inputs)  # fresh shares each time: no share pins x


def test_the_sum_of_accepted_shares_is_the_sum_of_accepted_inputs_exactly() -> None:
    layout = Layout(300, squared_bound(1.0, 1.0, 10))
    leader, helper = Verifier(layout, Role.LEADER, QUERY_SEED), Verifier(layout, Role.HELPER, QUERY_SEED)
    inputs = {party: np.round(vector_at(2**10 * 0.99, 300, party)).astype(np.int64) for party in range(4)}
    inputs[4] = np.round(vector_at(2**10 * 2.5, 300, 4)).astype(np.int64)  # a liar
    messages = {}
    for party, x in inputs.items():
        witness = liar_witness if party == 4 else honest_witness
        leader_share, helper_share = make_report(layout, field.from_signed(x), witness=witness)
        messages[party] = (leader.receive(party, leader_share), helper.receive(party, helper_share))
    for party, (from_leader, from_helper) in messages.items():
        leader.commit(party, from_helper.commitment())
        helper.commit(party, from_leader.commitment())
    for party, (from_leader, from_helper) in messages.items():
        assert leader.conclude(party, from_helper) == helper.conclude(party, from_leader)
    assert [party for party, verdict in leader.verdicts.items() if not verdict.accepted] == [4]
    expected = sum(inputs[party] for party in range(4))
    assert np.array_equal(combine_totals(leader.total(), helper.total()), expected)


def test_the_wire_values_at_the_query_points_are_masked_jointly() -> None:
    """Each wire's values at both query points are uniform together: no combination of them is fixed by x.

    With one seed per wire, L_0(r2) f(r1) - L_0(r1) f(r2) would cancel the seed and leave a function of x
    that two reports of the same x share; with a seed per query point it differs (but w.p. 1/p).
    """
    # d large enough that one call's c products outnumber the witness bits (at N = 256, c is about d / 254)
    dimension = 400_000
    layout = Layout(dimension, squared_bound(1.0, 1.0, 10))
    wire = layout.chunk - 1  # holds x alone: the witness bits (which differ per report) fill fewer wires
    assert layout.witness_bits < wire
    x = field.from_signed(np.round(vector_at(0.9 * 2**10, dimension, 9)).astype(np.int64))
    points = flp.query_points(layout, QUERY_SEED)
    first, second = (flp.lagrange_at(layout.points, point)[0] for point in points)
    eliminated = []
    for _ in range(2):
        leader_share, helper_share = make_report(layout, x)
        leader = Verifier(layout, Role.LEADER, QUERY_SEED).receive(0, leader_share)
        helper = Verifier(layout, Role.HELPER, QUERY_SEED).receive(0, helper_share)
        wires = field.add(leader.share.wire_values, helper.share.wire_values)
        eliminated.append((int(second) * int(wires[0, wire]) - int(first) * int(wires[1, wire])) % field.P)
    assert eliminated[0] != eliminated[1]


def square_root(residue: int) -> int:
    """A square root of a quadratic residue mod p (Tonelli-Shanks: p = 2^52 - 47 is 1 mod 4, so no one power gives it)."""
    odd, twos = field.P - 1, 0
    while odd % 2 == 0:
        odd, twos = odd // 2, twos + 1
    non_residue = next(z for z in range(2, 1000) if pow(z, (field.P - 1) // 2, field.P) == field.P - 1)
    order, factor = twos, pow(non_residue, odd, field.P)
    power, root = pow(residue, odd, field.P), pow(residue, (odd + 1) // 2, field.P)
    while power != 1:
        least, square = 0, power
        while square != 1:
            least, square = least + 1, square * square % field.P
        step = pow(factor, 1 << (order - least - 1), field.P)
        order, factor = least, step * step % field.P
        power, root = power * factor % field.P, root * step % field.P
    return root
