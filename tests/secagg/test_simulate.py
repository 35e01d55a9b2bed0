"""A simulated round: the survivors' sum within its error bound, silent drop-outs, a trace of what each party sent."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import (
    AdvertiseKeys,
    ConsistencySignature,
    MaskedInput,
    Message,
    ShareCheck,
    ShareKeys,
    UnmaskResponse,
)
from fedfair.secagg.wire import SUM_STAGES, Stage
from fedfair.secagg.simulate import DropOut, simulate_round
from tests.secagg.helpers import CLIP, MAX_WEIGHT, encode_all, make_config, make_inputs

Inputs = dict[int, tuple[np.ndarray, float]]
Drop = dict[Stage, list[int]]


@st.composite
def rounds(draw: st.DrawFn) -> tuple[SecAggConfig, Drop, Inputs]:
    """3 to 6 parties in 16- or 32-bit words, up to n - t of them silent from a drawn stage on, inputs anywhere in the
    clip range; the threshold set for up to one colluder where the roster allows one."""
    parties = draw(st.integers(3, 6))
    dimension = draw(st.integers(1, 4))
    colluders = draw(st.integers(0, 1 if parties >= 4 else 0))
    modulus_bits = draw(st.sampled_from([16, 32]))
    config = make_config(parties, dimension=dimension, modulus_bits=modulus_bits, max_colluding=colluders)
    leavers = draw(st.lists(st.integers(1, parties), unique=True, max_size=parties - config.t))
    drop: Drop = {}
    for party in leavers:
        drop.setdefault(draw(st.sampled_from(SUM_STAGES)), []).append(party)
    coordinate = st.one_of(st.floats(-CLIP, CLIP), st.sampled_from([CLIP, -CLIP, 0.0]))
    inputs: Inputs = {}
    for party in range(1, parties + 1):
        weight = draw(st.one_of(st.floats(0.5, MAX_WEIGHT), st.just(MAX_WEIGHT)))
        inputs[party] = (weight * draw(arrays(np.float64, dimension, elements=coordinate)), weight)
    return config, drop, inputs


def within(decoded: float, exact: list[float], bound: float) -> bool:
    """|decoded - sum(exact)| <= bound, up to the correctly rounded float sum's half ulp, in exact rationals."""
    plain = math.fsum(exact)
    return abs(Fraction(decoded) - Fraction(plain)) <= Fraction(bound) + Fraction(math.ulp(plain)) / 2


@settings(max_examples=25, deadline=None)
@given(rounds())
def test_a_round_recovers_the_survivors_sum_within_its_error_bound_whoever_drops_at_whichever_stage(
    case: tuple[SecAggConfig, Drop, Inputs],
) -> None:
    config, drop, inputs = case
    encoded = encode_all(config, inputs)
    result = simulate_round(config, lambda party: encoded[party].copy(), DropOut(drop)).result
    before_masking = {party for stage, parties in drop.items() if stage < Stage.CONSISTENCY for party in parties}
    contributors = sorted(set(inputs) - before_masking)
    assert list(result.contributors) == contributors
    for stage in list(Stage)[:5]:
        assert result.dropped[stage] == tuple(sorted(drop.get(stage, [])))
    # A party silent since CONSISTENCY never answers the unmask request either.
    assert set(result.dropped[Stage.UNMASK]) == set(drop.get(Stage.CONSISTENCY, [])) | set(drop.get(Stage.UNMASK, []))
    bound = result.decoded.error_bound
    assert bound == config.encoder.error_bound(len(contributors))
    for index, value in enumerate(result.decoded.weighted_sum.tolist()):
        assert within(value, [float(inputs[party][0][index]) for party in contributors], bound)
    assert within(result.decoded.total_weight, [inputs[party][1] for party in contributors], bound)


def test_a_dropped_party_stays_silent_and_the_trace_counts_what_everyone_sent() -> None:
    # n = 9, t = 5: party 2 leaves at ADVERTISE, 3 at SHARE, 4 at CHECK, 5 at MASK.
    config = make_config(9)
    encoded = encode_all(config, make_inputs(config))
    drop: Drop = {Stage.ADVERTISE: [2], Stage.SHARE: [3], Stage.CHECK: [4], Stage.MASK: [5]}
    observed: list[Message] = []
    asked: list[int] = []

    def encoded_input(party: int) -> np.ndarray:
        asked.append(party)
        return encoded[party].copy()

    trace = simulate_round(config, encoded_input, DropOut(drop), observed.append)
    everyone = set(range(1, 10))
    kinds = (AdvertiseKeys, ShareKeys, ShareCheck, MaskedInput, ConsistencySignature, UnmaskResponse)
    senders = [{message.sender for message in observed if isinstance(message, kind)} for kind in kinds]
    survivors = everyone - {2, 3, 4, 5}
    assert senders == [everyone - {2}, everyone - {2, 3}, everyone - {2, 3, 4}, survivors, survivors, survivors]
    # The server receives the stages in order, and asks for an input only from a party about to mask, once.
    stages = [message.header.stage for message in observed]
    assert stages == sorted(stages)
    assert sorted(asked) == [1, 6, 7, 8, 9]
    # Upload bytes are the wire sizes of each party's messages (the encoding is canonical, so re-serialising
    # a received message gives the bytes that were sent); a party silent from the start sent nothing.
    sent = dict.fromkeys(everyone, 0)
    for message in observed:
        assert isinstance(message, kinds)  # the server receives only the parties' messages
        sent[message.sender] += len(message.to_bytes())
    assert trace.upload_bytes == sent and sent[2] == 0
    assert [len(trace.client_seconds[stage]) for stage in SUM_STAGES] == [len(parties) for parties in senders]
    assert all(seconds >= 0 for times in trace.client_seconds.values() for seconds in times)
    assert set(trace.server_seconds) == set(Stage) and all(seconds >= 0 for seconds in trace.server_seconds.values())
    assert trace.result.contributors == (1, 6, 7, 8, 9)


def test_each_call_draws_fresh_identity_keys_so_two_rounds_share_no_credential_or_session() -> None:
    config = make_config(3)
    encoded = encode_all(config, make_inputs(config))
    credentials: list[set[bytes]] = []
    sessions: list[set[bytes]] = []
    for _ in range(2):
        observed: list[Message] = []
        simulate_round(config, lambda party: encoded[party].copy(), observe=observed.append)
        credentials.append({m.credential for m in observed if isinstance(m, AdvertiseKeys)})
        sessions.append({m.header.session_id for m in observed if not isinstance(m, AdvertiseKeys)})
    assert len(credentials[0]) == len(credentials[1]) == 3
    assert not credentials[0] & credentials[1]
    assert len(sessions[0]) == len(sessions[1]) == 1 and sessions[0] != sessions[1]


def test_a_verified_round_that_re_sums_sends_each_survivor_every_survivors_masked_input() -> None:
    # The download count is what makes the bounded round's bytes comparable with this one's
    # (benchmarks/input_bound_cost.py): it must hold the re-sum material a survivor really receives.
    config = make_config(4, dimension=300, modulus_bits=16)
    assert config.resummed
    encoded = encode_all(config, make_inputs(config))
    material = config.size * (config.dimension + 1) * 16 // 8
    plain = simulate_round(config, lambda party: encoded[party].copy())
    verified = simulate_round(config, lambda party: encoded[party].copy(), verified=True)
    assert set(verified.download_bytes) == set(range(1, 5))
    for party, received in verified.download_bytes.items():
        assert received >= plain.download_bytes[party] + material
