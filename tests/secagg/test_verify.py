"""Verified aggregation: an honest aggregate passes every survivor's check, any other is refused with its reason."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import AuthenticationError, ProtocolError, StaleMessageError, VerificationError, VerifyReason
from fedfair.secagg import config as config_module
from fedfair.secagg import keys
from fedfair.secagg.simulate import DropOut, simulate_round
from fedfair.pki.identity import sign
from fedfair.secagg.verify import (
    BLOCK,
    CHECKS,
    TAG_MODULUS,
    Challenge,
    aggregate_digest,
    check_sum,
    decode_tags,
    encode_tags,
    masked_tags,
    tag_payload,
)
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from fedfair.secagg.wire import Stage
from fedfair.secagg.masked_round import SECURE_ROUND
from tests.secagg.helpers import Harness, encode_all, make_config, make_inputs, order_at

SESSION = b"s" * 32
INPUTS = (b"1" * 32, b"2" * 32)


@pytest.fixture(autouse=True, scope="module")
def tag_check_alone() -> Iterator[None]:
    """These rounds run the tag check alone, as every round above RESUMMED_WORDS does (tests/secagg/test_resum.py
    covers the re-summing check that runs below it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config_module, "RESUMMED_WORDS", 0)
        yield


def signed(words: np.ndarray) -> list[int]:
    """The words as two's complement integers, the reference the kernel must match."""
    bits = words.dtype.itemsize * 8
    return [int(word) - ((int(word) >> (bits - 1)) << bits) for word in words]


