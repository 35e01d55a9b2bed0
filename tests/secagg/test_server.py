"""The aggregator's state machine: stages in order, only admitted parties, the survivors' exact sum through dropouts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest

from fedfair.core.errors import ProtocolError, StaleMessageError, ThresholdError
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig, largest_safe_fractional_bits
from fedfair.secagg.messages import KeyDirectory, Message
from fedfair.secagg.round import Opening, StageSpec
from fedfair.secagg.round_order import ServerOrder
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.server import AggregateResult, Server
from fedfair.secagg.wire import Stage
from tests.secagg.helpers import CLIP, MAX_WEIGHT, Harness, check_result, make_config

SPECS = SECURE_ROUND.sum_stages
"""The stages of the sum, in order: the server's receive and close of each."""


def one_message_per_stage(config: SecAggConfig) -> list[Message]:
    """Party 1's message of every stage, from a whole round of another session with the same parameters."""
    donor = Harness(config)
    advertisements = donor.advertise()
    shares = donor.share(donor.server.key_directory())
    checks = donor.check(donor.server.share_bundles())
    masked = donor.mask(donor.server.masking_set(), list(donor.clients))
    signatures = donor.sign(donor.server.survivor_set())
    responses = donor.unmask(donor.server.unmask_request())
    return [messages[1] for messages in (advertisements, shares, checks, masked, signatures, responses)]


def closer(spec: StageSpec, server: Server) -> Callable[[], object]:
    """The server's close of `spec`: its declared close, or for the sum's last stage its finish."""
    return server.finish if spec.close is None else partial(spec.close, server)


def assert_only_stage_is_open(
    order: ServerOrder, server: Server, open_stage: int | None, name: str, messages: list[Message]
) -> None:
    """Every receive and close of a stage but ``open_stage`` (0-based; None: no stage) is refused by the order."""
    for index, spec in enumerate(SPECS):
        if index == open_stage:
            continue
        message = messages[index]
        assert spec.receive is not None
        stale = f"{type(message).__name__} arrived while the server is in stage {name}"
        with pytest.raises(StaleMessageError, match=stale):
            order.receive(spec, message, partial(spec.receive, server, message))
        with pytest.raises(ProtocolError, match=f"called out of order: the server is in stage {name}$") as caught:
            order.close(spec, closer(spec, server))
        assert caught.type is ProtocolError  # not a ThresholdError: nothing was aborted


def test_every_step_of_another_stage_is_refused_and_the_refusals_change_nothing() -> None:
    config = make_config(4)
    messages = one_message_per_stage(config)
    harness = Harness(config)
    server = harness.server
    order = ServerOrder(SECURE_ROUND, verified=False)
    assert_only_stage_is_open(order, server, None, "not begun", messages)
    order.begin()
    uploads: tuple[Callable[[Any], object], ...] = (
        lambda _nothing: harness.advertise(),
        harness.share,
        harness.check,
        lambda masking_set: harness.mask(masking_set, [1, 2, 3, 4]),
        harness.sign,
        harness.unmask,
    )
    sent: list[Any] = [None]
    for index, (spec, upload) in enumerate(zip(SPECS, uploads, strict=True)):
        assert_only_stage_is_open(order, server, index, spec.stage.name, messages)
        upload(sent[-1])
        closed = order.close(spec, closer(spec, server))
        sent.append(closed.inputs if isinstance(closed, Opening) else closed)
    directory, bundles, masking_set, survivor_set, request, result = sent[1:]
    assert isinstance(directory, KeyDirectory) and directory.header.session_id == b"" and len(server.session_id) == 32
    # Every message the server sent after ADVERTISE is bound to the session and labelled with its stage.
    headers = [bundle.header for bundle in bundles.values()]
    headers += [masking_set.header, survivor_set.header, request.header]
    assert {header.session_id for header in headers} == {server.session_id}
    assert [header.stage for header in headers] == [Stage.SHARE] * 4 + [Stage.MASK, Stage.CONSISTENCY, Stage.UNMASK]
    assert isinstance(result, AggregateResult)
    check_result(result, config, harness.inputs, harness.encoded, {1, 2, 3, 4})
    assert_only_stage_is_open(order, server, None, "finished", messages)


def test_a_close_that_fails_aborts_the_round_and_nothing_is_taken_after_it() -> None:
    """Too few advertisements abort the round at its first close; every later step is refused as aborted."""
    config = make_config(4)
    messages = one_message_per_stage(config)
    harness = Harness(config)
    order = ServerOrder(SECURE_ROUND, verified=False)
    order.begin()
    harness.advertise([1, 2])
    with pytest.raises(ThresholdError, match="only 2 of 4 parties advertised keys"):
        order.close(SPECS[0], closer(SPECS[0], harness.server))
    receive = SPECS[0].receive
    assert receive is not None
    with pytest.raises(ProtocolError, match="this round was aborted; start a new round"):
        order.receive(SPECS[0], messages[0], partial(receive, harness.server, messages[0]))
    with pytest.raises(ProtocolError, match="this round was aborted"):
        order.close(SPECS[0], closer(SPECS[0], harness.server))


