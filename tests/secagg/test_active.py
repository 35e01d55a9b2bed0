"""Secure aggregation against an active aggregator and a lying collaborator: equivocation, accusations,
bad shares, forged consistency signatures and impossible sums, with the real protocol objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import numpy as np
import pytest

from fedfair.core.errors import ConfigError, ProtocolError, SumOutOfRangeError, ThresholdError, UnmaskRefusedError
from fedfair.pki.identity import sign
from fedfair.secagg import keys, prg, shamir
from fedfair.secagg.config import SecAggConfig, check_threshold
from fedfair.secagg.encode import EncodingConfig, largest_safe_fractional_bits
from fedfair.secagg.messages import (
    MaskedInput,
    MaskingSet,
    RevealedShare,
    ShareKeys,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
)
from fedfair.secagg.payloads import View, consistency_payload, dealing_lines, dealing_payload
from fedfair.secagg.wire import Header, Stage
from fedfair.secagg.simulate import simulate_round
from fedfair.secagg.masked_round import SECURE_ROUND
from tests.secagg.helpers import Harness, check_result, make_config, order_at

VICTIM, COLLUDER = 5, 1


def unmask_header(harness: Harness) -> Header:
    config = harness.config
    return Header(config.federation_id, config.round, Stage.UNMASK, harness.server.session_id)


def equivocate(harness: Harness) -> tuple[dict[int, MaskedInput], UnmaskRequest, UnmaskRequest]:
    """Everyone masks; the aggregator then shows two views of the MASK stage.

    View A: everyone survived (so the victim's seed shares are due), shown to parties 2 and 5.
    View B: the victim dropped (so its mask-key shares are due), shown to parties 3 and 4.
    The colluder signs both. Returns the masked inputs and the two unmask requests.
    """
    masked = harness.mask(harness.through_check(), [1, 2, 3, 4, 5])
    view_a = harness.server.survivor_set()
    view_b = dataclasses.replace(view_a, survivors=(1, 2, 3, 4), inputs=view_a.inputs[:4])
    session = harness.server.session_id
    requests = []
    for view, honest in ((view_a, (2, 5)), (view_b, (3, 4))):
        signatures = {COLLUDER: sign(harness.key(COLLUDER), consistency_payload(session, *view_of(view)))}
        signatures.update({party: harness.clients[party].consistency(view).signature for party in honest})
        dropped = tuple(sorted(set(view.masking_set) - set(view.survivors)))
        requests.append(
            UnmaskRequest(unmask_header(harness), view.survivors, dropped, tuple(sorted(signatures.items())))
        )
    return masked, requests[0], requests[1]


def masking_set_of(harness: Harness, parties: tuple[int, ...]) -> MaskingSet:
    """A masking set as a lying server would send it."""
    config = harness.config
    return MaskingSet(Header(config.federation_id, config.round, Stage.MASK, harness.server.session_id), parties)


def view_of(view: SurvivorSet) -> View:
    return view.masking_set, view.survivors, view.inputs


def test_equivocation_is_refused_at_the_threshold_the_rule_gives() -> None:
    # n = 5 with one colluder: the rule asks for 2t > 5 + 1 and t >= 3, so t = 4.
    config = make_config(5, max_colluding=1)
    assert config.t == 4
    harness = Harness(config)
    _, request_a, request_b = equivocate(harness)
    # Each view carries three signatures (two honest ones and the colluder's), one short of t.
    for request, parties in ((request_a, (2, 5)), (request_b, (3, 4))):
        for party in parties:
            with pytest.raises(UnmaskRefusedError, match="only 3 distinct survivors signed"):
                harness.clients[party].unmask(request)
    # Showing a party the other view, or pooling both views' signatures, does not help either.
    with pytest.raises(UnmaskRefusedError, match="differ from the view"):
        harness.clients[2].unmask(request_b)
    pooled = dataclasses.replace(request_a, signatures=request_a.signatures + request_b.signatures)
    with pytest.raises(UnmaskRefusedError, match="only 3 distinct survivors signed"):
        harness.clients[5].unmask(pooled)


def test_equivocation_without_colluders_fails_at_the_v1_threshold() -> None:
    # t = 3 of 5 (v1's rule, and v2's for max_colluding = 0). Alone, the aggregator gets t signatures on
    # one view at most: the victim's seed shares are due there, and the others refuse the second view.
    config = make_config(5)
    assert config.t == 3
    harness = Harness(config)
    harness.mask(harness.through_check(), [1, 2, 3, 4, 5])
    view_a = harness.server.survivor_set()
    view_b = dataclasses.replace(view_a, survivors=(1, 2, 3, 4), inputs=view_a.inputs[:4])
    signed_a = {party: harness.clients[party].consistency(view_a).signature for party in (2, 3, 5)}
    signed_b = {party: harness.clients[party].consistency(view_b).signature for party in (1, 4)}
    request_a = UnmaskRequest(unmask_header(harness), view_a.survivors, (), tuple(sorted(signed_a.items())))
    request_b = UnmaskRequest(unmask_header(harness), view_b.survivors, (VICTIM,), tuple(sorted(signed_b.items())))
    revealed = {party: harness.clients[party].unmask(request_a) for party in (2, 3, 5)}
    assert all(not response.key_shares for response in revealed.values())
    for party in (1, 4):
        with pytest.raises(UnmaskRefusedError, match="only 2 distinct survivors signed"):
            harness.clients[party].unmask(request_b)
    # The victim's mask key would need both kinds of shares from parties that already gave a seed share.
    for party in (2, 3):
        with pytest.raises(UnmaskRefusedError, match="differ from the view"):
            harness.clients[party].unmask(request_b)


def test_the_threshold_rule_is_what_stops_a_colluder() -> None:
    # The attack that rebuilt an input before v2: with t = 3 of 5 (today's default) and one colluder, two
    # views each get t signatures, the victim's seed comes from one group and its mask key from the other.
    # That is exactly the configuration the rule refuses for max_colluding = 1.
    with pytest.raises(ConfigError, match="2t must exceed"):
        check_threshold(3, 5, 1)
    config = make_config(5)
    harness = Harness(config)
    masked, request_a, request_b = equivocate(harness)
    seed_shares = [harness.clients[party].unmask(request_a).seed_shares for party in (2, 5)]
    key_shares = [harness.clients[party].unmask(request_b).key_shares for party in (3, 4)]
    held = harness.clients[COLLUDER]._held[VICTIM]  # a colluder hands over all it holds
    seed = shamir.combine(
        [shamir.Share.from_bytes(held.seed)] + [owned(shares, VICTIM) for shares in seed_shares], 3, 32
    )
    raw_key = shamir.combine(
        [shamir.Share.from_bytes(held.key)] + [owned(shares, VICTIM) for shares in key_shares], 3, 32
    )
    session = harness.server.session_id
    mask_key = keys.load_private(raw_key)
    victim = np.array(masked[VICTIM].vector)
    masks: list[prg.Mask] = [(keys.self_mask_key(seed, session, VICTIM), -1)]
    for peer in (1, 2, 3, 4):
        # The victim subtracted each pairwise stream (its id is the larger one); add it back.
        assert harness.directory is not None
        peer_public = next(a.mask_public_key for a in harness.directory.advertisements if a.sender == peer)
        masks.append((keys.pair_mask_key(keys.agree(mask_key, peer_public), session, VICTIM, peer), 1))
    prg.apply_masks(victim, masks)
    np.testing.assert_array_equal(victim, harness.encoded[VICTIM])  # the victim's input, in the clear


def owned(shares: tuple[RevealedShare, ...], owner: int) -> shamir.Share:
    return shamir.Share.from_bytes(next(r.share for r in shares if r.owner == owner))


def signed_dealing(harness: Harness, message: ShareKeys) -> ShareKeys:
    """``message`` with its sender's signature over its entries as they are now (a sender signing what it sends)."""
    session, sender = harness.server.session_id, message.sender
    payload = dealing_payload(session, sender, *dealing_lines(session, sender, message.shares))
    return dataclasses.replace(message, signature=sign(harness.key(sender), payload))


def garbage_shares(
    harness: Harness, liar: int, message: ShareKeys, recipients: Collection[int] | None = None
) -> ShareKeys:
    """The liar's shares for ``recipients`` (default: all) replaced by zero bytes, under a dealing the liar
    signs itself (so the server accepts it)."""
    entries = tuple(
        dataclasses.replace(entry, ciphertext=bytes(len(entry.ciphertext)))
        if recipients is None or entry.recipient in recipients
        else entry
        for entry in message.shares
    )
    return signed_dealing(harness, dataclasses.replace(message, shares=entries))


def test_garbage_shares_from_one_party_exclude_it_and_name_it() -> None:
    config = make_config(5)
    harness = Harness(config)
    harness.advertise()
    directory = harness.server.key_directory()
    liar = 3
    for party, client in harness.clients.items():
        message = client.share_keys(directory)
        harness.server.receive_shares(garbage_shares(harness, liar, message) if party == liar else message)
    checks = harness.check(harness.server.share_bundles())
    honest = [1, 2, 4, 5]
    assert all(checks[party].accused == (liar,) for party in honest)
    assert "fail authentication" in harness.clients[1].accusations[liar]
    masking_set = harness.server.masking_set()
    assert masking_set.parties == tuple(honest)
    with pytest.raises(ProtocolError, match="leaves this party out"):
        harness.clients[liar].masked_input(masking_set, harness.encoded[liar].copy())
    harness.mask(masking_set, honest)
    harness.sign(harness.server.survivor_set())
    harness.unmask(harness.server.unmask_request())
    result = harness.server.finish()
    check_result(result, config, harness.inputs, harness.encoded, set(honest))
    assert result.accusations == {liar: tuple(honest)}
    assert result.culprits == {liar: "accused by parties [1, 2, 4, 5] at CHECK"}


@pytest.mark.parametrize("recipients", [(1, 3, 4, 5), (4,)])
def test_a_tampered_entry_signature_excludes_its_sender(recipients: tuple[int, ...]) -> None:
    # The aggregator alters the entries of party 2 it forwards: the recipients cannot tell who lied,
    # so they accuse party 2, which is left out (denial of service, never disclosure).
    config = make_config(5)
    harness = Harness(config)
    harness.advertise()
    harness.share(harness.server.key_directory())
    bundles = harness.server.share_bundles()
    for recipient in recipients:
        dealings = tuple(
            dataclasses.replace(dealing, signature=dealing.signature[:-1] + bytes([dealing.signature[-1] ^ 1]))
            if dealing.dealer == 2
            else dealing
            for dealing in bundles[recipient].dealings
        )
        bundles[recipient] = dataclasses.replace(bundles[recipient], dealings=dealings)
    harness.check(bundles)
    assert "signature does not verify" in harness.clients[recipients[0]].accusations[2]
    masking_set = harness.server.masking_set()
    assert 2 not in masking_set.parties
    others = [1, 3, 4, 5]
    harness.mask(masking_set, others)
    harness.sign(harness.server.survivor_set())
    harness.unmask(harness.server.unmask_request())
    result = harness.server.finish()
    check_result(result, config, harness.inputs, harness.encoded, set(others))
    assert result.accusations == {2: recipients}
    assert "accused by parties" in result.culprits[2]


def test_an_honest_party_refuses_a_masking_set_with_a_peer_it_accused_or_cannot_use() -> None:
    config = make_config(5)
    harness = Harness(config)
    harness.advertise()
    harness.share(harness.server.key_directory())
    bundles = harness.server.share_bundles()
    entries = bundles[1].shares
    # One bit flipped: setting the last byte to 0 left it as it was one time in 256 (the keys are fresh each run).
    flipped = dataclasses.replace(
        entries[0], ciphertext=entries[0].ciphertext[:-1] + bytes([entries[0].ciphertext[-1] ^ 1])
    )
    check = harness.clients[1].check_shares(dataclasses.replace(bundles[1], shares=(flipped, *entries[1:])))
    assert check.accused == (entries[0].sender,)
    # A server that ignores the accusation (or drops the entry altogether) finds party 1 refusing to mask.
    everyone = masking_set_of(harness, (1, 2, 3, 4, 5))
    with pytest.raises(UnmaskRefusedError, match="which this party accused"):
        harness.clients[1].masked_input(everyone, harness.encoded[1].copy())
    other = Harness(config)
    other.advertise()
    other.share(other.server.key_directory())
    bundles = other.server.share_bundles()
    other.clients[1].check_shares(
        dataclasses.replace(bundles[1], shares=bundles[1].shares[1:], dealings=bundles[1].dealings[1:])
    )
    with pytest.raises(UnmaskRefusedError, match="does not hold"):
        other.clients[1].masked_input(masking_set_of(other, (1, 2, 3, 4, 5)), other.encoded[1].copy())


def corrupt(response: UnmaskResponse, owner: int, share: bytes | None = None) -> UnmaskResponse:
    """The response with its seed share of ``owner`` replaced by ``share`` (default: altered in one field element)."""
    seeds = tuple(
        dataclasses.replace(r, share=r.share[:-1] + bytes([r.share[-1] ^ 1]) if share is None else share)
        if r.owner == owner
        else r
        for r in response.seed_shares
    )
    return dataclasses.replace(response, seed_shares=seeds)


def test_a_corrupted_unmask_share_is_named_and_the_round_completes_from_the_others() -> None:
    config = make_config(5)
    harness = Harness(config)
    request = harness.through_consistency([1, 2, 3, 4, 5])
    liar, owner = 1, 4  # the liar's share has the smallest x, so the first rebuild attempt uses it
    for party in (1, 2, 3, 4, 5):
        response = harness.clients[party].unmask(request)
        harness.server.receive_unmask_response(corrupt(response, owner) if party == liar else response)
    assert harness.server.ready()
    result = harness.server.finish()
    check_result(result, config, harness.inputs, harness.encoded, {1, 2, 3, 4, 5})
    assert result.culprits == {
        liar: f"sent a bad unmask share for party {owner} (a share of its self-mask seed that party {owner} "
        "never dealt: it does not match the dealer's signed dealing)"
    }


def test_a_corrupted_unmask_share_with_only_t_shares_voids_the_round_naming_the_culprit() -> None:
    config = make_config(5)
    harness = Harness(config)
    request = harness.through_consistency([1, 2, 3, 4, 5])
    responses = {party: harness.clients[party].unmask(request) for party in (1, 2, 3)}
    harness.server.receive_unmask_response(corrupt(responses[2], 5))
    harness.server.receive_unmask_response(responses[1])
    harness.server.receive_unmask_response(responses[3])
    assert not harness.server.ready()
    with pytest.raises(ThresholdError, match="party 2 sent a bad unmask share for party 5"):
        harness.server.finish()
    assert list(harness.server.culprits) == [2]


def test_a_dealer_that_deals_a_bad_share_is_named_not_the_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    # Party 4 deals party 2 a signed share off its polynomial; when party 2 reveals it honestly, the
    # dealer's own signature shows who lied.
    config = make_config(5)
    harness = Harness(config)
    harness.advertise()
    directory = harness.server.key_directory()
    split = shamir.split

    def crooked(secret: bytes, threshold: int, holders: object) -> dict[int, shamir.Share]:
        shares = split(secret, threshold, holders)  # type: ignore[arg-type]
        bent = shares[2]
        shares[2] = shamir.Share(2, ((bent.values[0] + 1) % shamir.PRIME, *bent.values[1:]))
        return shares

    for party, client in harness.clients.items():
        with monkeypatch.context() as patch:
            if party == 4:
                patch.setattr(shamir, "split", crooked)
            harness.server.receive_shares(client.share_keys(directory))
    harness.check(harness.server.share_bundles())
    harness.mask(harness.server.masking_set(), [1, 2, 3, 4, 5])
    harness.sign(harness.server.survivor_set())
    harness.unmask(harness.server.unmask_request())
    result = harness.server.finish()
    check_result(result, config, harness.inputs, harness.encoded, {1, 2, 3, 4, 5})
    assert result.culprits == {4: "dealt signed shares of its self-mask seed that do not lie on one polynomial"}


def test_forged_duplicated_and_outsider_consistency_signatures_do_not_count() -> None:
    config = make_config(5)
    harness = Harness(config)
    survivor_set = harness.through_masking([1, 2, 3, 4])  # party 5 dropped before masking
    view = view_of(survivor_set)
    session = harness.server.session_id
    genuine = {party: harness.clients[party].consistency(survivor_set).signature for party in (1, 2, 3)}
    # The server refuses them too, before they could ever reach a request.
    with pytest.raises(ProtocolError, match="not a survivor"):
        harness.server.receive_consistency(dataclasses.replace(harness.clients[1].consistency(survivor_set), sender=5))
    with pytest.raises(ProtocolError, match="does not verify"):
        harness.server.receive_consistency(dataclasses.replace(harness.clients[1].consistency(survivor_set), sender=4))
    other_view = consistency_payload(session, view[0], (1, 2, 3), view[2][:3])
    header = unmask_header(harness)
    bad_sets = {
        "duplicated": ((1, genuine[1]), (1, genuine[1]), (2, genuine[2])),
        "forged": ((1, genuine[1]), (2, genuine[2]), (4, genuine[3])),
        "outsider": ((1, genuine[1]), (2, genuine[2]), (5, sign(harness.key(5), consistency_payload(session, *view)))),
        "other view": ((1, genuine[1]), (2, genuine[2]), (4, sign(harness.key(4), other_view))),
        "garbage": ((1, genuine[1]), (2, genuine[2]), (3, b"\x30\x00")),
    }
    for signatures in bad_sets.values():
        request = UnmaskRequest(header, survivor_set.survivors, (5,), signatures)
        with pytest.raises(UnmaskRefusedError, match="only 2 distinct survivors signed"):
            harness.clients[1].unmask(request)
    request = UnmaskRequest(header, survivor_set.survivors, (5,), tuple(sorted(genuine.items())))
    assert {r.owner for r in harness.clients[1].unmask(request).key_shares} == {5}


def test_too_few_consistency_signatures_abort_the_round() -> None:
    config = make_config(5)
    harness = Harness(config)
    harness.sign(harness.through_masking([1, 2, 3, 4, 5]), [1, 2])
    with pytest.raises(ThresholdError, match="signed the survivor set, below the threshold"):
        harness.server.unmask_request()


def test_on_a_secagg_plus_graph_signatures_must_come_from_each_owners_holders() -> None:
    config = make_config(10, neighbours=4)
    assert (config.holders_per_secret, config.t) == (5, 3)
    harness = Harness(config)
    survivor_set = harness.through_masking(list(range(1, 11)))
    signatures = {party: harness.clients[party].consistency(survivor_set).signature for party in range(1, 11)}
    header = unmask_header(harness)
    owner = min(config.graph[1])
    # Party 1 itself and parties that hold nothing of its neighbour ``owner``: enough signers overall,
    # but only one holder of ``owner``'s secrets.
    outsiders = sorted(set(range(2, 11)) - config.holders_of(owner))[:3]
    chosen = tuple((party, signatures[party]) for party in [1, *outsiders])
    with pytest.raises(UnmaskRefusedError, match="distinct survivors signed"):
        harness.clients[1].unmask(UnmaskRequest(header, survivor_set.survivors, (), chosen))
    everyone = tuple(sorted(signatures.items()))
    harness.clients[1].unmask(UnmaskRequest(header, survivor_set.survivors, (), everyone))


def test_ready_says_when_the_unmask_stage_can_close_early() -> None:
    config = make_config(5)
    harness = Harness(config)
    request = harness.through_consistency([1, 2, 3, 4])
    assert not harness.server.ready()
    harness.unmask(request, [1, 2])
    assert not harness.server.ready()
    harness.unmask(request, [3])
    assert harness.server.ready()
    result = harness.server.finish()
    check_result(result, config, harness.inputs, harness.encoded, {1, 2, 3, 4})
    assert result.dropped[Stage.UNMASK] == (4,)


def liar_config(parties: int = 5) -> SecAggConfig:
    max_weight = 1e6
    fractional_bits = largest_safe_fractional_bits(1.0, 64, parties, max_weight)
    encoding = EncodingConfig(1.0, max_weight, fractional_bits, modulus_bits=64)
    return SecAggConfig("liars", 0, tuple(f"p{i}" for i in range(parties)), 8, encoding)


def test_a_weight_beyond_max_weight_voids_the_round_with_nothing_applied() -> None:
    config = liar_config()
    rng = np.random.default_rng(3)
    honest = {party: config.encoder.encode(rng.uniform(-1, 1, 8) * 10.0, 10.0) for party in range(1, 6)}
    # Party 3 encodes its own vector: an ordinary update but a declared weight of 1e9 (max_weight is 1e6).
    liar = honest[3].copy()
    liar[-1] = np.uint64(round(1e9 * 2.0**config.encoding.fractional_bits))
    encoded = {**honest, 3: liar}
    with pytest.raises(SumOutOfRangeError, match="total weight"):
        simulate_round(config, lambda party: encoded[party].copy())

    harness = Harness(config)
    harness.encoded = encoded
    request = harness.through_consistency([1, 2, 3, 4, 5])
    harness.unmask(request)
    unmask = SECURE_ROUND.sum_stages[-1]
    order = order_at(unmask)
    with pytest.raises(SumOutOfRangeError):
        order.close(unmask, harness.server.finish)
    with pytest.raises(ProtocolError, match="aborted"):  # nothing to apply, ever
        order.close(unmask, harness.server.finish)


def test_a_coordinate_beyond_the_clip_voids_the_round() -> None:
    config = liar_config()
    encoded = {party: config.encoder.encode(np.zeros(8), 1.0) for party in range(1, 6)}
    # Weight 1 declared, but a coordinate of 1000 (the clip allows 1 per unit of weight).
    encoded[2][0] = np.uint64(round(1000.0 * 2.0**config.encoding.fractional_bits))
    with pytest.raises(SumOutOfRangeError, match="beyond clip"):
        simulate_round(config, lambda party: encoded[party].copy())


def test_honest_rounds_stay_within_the_sum_bounds() -> None:
    config = liar_config()
    extreme = {party: config.encoder.encode(np.full(8, 1e6), 1e6) for party in range(1, 6)}
    result = simulate_round(config, lambda party: extreme[party].copy()).result
    assert result.decoded.total_weight == pytest.approx(5e6)
    # A total weight of zero is no sum to apply either.
    zero = config.encoder.encode(np.zeros(8), 0.0)
    with pytest.raises(SumOutOfRangeError, match="total weight"):
        simulate_round(config, lambda party: zero.copy())
