"""The re-check: above RESUMMED_WORDS, max_colluding + 1 survivors recompute each survivor's challenge value.

Sound against the aggregator colluding with up to ``max_colluding`` survivors, as the re-sum is below the bound, at
a party's cost of max_colluding + 1 inputs instead of n (docs/security.md, "Verified aggregation"). Here the bound is
patched down to 0 words, so every round is above it; tests/secagg/test_resum.py's control shows the same colluder
passing the tag check alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import VerificationError, VerifyReason
from fedfair.pki.identity import sign
from fedfair.secagg import config as config_module, server as server_module
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.recheck import MOST_SURVIVORS, carried_sum, check_reports, checked_peers
from fedfair.secagg.simulate import DropOut, simulate_round
from fedfair.secagg.verify import Challenge, aggregate_digest, decode_tags, encode_tags, tag_payload
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from fedfair.secagg.wire import Stage
from tests.secagg.helpers import Harness, check_result, encode_all, make_config, make_inputs


@pytest.fixture(autouse=True)
def above_the_bound() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config_module, "RESUMMED_WORDS", 0)
        yield


@given(
    survivors=st.lists(st.integers(1, 40), min_size=2, max_size=12, unique=True).map(lambda ids: tuple(sorted(ids))),
    colluding=st.integers(0, 12),
)
def test_every_survivor_has_max_colluding_plus_one_distinct_checkers(
    survivors: tuple[int, ...], colluding: int
) -> None:
    """However many survivors the aggregator keeps, a coalition of max_colluding parties misses one checker of each."""
    checkers: dict[int, list[int]] = {party: [] for party in survivors}
    for party in survivors:
        peers = checked_peers(survivors, party, colluding)
        assert party not in peers and len(set(peers)) == len(peers) == min(colluding + 1, len(survivors) - 1)
        for peer in peers:
            checkers[peer].append(party)
    for party, found in checkers.items():
        assert len(found) == min(colluding + 1, len(survivors) - 1), (party, found)


@given(
    bits=st.sampled_from([16, 32, 64]),
    data=st.data(),
)
def test_the_carried_sum_is_exact_over_the_integers(bits: int, data: st.DataObject) -> None:
    """sum of the parts (two's complement) = their sum modulo 2^k + 2^k K, word by word, with |K| < parts."""
    count = data.draw(st.integers(1, 8))
    size = data.draw(st.integers(1, 6))
    word = st.integers(0, 2**bits - 1)
    parts = [
        np.array(data.draw(st.lists(word, min_size=size, max_size=size)), dtype=f"<u{bits // 8}") for _ in range(count)
    ]
    total, carries = carried_sum(iter(parts))
    signed = np.dtype(f"<i{bits // 8}")
    for at in range(size):
        exact = sum(int(part.view(signed)[at]) for part in parts)
        carry = int(carries.view(np.int16)[at])
        assert exact == int(total.view(signed)[at]) + (carry << bits) and abs(carry) < count


def test_the_carried_sum_refuses_nothing_or_too_many_parts() -> None:
    with pytest.raises(ValueError, match="at least one part"):
        carried_sum(iter([]))
    with pytest.raises(ValueError, match="16-bit words"):
        carried_sum(np.zeros(1, dtype=np.uint16) for _ in range(MOST_SURVIVORS + 1))


def rechecked_round(
    parties: int = 5, max_colluding: int = 1, maskers: list[int] | None = None, neighbours: int | None = None
) -> tuple[Harness, dict[int, AggregateClaim]]:
    """A round through UNMASK above the bound, and each survivor's claim as it comes over the wire."""
    config = make_config(parties, neighbours=neighbours, modulus_bits=16, max_colluding=max_colluding)
    harness = Harness(config, verified=True)
    harness.unmask(harness.through_consistency(maskers or list(range(1, parties + 1))))
    harness.server.finish()
    assert harness.config.rechecked
    claims = {party: AggregateClaim.from_bytes(claim.to_bytes()) for party, claim in harness.server.claims().items()}
    return harness, claims


def test_an_honest_round_applies_and_each_party_downloads_max_colluding_plus_one_inputs() -> None:
    harness, claims = rechecked_round(6, max_colluding=2, maskers=[1, 2, 3, 4, 5])
    survivors = (1, 2, 3, 4, 5)
    for party in survivors:
        claim = claims[party]
        assert len(claim.inputs) == 3 and claim.carries is not None and claim.carries.shape == claim.vector.shape
        assert [owner for owner, _ in claim.mask_keys] == [6]  # the dropout's key: its pairwise masks come off
        harness.server.receive_tag(harness.clients[party].tag(claim))
    assert harness.server.tags_add_up()
    tag_set = TagSet.from_bytes(harness.server.tag_set().to_bytes())
    assert all(len(tag.values) == 3 for tag in tag_set.tags) and tag_set.inputs == ()
    expected = sum((harness.encoded[party] for party in survivors), np.zeros_like(harness.encoded[1]))
    for party in survivors:
        np.testing.assert_array_equal(harness.clients[party].verify(tag_set), expected)


@pytest.mark.parametrize("parties", [4, 7])
def test_a_simulated_round_with_dropouts_verifies_at_every_survivor(parties: int) -> None:
    config = make_config(parties, max_colluding=1)
    inputs = make_inputs(config)
    encoded = encode_all(config, inputs)
    dropout = DropOut({Stage.MASK: (parties,)})
    trace = simulate_round(config, lambda party: encoded[party].copy(), dropout, verified=True)
    survivors = set(range(1, parties))
    check_result(trace.result, config, inputs, encoded, survivors)
    assert sorted(trace.verified) == sorted(survivors)


def refused(
    harness: Harness, party: int, claim: AggregateClaim, tags: list[AggregateTag] | None = None
) -> VerifyReason:
    """Why ``party`` refuses: at its tag of ``claim``, or at the tag set of ``tags`` (its own included)."""
    client = harness.clients[party]
    with pytest.raises(VerificationError) as caught:
        own = client.tag(claim)
        relayed = sorted([*(tags or []), own], key=lambda tag: tag.sender)
        client.verify(TagSet.from_bytes(TagSet(claim.header, tuple(relayed)).to_bytes()))
    assert caught.value.round == harness.config.round
    return caught.value.reason


def moved_input(claim: AggregateClaim) -> AggregateClaim:
    moved = claim.inputs[0].copy()
    moved[3] += 1
    return replace(claim, inputs=(moved, *claim.inputs[1:]))


def shorter_carries(claim: AggregateClaim) -> AggregateClaim:
    assert claim.carries is not None
    return replace(claim, carries=claim.carries[:-1])


CLAIM_CASES = {
    "no carries": (lambda claim, _other, _t: replace(claim, carries=None), VerifyReason.MALFORMED),
    "carries of another length": (lambda claim, _other, _t: shorter_carries(claim), VerifyReason.MALFORMED),
    "a peer's input moved": (lambda claim, _other, _t: moved_input(claim), VerifyReason.FORGED),
    "another party's peers' inputs": (
        lambda claim, other, _t: replace(claim, inputs=other.inputs),
        VerifyReason.FORGED,
    ),
    "an input short": (lambda claim, _other, _t: replace(claim, inputs=claim.inputs[:1]), VerifyReason.MALFORMED),
    "a seed not committed": (
        lambda claim, _other, _t: replace(claim, seeds=((2, bytes(32)), *claim.seeds[2:], claim.seeds[0])),
        VerifyReason.FORGED,
    ),
    "t - 1 signatures": (
        lambda claim, _other, t: replace(claim, signatures=claim.signatures[: t - 1]),
        VerifyReason.MALFORMED,
    ),
}


@pytest.mark.parametrize("case", sorted(CLAIM_CASES))
def test_every_part_of_a_party_s_claim_is_checked(case: str) -> None:
    harness, claims = rechecked_round()
    change, reason = CLAIM_CASES[case]
    shown = change(claims[1], claims[2], harness.config.t)  # party 1 re-checks parties 2 and 3
    assert refused(harness, 1, AggregateClaim.from_bytes(shown.to_bytes())) is reason


def covering_tags(
    harness: Harness,
    claims: dict[int, AggregateClaim],
    forged: np.ndarray,
    colluders: tuple[int, ...],
    cover_values: bool,
) -> list[AggregateTag]:
    """The colluders' tags of the forged claim: their tags moved to cover the forged words, re-signed.

    With ``cover_values`` the first colluder also moves the first value it reports by <r, forged - true>, so
    that the reported values sum to the forged claim's: what a coalition does to pass the sum of the values.
    """
    session = harness.server.session_id
    view = harness.clients[colluders[0]].signed_view
    assert view is not None
    true_sum = claims[colluders[0]].vector
    carries = claims[colluders[0]].carries
    digest = aggregate_digest(session, view[1], view[2], forged, carries)
    challenge = Challenge(session, digest, forged.size)
    shift = [after - before for after, before in zip(challenge.dots(forged), challenge.dots(true_sum), strict=True)]
    tags = []
    for index, party in enumerate(colluders):
        honest = harness.clients[party].tag(replace(claims[party], vector=forged))
        field = encode_tags(v + (moved if index == 0 else 0) for v, moved in zip(decode_tags(honest.tags), shift))
        values = honest.values
        if cover_values and index == 0:
            peer, reported = values[0]
            moved_value = encode_tags(v + m for v, m in zip(decode_tags(reported), shift, strict=True))
            values = ((peer, moved_value), *values[1:])
        signature = sign(harness.key(party), tag_payload(session, digest, party, field, values))
        tags.append(AggregateTag(honest.header, party, field, signature, values))
    return tags


@settings(max_examples=15, deadline=None)
@given(data=st.data(), parties=st.integers(4, 6), colluding=st.integers(1, 2))
def test_a_forged_sum_covered_by_up_to_max_colluding_colluders_is_refused(
    data: st.DataObject, parties: int, colluding: int
) -> None:
    """Property: whatever words change and whatever the colluders report, every honest survivor refuses FORGED.

    The colluders' tags always cover the change (the attack the tag check alone lets through); their reported
    values are true (the values then miss the forged sum) or moved to cover it (a colluder's report then disagrees
    with an honest checker's of the same survivor); the claimed carries are true or moved.
    """
    harness, claims = rechecked_round(parties, max_colluding=colluding)
    everyone = tuple(range(1, parties + 1))
    colluders = tuple(
        data.draw(st.lists(st.sampled_from(everyone), min_size=colluding, max_size=colluding, unique=True))
    )
    forged = claims[1].vector.copy()
    for position in data.draw(st.lists(st.integers(0, forged.size - 1), min_size=1, max_size=4, unique=True)):
        forged[position] = (int(forged[position]) + data.draw(st.integers(1, 2**16 - 1))) % 2**16
    carries = claims[1].carries
    assert carries is not None
    if data.draw(st.booleans()):
        carries = carries.copy()
        at = data.draw(st.integers(0, carries.size - 1))
        carries[at] = (int(carries[at]) + 1) % 2**16
        claims = {party: replace(claim, carries=carries) for party, claim in claims.items()}
    tags = covering_tags(harness, claims, forged, colluders, cover_values=data.draw(st.booleans()))
    honest = [party for party in everyone if party not in colluders]
    # The inputs each honest party is shown are true, so it tags; the sum is refused once every tag is in.
    tags += [harness.clients[party].tag(replace(claims[party], vector=forged)) for party in honest]
    relayed = TagSet.from_bytes(TagSet(claims[1].header, tuple(sorted(tags, key=lambda tag: tag.sender))).to_bytes())
    for party in honest:
        with pytest.raises(VerificationError) as caught:
            harness.clients[party].verify(relayed)
        assert caught.value.reason is VerifyReason.FORGED, party


def test_a_report_of_other_peers_or_none_is_refused() -> None:
    harness, claims = rechecked_round()
    tags = [harness.clients[party].tag(claims[party]) for party in (2, 3, 4, 5)]
    session = harness.server.session_id
    wrong = tags[0]
    for values in ((), tuple(reversed(wrong.values))):
        digest = harness.clients[2].signed_view
        assert digest is not None
        payload_digest = aggregate_digest(session, digest[1], digest[2], claims[2].vector, claims[2].carries)
        signature = sign(harness.key(2), tag_payload(session, payload_digest, 2, wrong.tags, values))
        altered = replace(wrong, values=values, signature=signature)
        assert refused(harness, 1, claims[1], [altered, *tags[1:]]) is VerifyReason.BAD_TAG


def resigned(
    harness: Harness, tag: AggregateTag, claim: AggregateClaim, values: tuple[tuple[int, bytes], ...]
) -> AggregateTag:
    """``tag`` reporting ``values`` instead, signed by its own sender: a false report that needs no forgery."""
    view = harness.clients[tag.sender].signed_view
    assert view is not None
    session = harness.server.session_id
    digest = aggregate_digest(session, view[1], view[2], claim.vector, claim.carries)
    signature = sign(harness.key(tag.sender), tag_payload(session, digest, tag.sender, tag.tags, values))
    return AggregateTag.from_bytes(replace(tag, values=values, signature=signature).to_bytes())


def moved_report(values: tuple[tuple[int, bytes], ...], peer: int) -> tuple[tuple[int, bytes], ...]:
    """``values`` with ``peer``'s first check moved by 1 (modulo 2^256, as a tag field holds it)."""
    return tuple(
        (at, encode_tags(value + (at == peer and check == 0) for check, value in enumerate(decode_tags(field))))
        for at, field in values
    )


def withheld(harness: Harness, tags: dict[int, AggregateTag]) -> str | None:
    """Hand the server every tag, then ask the runtime's hook whether it relays them (None) or voids the round."""
    for tag in tags.values():
        harness.server.receive_tag(tag)
    hook = SECURE_ROUND.verify_stages[0].withheld
    assert hook is not None
    return hook(harness.server)


def honest_tags(harness: Harness, claims: dict[int, AggregateClaim]) -> dict[int, AggregateTag]:
    return {party: harness.clients[party].tag(claims[party]) for party in claims}


def test_the_site_whose_report_is_false_is_named_and_the_round_goes_on_without_its_tag() -> None:
    """The re-check red team's finding 2: one value moved by 1 and signed voided the round and named nobody.

    The aggregator rebuilt every z_j for the carries, so it computes the true <r, z_j> itself: it names the liar
    (proven, so excluded), drops its tag, and every other survivor re-sums the round from the tag set.
    """
    harness, claims = rechecked_round()
    true_sum = np.array(harness.server.running_sum, copy=True)  # unmasked in place at finish
    tags = honest_tags(harness, claims)
    liar, peer = 1, tags[1].values[0][0]
    tags[liar] = resigned(harness, tags[liar], claims[liar], moved_report(tags[liar].values, peer))
    assert withheld(harness, tags) is None  # the complete graph: the missing tag's re-sum decides
    server = harness.server
    assert set(server.culprits) == set(server.excluded()) == {liar}  # proven by the server's own computation
    assert harness.config.name_of(peer) in server.culprits[liar]
    assert server.untagged == (liar,)
    tag_set = TagSet.from_bytes(server.tag_set().to_bytes())
    assert liar not in {tag.sender for tag in tag_set.tags}
    assert len(tag_set.inputs) == harness.config.size  # the fallback's material, for every survivor to re-sum
    for party in sorted(tags.keys() - {liar}):
        np.testing.assert_array_equal(harness.clients[party].verify(tag_set), true_sum)


def test_checkers_that_agree_on_a_false_value_are_both_named() -> None:
    """Both checkers of one survivor move its value alike: the reports agree, and only the truth tells them false."""
    harness, claims = rechecked_round()
    tags = honest_tags(harness, claims)
    survivors, target = harness.server.survivors, 3
    liars = {party for party in survivors if target in checked_peers(survivors, party, 1)}
    assert len(liars) == 2
    for liar in liars:
        tags[liar] = resigned(harness, tags[liar], claims[liar], moved_report(tags[liar].values, target))
    assert withheld(harness, tags) is None
    assert set(harness.server.culprits) == set(harness.server.excluded()) == liars


def test_a_report_of_other_peers_is_named() -> None:
    harness, claims = rechecked_round()
    tags = honest_tags(harness, claims)
    tags[1] = resigned(harness, tags[1], claims[1], tags[4].values)  # true values, of the peers site-4 checks
    assert withheld(harness, tags) is None
    assert set(harness.server.culprits) == {1}
    assert "other peers" in harness.server.culprits[1]


def test_honest_reports_name_nobody_and_the_tag_set_carries_no_material() -> None:
    harness, claims = rechecked_round()
    assert withheld(harness, honest_tags(harness, claims)) is None
    assert harness.server.culprits == {}
    assert harness.server.untagged == ()
    assert harness.server.tag_set().inputs == ()


def test_on_a_secagg_plus_graph_the_round_is_void_naming_the_liar() -> None:
    """A missing tag voids the round there (MISSING_TAG at every survivor), so the aggregator voids it, saying why."""
    harness, claims = rechecked_round(7, neighbours=4)
    assert not harness.config.complete
    tags = honest_tags(harness, claims)
    peer = tags[1].values[-1][0]
    tags[1] = resigned(harness, tags[1], claims[1], moved_report(tags[1].values, peer))
    why = withheld(harness, tags)
    assert why is not None and harness.config.name_of(1) in why and "false re-checked values" in why
    assert set(harness.server.excluded()) == {1}


def test_a_party_that_missed_the_round_is_kept_the_claim_every_survivor_shares() -> None:
    """The opening keeps the claim less each survivor's inputs: what tests/secagg/test_bystander.py checks a round from."""
    harness = Harness(make_config(5, modulus_bits=16, max_colluding=1), verified=True)
    harness.unmask(harness.through_consistency([1, 2, 3, 4, 5]))
    opening = SECURE_ROUND.open_verification(harness.server, harness.server.finish())
    shared = opening.shared
    assert isinstance(shared, AggregateClaim) and shared.inputs == () and shared.carries is not None
    assert sorted(opening.inputs) == [1, 2, 3, 4, 5]
    for claim in opening.inputs.values():
        assert replace(claim, inputs=()).to_bytes() == shared.to_bytes() and len(claim.inputs) == 2
    assert shared.to_bytes() == harness.server.claim().to_bytes()


@pytest.mark.parametrize("liar", [None, 1])
def test_the_reports_are_checked_once_a_round(liar: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The false reports' search and the tags' check ask alike; the server checks the reports once and keeps it,
    and builds the claim's challenge once for both.

    An honest round checks them once (both ask). Where a report is false, the liar is still named and its tag
    dropped after that one check, and the tags' check then finds a tag missing before it asks.
    """
    harness, claims = rechecked_round()
    tags = honest_tags(harness, claims)
    if liar is not None:
        peer = tags[liar].values[0][0]
        tags[liar] = resigned(harness, tags[liar], claims[liar], moved_report(tags[liar].values, peer))
    calls: list[int] = []

    def counted(*args: Any, **keywords: Any) -> None:
        calls.append(1)
        check_reports(*args, **keywords)

    challenges: list[Challenge] = []

    def built(*args: Any) -> Challenge:
        challenges.append(Challenge(*args))
        return challenges[-1]

    monkeypatch.setattr(server_module, "check_reports", counted)
    monkeypatch.setattr(server_module, "Challenge", built)
    assert withheld(harness, tags) is None
    if liar is None:
        assert harness.server.culprits == {} and harness.server.tags_add_up()
    else:
        assert set(harness.server.excluded()) == {liar} and harness.server.untagged == (liar,)
        assert not harness.server.tags_add_up()
    assert len(calls) == 1 and len(challenges) == 1