def test_each_stage_admits_only_parties_that_completed_the_stages_before_it() -> None:
    # n = 7, t = 4: party 7 never advertises, party 6 shares but never checks, party 5 never masks.
    config = make_config(7)
    harness = Harness(config)
    server = harness.server
    advertisements = harness.advertise(range(1, 7))
    for stranger in (0, 8):
        with pytest.raises(ProtocolError, match=f"party {stranger}, which is not in the roster"):
            server.receive_advertisement(dataclasses.replace(advertisements[1], sender=stranger))
    directory = server.key_directory()
    shares = harness.share(directory, range(1, 7))
    with pytest.raises(ProtocolError, match="party 7 sent shares without advertised keys"):
        server.receive_shares(dataclasses.replace(shares[1], sender=7))
    harness.check(server.share_bundles(), range(1, 6))
    masking_set = server.masking_set()
    assert masking_set.parties == (1, 2, 3, 4, 5)
    masked = harness.mask(masking_set, [1, 2, 3, 4])
    for outsider in (6, 7):
        with pytest.raises(ProtocolError, match=f"party {outsider} sent a masked input but is not in the masking set"):
            server.receive_masked_input(dataclasses.replace(masked[1], sender=outsider))
    survivor_set = server.survivor_set()
    signatures = harness.sign(survivor_set)
    # Party 5 is in the masking set but sent no masked input, so it is no survivor (membership is checked
    # before the signature, so the refusal names the reason).
    with pytest.raises(ProtocolError, match="party 5 is not a survivor and cannot sign the survivor set"):
        server.receive_consistency(dataclasses.replace(signatures[1], sender=5))
    harness.unmask(server.unmask_request())
    check_result(server.finish(), config, harness.inputs, harness.encoded, {1, 2, 3, 4})


def test_a_dropout_at_each_of_the_six_stages_is_recorded_where_it_happened_and_the_sum_is_the_survivors() -> None:
    # n = 13, t = 7: one party leaves at each stage and 7 still answer the unmask request.
    config = make_config(13)
    assert config.t == 7
    harness = Harness(config)
    server = harness.server
    everyone = set(range(1, 14))
    harness.advertise(everyone - {2})
    directory = server.key_directory()
    assert [advertisement.sender for advertisement in directory.advertisements] == sorted(everyone - {2})
    sharers = everyone - {2, 3}
    harness.share(directory, sharers)
    bundles = server.share_bundles()
    # Party 3 advertised but never shared: it gets no bundle, and no bundle holds a share from it.
    assert set(bundles) == sharers
    for party, bundle in bundles.items():
        assert {entry.sender for entry in bundle.shares} == sharers - {party}
    harness.check(bundles, sharers - {4})
    masking_set = server.masking_set()
    assert set(masking_set.parties) == everyone - {2, 3, 4}
    harness.mask(masking_set, set(masking_set.parties) - {5})
    survivor_set = server.survivor_set()
    harness.sign(survivor_set, set(survivor_set.survivors) - {6})
    request = server.unmask_request()
    # Party 5 was in the masking set but never masked: only its mask key is needed, to cancel the pairwise
    # masks the survivors added for it (parties 2 to 4 never entered the masking set, so nobody masked for them).
    assert request.dropped == (5,)
    assert set(request.survivors) == everyone - {2, 3, 4, 5}
    harness.unmask(request, set(request.survivors) - {6, 7})  # party 6 never signed, so it cannot answer
    result = server.finish()
    # Parties that left after masking (6 at CONSISTENCY, 7 at UNMASK) are in the sum.
    check_result(result, config, harness.inputs, harness.encoded, everyone - {2, 3, 4, 5})
    assert {stage: result.dropped[stage] for stage in list(Stage)[:5]} == {
        Stage.ADVERTISE: (2,),
        Stage.SHARE: (3,),
        Stage.CHECK: (4,),
        Stage.MASK: (5,),
        Stage.CONSISTENCY: (6,),
    }
    # UNMASK lists every survivor that never answered the request: 7, and 6, silent since CONSISTENCY.
    assert result.dropped[Stage.UNMASK] == (6, 7)
    assert not result.culprits and not result.accusations


@pytest.mark.parametrize("modulus_bits", [32, 64])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_sums_at_the_clip_of_either_sign_at_the_largest_safe_precision_come_back_within_the_bound(
    modulus_bits: int, sign: float
) -> None:
    """Every party at max weight with every coordinate at +-clip, at the largest f the wraparound check allows:
    the integer sums reach 78% of 2^31 (32 bits) or pass float64's 2^53 (64 bits, where the bound grows by the
    conversion's rounding), and the unmasked, decoded sums must still be within the reported error bound."""
    parties = 5
    bits = largest_safe_fractional_bits(CLIP, modulus_bits, parties, MAX_WEIGHT)
    encoding = EncodingConfig(CLIP, MAX_WEIGHT, bits, modulus_bits)
    names = tuple(f"site-{index}" for index in range(1, parties + 1))
    config = SecAggConfig("test-federation", 0, names, 6, encoding)
    harness = Harness(config)
    pattern = sign * np.array([1.0, -1.0, 1.0, 1.0, -1.0, -1.0]) * CLIP * MAX_WEIGHT
    harness.inputs = {party: (pattern.copy(), MAX_WEIGHT) for party in range(1, parties + 1)}
    harness.encoded = {
        party: config.encoder.encode(vector, weight, randomness_key=bytes([party]) * 32)
        for party, (vector, weight) in harness.inputs.items()
    }
    harness.unmask(harness.through_consistency([1, 2, 3, 4, 5]))
    result = harness.server.finish()
    expected = np.zeros(config.dimension + 1, dtype=config.encoder.dtype)
    for encoded in harness.encoded.values():
        expected += encoded
    np.testing.assert_array_equal(result.encoded_sum, expected)
    bound = result.decoded.error_bound
    assert bound == config.encoder.error_bound(parties)
    # The plain sums (multiples of clip * max_weight = 10, and 50) are exact in float64.
    assert np.max(np.abs(result.decoded.weighted_sum - parties * pattern)) <= bound
    assert abs(result.decoded.total_weight - parties * MAX_WEIGHT) <= bound