def reference_dots(challenge: Challenge, words: np.ndarray) -> list[int]:
    """<r^c, v> in plain Python ints, from the coefficients' definition r^c_j = b^c_q a^c_(j mod BLOCK)."""
    values = signed(words)
    inner = challenge._inner.tolist()
    return [
        sum(challenge._outer[j // BLOCK][c] * inner[c][j % BLOCK] * value for j, value in enumerate(values))
        for c in range(CHECKS)
    ]


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_the_challenge_dots_are_the_exact_integers_across_blocks_and_signs(dtype: type[np.unsignedinteger]) -> None:
    rng = np.random.default_rng(7)
    bits = np.dtype(dtype).itemsize * 8
    words = rng.integers(0, 2**63, BLOCK + 5, dtype=np.uint64).astype(dtype)
    words[::3] |= dtype(1 << (bits - 1))  # a third negative
    words[:4] = [0, 1, dtype(-1 % 2**bits), dtype(1 << (bits - 1))]  # zero, one, minus one, the most negative
    challenge = Challenge(SESSION, b"d" * 32, words.size)
    assert list(challenge.dots(words)) == reference_dots(challenge, words)


def test_the_challenge_is_fixed_by_the_digest_and_the_session_alone() -> None:
    words = np.arange(10, dtype=np.uint32)
    assert Challenge(SESSION, b"d" * 32, 10).dots(words) == Challenge(SESSION, b"d" * 32, 10).dots(words)
    assert Challenge(SESSION, b"e" * 32, 10).dots(words) != Challenge(SESSION, b"d" * 32, 10).dots(words)
    assert Challenge(b"t" * 32, b"d" * 32, 10).dots(words) != Challenge(SESSION, b"d" * 32, 10).dots(words)


def test_the_digest_binds_every_word_the_survivors_their_inputs_and_the_session() -> None:
    vector = np.arange(5, dtype=np.uint16)
    digest = aggregate_digest(SESSION, (1, 2), INPUTS, vector)
    changed = vector.copy()
    changed[4] ^= 1
    assert aggregate_digest(SESSION, (1, 2), INPUTS, changed) != digest
    assert aggregate_digest(SESSION, (1, 3), INPUTS, vector) != digest
    assert aggregate_digest(b"t" * 32, (1, 2), INPUTS, vector) != digest
    assert aggregate_digest(SESSION, (1, 2), (INPUTS[0], b"3" * 32), vector) != digest  # a survivor's masked input
    assert aggregate_digest(SESSION, (1, 2), INPUTS, vector.astype(np.uint32)) != digest  # the word size too


def pairwise_tags(inputs: dict[int, np.ndarray], digest: bytes) -> dict[int, bytes]:
    """Every party's masked tags on the complete graph, with tag keys made up for the test."""
    challenge = Challenge(SESSION, digest, next(iter(inputs.values())).size)
    tag_key = {(a, b): bytes([a, b]) * 16 for a in inputs for b in inputs if a < b}
    return {
        party: masked_tags(
            challenge,
            words,
            party,
            {peer: tag_key[min(party, peer), max(party, peer)] for peer in inputs if peer != party},
            SESSION,
            digest,
        )
        for party, words in inputs.items()
    }


def test_the_pairwise_tag_masks_cancel_in_the_sum_and_hide_each_tag() -> None:
    rng = np.random.default_rng(3)
    # In range, as every honest encoding is: their sum does not wrap modulo 2^16.
    inputs = {party: rng.integers(-10_000, 10_000, 9).astype(np.int16).view(np.uint16) for party in (1, 2, 3)}
    total = sum(inputs.values(), np.zeros(9, dtype=np.uint16))
    digest = b"d" * 32
    tags = pairwise_tags(inputs, digest)
    challenge = Challenge(SESSION, digest, 9)
    assert check_sum(challenge.dots(total), tags.values())
    # Each masked tag is far from its party's own dot product: a mask sits on it.
    for party, field in tags.items():
        assert decode_tags(field) != tuple(dot % TAG_MODULUS for dot in challenge.dots(inputs[party]))


def test_what_the_tags_reveal_is_a_function_of_the_sum() -> None:
    """Two splits of one sum give honest tags that differ by +delta and -delta: one unknown pairwise mask absorbs it.

    Party 3 colludes with the aggregator. Parties 1 and 2 are honest; the coalition does not know their pairwise
    tag mask m_12, which enters tag 1 as +m_12 and tag 2 as -m_12. Moving delta from party 2's input to party 1's
    changes tag 1 by +<r, delta> and tag 2 by -<r, delta>, which is the same as m_12 + <r, delta> in place of
    m_12: since m_12 is uniform, both splits give the coalition the same distribution of tags.
    """
    rng = np.random.default_rng(5)
    inputs = {party: rng.integers(-50, 50, 6).astype(np.int16).view(np.uint16) for party in (1, 2, 3)}
    delta = rng.integers(-20, 20, 6).astype(np.int16).view(np.uint16)
    other = dict(inputs)
    other[1] = inputs[1] + delta
    other[2] = inputs[2] - delta
    digest = b"d" * 32
    one, two = pairwise_tags(inputs, digest), pairwise_tags(other, digest)
    assert one[3] == two[3]  # the colluder's own tag: the same input, the same tag
    shift = [(b - a) % TAG_MODULUS for a, b in zip(decode_tags(one[1]), decode_tags(two[1]), strict=True)]
    back = [(a - b) % TAG_MODULUS for a, b in zip(decode_tags(one[2]), decode_tags(two[2]), strict=True)]
    assert shift == back and any(shift)


def verified_round(
    parties: int = 4,
    *,
    maskers: list[int] | None = None,
    signers: list[int] | None = None,
    neighbours: int | None = None,
    modulus_bits: int = 32,
    max_colluding: int = 0,
) -> tuple[Harness, AggregateClaim]:
    """A round through UNMASK and the server's claim, every party keeping its input for VERIFY."""
    config = make_config(parties, neighbours=neighbours, modulus_bits=modulus_bits, max_colluding=max_colluding)
    harness = Harness(config, verified=True)
    everyone = list(range(1, parties + 1))
    request = harness.through_consistency(maskers or everyone, signers)
    harness.unmask(request, signers)
    harness.server.finish()
    return harness, harness.server.claim()


def tag_and_verify(harness: Harness, claim: AggregateClaim, survivors: tuple[int, ...]) -> dict[int, object]:
    """Every survivor tags ``claim``; the tags are relayed as they are; each survivor's verdict (or error)."""
    tags = tuple(harness.clients[party].tag(claim) for party in survivors)
    tag_set = TagSet(claim.header, tags)
    verdicts: dict[int, object] = {}
    for party in survivors:
        try:
            verdicts[party] = harness.clients[party].verify(tag_set)
        except VerificationError as error:
            verdicts[party] = error
    return verdicts


def reasons(verdicts: dict[int, object]) -> set[object]:
    return {verdict.reason if isinstance(verdict, VerificationError) else "accepted" for verdict in verdicts.values()}


@pytest.mark.parametrize("modulus_bits", [16, 32, 64])
def test_an_honest_aggregate_passes_every_survivor_with_dropouts(modulus_bits: int) -> None:
    harness, claim = verified_round(5, maskers=[1, 2, 3, 4], modulus_bits=modulus_bits)
    survivors = (1, 2, 3, 4)
    for tag in (harness.clients[party].tag(claim) for party in survivors):
        harness.server.receive_tag(tag)
    assert harness.server.untagged == ()
    tag_set = harness.server.tag_set()
    expected = sum((harness.encoded[party] for party in survivors), np.zeros_like(harness.encoded[1]))
    np.testing.assert_array_equal(claim.vector, expected)
    for party in survivors:
        np.testing.assert_array_equal(harness.clients[party].verify(tag_set), expected)


def test_an_honest_aggregate_passes_on_a_secagg_plus_graph_with_dropouts() -> None:
    trace = simulate_round(
        make_config(10, neighbours=6),
        lambda party: encode_all(make_config(10, neighbours=6), make_inputs(make_config(10, neighbours=6)))[party],
        DropOut({Stage.MASK: [10]}),
        verified=True,
    )
    assert sorted(trace.verified) == list(trace.result.contributors) == list(range(1, 10))
    for decoded in trace.verified.values():
        np.testing.assert_array_equal(decoded.weighted_sum, trace.result.decoded.weighted_sum)


def forged(claim: AggregateClaim, vector: np.ndarray) -> AggregateClaim:
    return AggregateClaim(claim.header, vector.astype(claim.vector.dtype))


def test_a_forged_word_is_refused_by_every_survivor_naming_the_round() -> None:
    harness, claim = verified_round(4)
    vector = claim.vector.copy()
    vector[3] += 1
    verdicts = tag_and_verify(harness, forged(claim, vector), (1, 2, 3, 4))
    assert reasons(verdicts) == {VerifyReason.FORGED}
    assert all(str(verdict).startswith("round 0: aggregate refused (FORGED)") for verdict in verdicts.values())


def test_a_survivors_input_left_out_is_refused() -> None:
    harness, claim = verified_round(4, maskers=[1, 2, 3])
    without = claim.vector - harness.encoded[3]
    assert reasons(tag_and_verify(harness, forged(claim, without), (1, 2, 3))) == {VerifyReason.FORGED}


def test_a_substituted_model_is_refused() -> None:
    harness, claim = verified_round(3)
    flipped = (-claim.vector.astype(np.int64)).astype(claim.vector.dtype)  # the update's sign flipped
    flipped[-1] = claim.vector[-1]  # the total weight kept, so the range check alone would not notice
    assert reasons(tag_and_verify(harness, forged(claim, flipped), (1, 2, 3))) == {VerifyReason.FORGED}


def test_a_missing_tag_is_named() -> None:
    harness, claim = verified_round(4)
    tags = tuple(harness.clients[party].tag(claim) for party in (1, 2, 3))
    with pytest.raises(VerificationError, match="no tag from site-4") as caught:
        harness.clients[1].verify(TagSet(claim.header, tags))
    assert caught.value.reason is VerifyReason.MISSING_TAG and caught.value.round == 0


def test_an_aggregate_shown_differently_to_one_survivor_fails_everywhere() -> None:
    harness, claim = verified_round(3)
    other = claim.vector.copy()
    other[0] += 1
    tags = (
        harness.clients[1].tag(forged(claim, other)),
        harness.clients[2].tag(claim),
        harness.clients[3].tag(claim),
    )
    tag_set = TagSet(claim.header, tags)
    for party in (1, 2, 3):
        with pytest.raises(VerificationError) as caught:
            harness.clients[party].verify(tag_set)
        assert caught.value.reason is VerifyReason.BAD_TAG
    with pytest.raises(VerificationError) as caught:
        harness.clients[1].tag(claim)  # a second aggregate for the round
    assert caught.value.reason is VerifyReason.EQUIVOCATED


def test_an_altered_tag_is_refused_and_the_server_refuses_it_too() -> None:
    harness, claim = verified_round(3)
    tags = [harness.clients[party].tag(claim) for party in (1, 2, 3)]
    field = bytearray(tags[0].tags)
    field[-1] ^= 1
    tags[0] = AggregateTag(tags[0].header, 1, bytes(field), tags[0].signature)
    with pytest.raises(VerificationError) as caught:
        harness.clients[2].verify(TagSet(claim.header, tuple(tags)))
    assert caught.value.reason is VerifyReason.BAD_TAG
    with pytest.raises(AuthenticationError):
        harness.server.receive_tag(tags[0])


def test_a_party_built_without_verified_cannot_tag() -> None:
    config = make_config(3)
    harness = Harness(config)
    harness.unmask(harness.through_consistency([1, 2, 3]))
    harness.server.finish()
    with pytest.raises(VerificationError) as caught:
        harness.clients[1].tag(harness.server.claim())
    assert caught.value.reason is VerifyReason.MALFORMED


def test_the_tag_keys_are_not_the_mask_keys() -> None:
    secret = b"x" * 32
    assert keys.pair_tag_key(secret, SESSION, 1, 2) == keys.pair_tag_key(secret, SESSION, 2, 1)
    assert keys.pair_tag_key(secret, SESSION, 1, 2) != keys.pair_mask_key(secret, SESSION, 1, 2)


@settings(max_examples=25, deadline=None)
@given(
    data=st.data(),
    modulus_bits=st.sampled_from([16, 32, 64]),
)
def test_any_change_to_the_aggregate_is_caught(data: st.DataObject, modulus_bits: int) -> None:
    """Property: whatever nonzero error the aggregator adds, in whichever words, every survivor refuses it.

    The check misses a given error with probability at most 2^-126 (docs/security.md), so a single miss here
    would be a bug, not bad luck.
    """
    harness, claim = verified_round(3, modulus_bits=modulus_bits)
    words = claim.vector.size
    positions = data.draw(st.lists(st.integers(0, words - 1), min_size=1, max_size=4, unique=True))
    vector = claim.vector.copy()
    for position in positions:
        change = data.draw(st.integers(1, 2**modulus_bits - 1))  # nonzero modulo 2^k: the word really changes
        vector[position] = (int(vector[position]) + change) % 2**modulus_bits
    assert reasons(tag_and_verify(harness, forged(claim, vector), (1, 2, 3))) == {VerifyReason.FORGED}


@settings(max_examples=15, deadline=None)
@given(
    parties=st.integers(3, 6),
    leavers=st.data(),
)
def test_an_honest_aggregate_always_passes_whoever_drops_before_verify(parties: int, leavers: st.DataObject) -> None:
    config = make_config(parties)
    drop_count = leavers.draw(st.integers(0, parties - config.t))
    gone = leavers.draw(st.lists(st.integers(1, parties), unique=True, min_size=drop_count, max_size=drop_count))
    stage = leavers.draw(st.sampled_from([Stage.ADVERTISE, Stage.SHARE, Stage.CHECK, Stage.MASK]))
    encoded = encode_all(config, make_inputs(config))
    trace = simulate_round(config, lambda party: encoded[party].copy(), DropOut({stage: gone}), verified=True)
    assert sorted(trace.verified) == list(trace.result.contributors)
    for decoded in trace.verified.values():
        np.testing.assert_array_equal(decoded.weighted_sum, trace.result.decoded.weighted_sum)


@pytest.mark.parametrize("stage", [Stage.CONSISTENCY, Stage.UNMASK, Stage.VERIFY])
def test_a_survivor_silent_after_masking_leaves_the_round_unverifiable_and_named(stage: Stage) -> None:
    """On a SecAgg+ graph its input is in the sum but it never tags it: no party can check the sum, so every party
    refuses it. (On the complete graph the others re-sum it instead: tests/secagg/test_resum_fallback.py.)"""
    config = make_config(6, neighbours=3, threshold=3)
    encoded = encode_all(config, make_inputs(config))
    with pytest.raises(VerificationError, match="no tag from site-6") as caught:
        simulate_round(config, lambda party: encoded[party].copy(), DropOut({stage: [6]}), verified=True)
    assert caught.value.reason is VerifyReason.MISSING_TAG


def test_the_server_takes_one_signed_tag_per_survivor_and_relays_them_in_order() -> None:
    harness, claim = verified_round(4, maskers=[1, 2, 4])
    tags = {party: harness.clients[party].tag(claim) for party in (4, 1)}
    for tag in tags.values():
        harness.server.receive_tag(tag)
    with pytest.raises(ProtocolError, match="already tagged"):
        harness.server.receive_tag(tags[1])
    stranger = AggregateTag(claim.header, 3, tags[1].tags, tags[1].signature)
    with pytest.raises(ProtocolError, match="not a survivor"):
        harness.server.receive_tag(stranger)
    assert harness.server.untagged == (2,)
    claiming, verdicts = SECURE_ROUND.verify_stages
    order = order_at(claiming, verified=True)
    assert [tag.sender for tag in order.close(claiming, harness.server.tag_set).tags] == [1, 4]
    late = harness.clients[2].tag(claim)
    with pytest.raises(StaleMessageError):  # its runner takes no tag once VERIFY_CLAIM is closed
        order.receive(claiming, late, partial(harness.server.receive_tag, late))


def test_a_claim_for_another_round_is_stale() -> None:
    harness, claim = verified_round(3)
    with pytest.raises(StaleMessageError):
        harness.clients[1].tag(AggregateClaim(replace(claim.header, round=claim.header.round + 1), claim.vector))


def test_the_server_sees_whether_the_tags_add_up_before_it_relays_them() -> None:
    """The true sum with honest tags adds up; one survivor's signed but false tag, or a missing one, does not."""
    harness, claim = verified_round(4)
    tags = {party: harness.clients[party].tag(claim) for party in (1, 2, 3, 4)}
    for party in (1, 2, 3):
        harness.server.receive_tag(tags[party])
    assert not harness.server.tags_add_up()  # site-4's tag is missing
    harness.server.receive_tag(tags[4])
    assert harness.server.tags_add_up()

    liar_harness, liar_claim = verified_round(4)
    honest = {party: liar_harness.clients[party].tag(liar_claim) for party in (1, 2, 3)}
    for tag in honest.values():
        liar_harness.server.receive_tag(tag)
    true_tag = liar_harness.clients[4].tag(liar_claim)
    false_tags = encode_tags(value + 1 for value in decode_tags(true_tag.tags))
    view = liar_harness.clients[4].signed_view
    assert view is not None
    digest = aggregate_digest(liar_harness.server.session_id, (1, 2, 3, 4), view[2], liar_claim.vector)
    signature = sign(
        liar_harness.identities[liar_harness.config.name_of(4)],
        tag_payload(liar_harness.server.session_id, digest, 4, false_tags),
    )
    liar_harness.server.receive_tag(AggregateTag(true_tag.header, 4, false_tags, signature))
    assert not liar_harness.server.tags_add_up()
