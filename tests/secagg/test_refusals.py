"""Every refusal of the secure-aggregation state machines, driven stage by stage: forged, swapped,
replayed, late, tampered, misattributed and out-of-view messages."""

from __future__ import annotations

import dataclasses

import pytest

from fedfair.core.errors import (
    AuthenticationError,
    ProtocolError,
    StaleMessageError,
    ThresholdError,
    UnmaskRefusedError,
)
from fedfair.pki.identity import generate_identity_key, public_key_bytes, sign
from fedfair.secagg import keys, shamir
from fedfair.secagg.messages import KeyDirectory, ShareCheck, UnmaskResponse
from fedfair.secagg.payloads import advertisement_payload, share_check_payload
from tests.secagg.helpers import Harness, check_result, make_config


def test_forged_advertisement_is_refused_by_the_server_and_the_party_excluded() -> None:
    config = make_config(5)
    harness = Harness(config)
    attacker = generate_identity_key()
    honest = {party: client.advertise() for party, client in harness.clients.items()}
    genuine = honest[3]
    # Someone swaps in their own mask key for party 3 and signs it with their own identity key.
    mask_key = keys.public_bytes(keys.generate_key_pair())
    forged_signature = sign(
        attacker,
        advertisement_payload(config.digest, 3, genuine.cipher_public_key, mask_key, genuine.seed_commitment),
    )
    for credential in (genuine.credential, public_key_bytes(attacker)):
        forged = dataclasses.replace(
            genuine, mask_public_key=mask_key, signature=forged_signature, credential=credential
        )
        with pytest.raises(AuthenticationError):
            harness.server.receive_advertisement(forged)
    # A key or commitment swapped under the genuine signature fails too.
    with pytest.raises(AuthenticationError, match="signature"):
        harness.server.receive_advertisement(dataclasses.replace(genuine, mask_public_key=mask_key))
    with pytest.raises(AuthenticationError, match="signature"):
        harness.server.receive_advertisement(dataclasses.replace(genuine, seed_commitment=bytes(32)))
    with pytest.raises(ProtocolError, match="commitment"):
        harness.server.receive_advertisement(dataclasses.replace(genuine, seed_commitment=b"short"))
    for party, advertisement in honest.items():
        if party != 3:
            harness.server.receive_advertisement(advertisement)
    directory = harness.server.key_directory()
    assert [a.sender for a in directory.advertisements] == [1, 2, 4, 5]
    survivors = [1, 2, 4, 5]
    harness.share(directory, survivors)
    harness.check(harness.server.share_bundles())
    harness.mask(harness.server.masking_set(), survivors)
    harness.sign(harness.server.survivor_set())
    harness.unmask(harness.server.unmask_request())
    check_result(harness.server.finish(), config, harness.inputs, harness.encoded, set(survivors))


def directory_with_a_swapped_key(harness: Harness, party: int) -> KeyDirectory:
    """Everyone advertises; the key directory with ``party``'s mask key replaced by one the server holds."""
    harness.advertise()
    directory = harness.server.key_directory()
    swapped = tuple(
        dataclasses.replace(a, mask_public_key=keys.public_bytes(keys.generate_key_pair())) if a.sender == party else a
        for a in directory.advertisements
    )
    return dataclasses.replace(directory, advertisements=swapped)


def test_swapped_key_in_the_directory_is_detected_by_every_peer() -> None:
    harness = Harness(make_config(5))
    # A key-swapping aggregator replaces party 2's mask key with one it controls.
    tampered = directory_with_a_swapped_key(harness, 2)
    for party in (1, 3, 4, 5):
        shares = harness.clients[party].share_keys(tampered)
        assert 2 in harness.clients[party].excluded
        assert "signature" in harness.clients[party].excluded[2]
        assert 2 not in {entry.recipient for entry in shares.shares}
    with pytest.raises(AuthenticationError, match="never advertised"):
        harness.clients[2].share_keys(tampered)


def test_unusable_advertised_keys_are_refused_even_when_signed() -> None:
    config = make_config(3)
    harness = Harness(config)
    genuine = harness.clients[1].advertise()
    low_order = bytes(32)  # the identity point: every agreement with it is all zeros
    payload = advertisement_payload(config.digest, 1, genuine.cipher_public_key, low_order, genuine.seed_commitment)
    signed = dataclasses.replace(
        genuine, mask_public_key=low_order, signature=sign(harness.identities["site-1"], payload)
    )
    with pytest.raises(AuthenticationError, match="low order"):
        harness.server.receive_advertisement(signed)


def test_a_signed_unusable_key_in_the_directory_excludes_its_party_at_every_peer() -> None:
    # An aggregator colluding with party 1 lists a low-order mask key that party 1 signed. Every
    # party agrees with the key (complete graph), finds out, leaves party 1 out and fixes the same
    # session. (On a SecAgg+ graph only party 1's neighbours use, and so check, its keys: see below.)
    config = make_config(7)
    harness = Harness(config)
    harness.advertise()
    directory = harness.server.key_directory()
    genuine = next(a for a in directory.advertisements if a.sender == 1)
    low_order = bytes(32)
    payload = advertisement_payload(config.digest, 1, genuine.cipher_public_key, low_order, genuine.seed_commitment)
    unusable = dataclasses.replace(genuine, mask_public_key=low_order, signature=sign(harness.key(1), payload))
    tampered = dataclasses.replace(
        directory, advertisements=tuple(unusable if a.sender == 1 else a for a in directory.advertisements)
    )
    honest = range(2, 8)
    for party in honest:
        shares = harness.clients[party].share_keys(tampered)
        assert "low order" in harness.clients[party].excluded[1]
        assert 1 not in {entry.recipient for entry in shares.shares}
    assert len({harness.clients[party].session_id for party in honest}) == 1


@pytest.mark.parametrize(("bad", "reason"), [("forged", "signature"), ("unusable", "low order")])
def test_on_a_secagg_plus_graph_only_neighbours_check_keys_and_a_bad_one_splits_the_session(
    bad: str, reason: str
) -> None:
    # Checking every advertisement would cost each party O(n) ECDSA checks and agreements a round.
    # A non-neighbour never uses party 1's keys, so a forged one, or an unusable one party 1 signed,
    # is refused by party 1's neighbours only; the parties then disagree on the session, and the
    # round cannot finish: a denial of service, which the aggregator can always cause.
    config = make_config(9, neighbours=2)
    harness = Harness(config)
    tampered = directory_with_a_swapped_key(harness, 1)
    if bad == "unusable":
        genuine = next(a for a in tampered.advertisements if a.sender == 1)  # its cipher key and commitment are
        low_order = bytes(32)
        payload = advertisement_payload(config.digest, 1, genuine.cipher_public_key, low_order, genuine.seed_commitment)
        signed = dataclasses.replace(genuine, mask_public_key=low_order, signature=sign(harness.key(1), payload))
        tampered = dataclasses.replace(
            tampered, advertisements=tuple(signed if a.sender == 1 else a for a in tampered.advertisements)
        )
    near, far = sorted(config.graph[1]), sorted(set(range(2, 10)) - config.graph[1])
    for party in near + far:
        shares = harness.clients[party].share_keys(tampered)
        assert 1 not in {entry.recipient for entry in shares.shares}
    assert all(reason in harness.clients[party].excluded[1] for party in near)
    assert not any(1 in harness.clients[party].excluded for party in far)
    assert harness.clients[near[0]].session_id != harness.clients[far[0]].session_id


def test_credential_of_another_party_is_excluded() -> None:
    config = make_config(3)
    harness = Harness(config)
    advertisements = {party: client.advertise() for party, client in harness.clients.items()}
    # Party 2 relays party 1's credential: its signature cannot verify under that key.
    impostor = dataclasses.replace(advertisements[2], credential=advertisements[1].credential)
    with pytest.raises(AuthenticationError):
        harness.server.receive_advertisement(impostor)


def test_replays_from_another_round_or_session_are_refused() -> None:
    config = make_config(3)
    old = Harness(config)
    old_advertisements = old.advertise()
    old_directory = old.server.key_directory()
    old_shares = old.share(old_directory)
    old_bundles = old.server.share_bundles()
    old_checks = old.check(old_bundles)
    old_masking_set = old.server.masking_set()
    old_masked = old.mask(old_masking_set, [1, 2, 3])
    old_survivor_set = old.server.survivor_set()
    old_signatures = old.sign(old_survivor_set)
    old_request = old.server.unmask_request()

    # The next round, same parties and identity keys.
    new = Harness(make_config(3, round_number=1), old.identities)
    with pytest.raises(StaleMessageError, match="another federation or round"):
        new.server.receive_advertisement(old_advertisements[1])
    # Relabelled as the new round, the old signature no longer verifies.
    relabelled = dataclasses.replace(
        old_advertisements[1], header=dataclasses.replace(old_advertisements[1].header, round=1)
    )
    with pytest.raises(AuthenticationError):
        new.server.receive_advertisement(relabelled)
    new.advertise()
    new_directory = new.server.key_directory()
    with pytest.raises(StaleMessageError):
        new.clients[1].share_keys(old_directory)

    # A second session of the same round (a restart with fresh keys): other session id.
    again = Harness(config, old.identities)
    again.advertise()
    directory = again.server.key_directory()
    assert directory.advertisements != old_directory.advertisements
    with pytest.raises(StaleMessageError, match="another session"):
        again.server.receive_shares(old_shares[1])
    again.share(directory)
    bundles = again.server.share_bundles()
    with pytest.raises(StaleMessageError, match="another session"):
        again.clients[1].check_shares(old_bundles[1])
    # Rewriting the session id in the header does not help: every entry's signature and AEAD bind
    # the session, so both senders are accused, leaving party 1 too few holders; nothing is stored.
    forged_bundle = dataclasses.replace(old_bundles[1], header=bundles[1].header)
    with pytest.raises(ThresholdError, match="holders"):
        again.clients[1].check_shares(forged_bundle)
    with pytest.raises(StaleMessageError):
        again.server.receive_share_check(old_checks[1])
    again.check(bundles)
    masking_set = again.server.masking_set()
    with pytest.raises(StaleMessageError):
        again.clients[1].masked_input(old_masking_set, again.encoded[1].copy())
    again.mask(masking_set, [1, 2, 3])
    with pytest.raises(StaleMessageError):
        again.server.receive_masked_input(old_masked[1])
    survivor_set = again.server.survivor_set()
    with pytest.raises(StaleMessageError):
        again.clients[1].consistency(old_survivor_set)
    with pytest.raises(StaleMessageError):
        again.server.receive_consistency(old_signatures[1])
    again.sign(survivor_set)
    request = again.server.unmask_request()
    with pytest.raises(StaleMessageError):
        again.clients[1].unmask(old_request)
    # Old signatures under the new session's header do not count: they sign the old session.
    relabelled_request = dataclasses.replace(old_request, header=request.header)
    with pytest.raises(UnmaskRefusedError, match="distinct survivors signed"):
        again.clients[1].unmask(relabelled_request)
    again.unmask(request)
    check_result(again.server.finish(), config, again.inputs, again.encoded, {1, 2, 3})
    assert new_directory.header.round == 1


def test_duplicate_messages_are_refused() -> None:
    """A second message of a stage is the server's to refuse; a late one, its runner's (test_server.py)."""
    config = make_config(3)
    harness = Harness(config)
    advertisements = harness.advertise()
    with pytest.raises(ProtocolError, match="already advertised"):
        harness.server.receive_advertisement(advertisements[1])
    directory = harness.server.key_directory()
    shares = harness.share(directory)
    with pytest.raises(ProtocolError, match="already sent"):
        harness.server.receive_shares(shares[2])
    checks = harness.check(harness.server.share_bundles())
    with pytest.raises(ProtocolError, match="already sent its share check"):
        harness.server.receive_share_check(checks[1])
    masking_set = harness.server.masking_set()
    harness.mask(masking_set, [1, 2, 3])
    signatures = harness.sign(harness.server.survivor_set())
    with pytest.raises(ProtocolError, match="already signed"):
        harness.server.receive_consistency(signatures[1])


def test_server_refuses_incomplete_or_unsigned_shares_and_malformed_masked_inputs() -> None:
    config = make_config(4)
    harness = Harness(config)
    harness.advertise()
    directory = harness.server.key_directory()
    shares = {party: client.share_keys(directory) for party, client in harness.clients.items()}
    partial = dataclasses.replace(shares[1], shares=shares[1].shares[:-1])
    with pytest.raises(ProtocolError, match="exactly one share"):
        harness.server.receive_shares(partial)
    entry = shares[1].shares[0]
    altered = dataclasses.replace(entry, ciphertext=entry.ciphertext[::-1])
    with pytest.raises(AuthenticationError, match="not signed"):
        harness.server.receive_shares(dataclasses.replace(shares[1], shares=(altered, *shares[1].shares[1:])))
    for message in shares.values():
        harness.server.receive_shares(message)
    harness.check(harness.server.share_bundles())
    masked = harness.clients[1].masked_input(harness.server.masking_set(), harness.encoded[1].copy())
    with pytest.raises(ProtocolError, match="wrong word size or length"):
        harness.server.receive_masked_input(dataclasses.replace(masked, vector=masked.vector[:-1]))


def test_server_refuses_forged_or_impossible_share_checks() -> None:
    config = make_config(10, neighbours=4)
    harness = Harness(config)
    harness.advertise()
    harness.share(harness.server.key_directory())
    bundles = harness.server.share_bundles()
    check = harness.clients[1].check_shares(bundles[1])
    assert check.accused == ()
    # The server cannot invent an accusation: the check is signed by its sender.
    neighbour = min(config.graph[1])
    with pytest.raises(AuthenticationError, match="not signed"):
        harness.server.receive_share_check(dataclasses.replace(check, accused=(neighbour,)))
    # A party can only accuse a neighbour that sent it shares, in order, once.
    stranger = min(set(range(2, 11)) - config.graph[1])
    for accused, match in (((stranger,), "sent it no shares"), ((neighbour, neighbour), "twice or out of order")):
        signature = sign(harness.key(1), share_check_payload(harness.server.session_id, 1, accused))
        with pytest.raises(ProtocolError, match=match):
            harness.server.receive_share_check(ShareCheck(check.header, 1, accused, signature))
    with pytest.raises(ProtocolError, match="without sharing"):
        harness.server.receive_share_check(dataclasses.replace(check, sender=11))
    harness.server.receive_share_check(check)


def test_client_refuses_a_bundle_that_is_not_its_own() -> None:
    config = make_config(3)
    harness = Harness(config)
    harness.advertise()
    harness.share(harness.server.key_directory())
    bundles = harness.server.share_bundles()
    client = harness.clients[1]
    with pytest.raises(ProtocolError, match="another party"):
        client.check_shares(bundles[2])
    repeated = dataclasses.replace(bundles[1], shares=(bundles[1].shares[0], bundles[1].shares[0]))
    with pytest.raises(ProtocolError, match="unexpected or repeated"):
        client.check_shares(repeated)
    misaddressed = dataclasses.replace(bundles[1], shares=bundles[2].shares)
    with pytest.raises(ProtocolError, match="unexpected or repeated"):
        client.check_shares(misaddressed)
    # Nothing was stored by the refusals: the genuine bundle is accepted, nobody accused.
    assert client.check_shares(bundles[1]).accused == ()


def test_client_masks_only_for_a_masking_set_it_can_stand_behind() -> None:
    config = make_config(5)
    harness = Harness(config)
    masking_set = harness.through_check()
    assert masking_set.parties == (1, 2, 3, 4, 5)
    client = harness.clients[1]
    encoded = harness.encoded[1].copy()
    cases = [
        ((2, 3, 4, 5), ProtocolError, "leaves this party out"),
        ((1, 2, 3, 6), ProtocolError, "not in this session"),
        ((1, 3, 2), ProtocolError, "twice or out of order"),
        ((1, 2), ThresholdError, "below the threshold"),
    ]
    for parties, error, match in cases:
        with pytest.raises(error, match=match):
            client.masked_input(dataclasses.replace(masking_set, parties=parties), encoded)
    assert (encoded == harness.encoded[1]).all()  # untouched by the refusals
    client.masked_input(masking_set, encoded)
    assert not (encoded == harness.encoded[1]).all()  # masked in place


def test_client_signs_one_view_only_and_refuses_impossible_views() -> None:
    config = make_config(5)
    harness = Harness(config)
    survivor_set = harness.through_masking([1, 2, 3, 4])
    assert (survivor_set.masking_set, survivor_set.survivors) == ((1, 2, 3, 4, 5), (1, 2, 3, 4))
    client = harness.clients[1]
    cases = [
        (dict(masking_set=(1, 2, 3, 4)), UnmaskRefusedError, "differs from the one this party masked for"),
        (dict(survivors=(1, 2, 3, 6)), UnmaskRefusedError, "outside the masking set"),
        (dict(survivors=(2, 3, 4)), UnmaskRefusedError, "leaves this party out"),
        (dict(survivors=(1, 2)), ThresholdError, "below the threshold"),
        (dict(survivors=(1, 1, 2, 3)), ProtocolError, "twice or out of order"),
        (dict(inputs=survivor_set.inputs[:3]), UnmaskRefusedError, "one masked-input digest per survivor"),
        (dict(inputs=(b"0" * 32, *survivor_set.inputs[1:])), UnmaskRefusedError, "another masked input for this"),
    ]
    for changes, error, match in cases:
        with pytest.raises(error, match=match):
            client.consistency(dataclasses.replace(survivor_set, **changes))  # type: ignore[arg-type]
    signature = client.consistency(survivor_set)
    assert client.signed_view == (survivor_set.masking_set, survivor_set.survivors, survivor_set.inputs)
    assert client.consistency(survivor_set) == signature  # a retransmission gets the same signature
    with pytest.raises(UnmaskRefusedError, match="already signed another view"):
        client.consistency(dataclasses.replace(survivor_set, survivors=(1, 2, 3)))


def test_server_never_obtains_both_shares_of_one_party() -> None:
    config = make_config(5)
    harness = Harness(config)
    request = harness.through_consistency([1, 2, 3, 4])  # party 5 dropped before masking
    assert (request.survivors, request.dropped) == ((1, 2, 3, 4), (5,))
    client = harness.clients[1]
    response = client.unmask(request)
    assert {r.owner for r in response.seed_shares} == {1, 2, 3, 4}
    assert {r.owner for r in response.key_shares} == {5}
    assert client.unmask(request) == response  # a retransmitted request gets the same answer

    # Any other account of the round than the one the party signed is refused: claiming party 4
    # dropped too (to get its mask key after its seed), listing a party as both, listing this
    # party as dropped, or too few survivors.
    for survivors, dropped in (((1, 2, 3), (4, 5)), ((1, 2, 3, 4), (4, 5)), ((2, 3, 4), (1, 5)), ((1, 2), (5,))):
        greedy = dataclasses.replace(request, survivors=survivors, dropped=dropped)
        with pytest.raises((UnmaskRefusedError, ProtocolError), match="differ from the view|twice"):
            client.unmask(greedy)
    # Another party, which never signed, reveals nothing.
    with pytest.raises(ProtocolError, match="before this party signed the survivor set"):
        harness.clients[5].unmask(request)


def test_server_refuses_unrequested_or_misattributed_shares() -> None:
    config = make_config(5)
    harness = Harness(config)
    request = harness.through_consistency([1, 2, 3, 4])
    response = harness.clients[1].unmask(request)
    # Shares of party 5's seed were not asked for (it dropped): refused.
    misfiled = dataclasses.replace(
        response, seed_shares=(*response.seed_shares, *[dataclasses.replace(r, owner=5) for r in response.key_shares])
    )
    with pytest.raises(ProtocolError, match="unrequested"):
        harness.server.receive_unmask_response(misfiled)
    with pytest.raises(ProtocolError, match="another party's x"):
        harness.server.receive_unmask_response(dataclasses.replace(response, sender=2))
    share = shamir.Share.from_bytes(response.key_shares[0].share)
    short = dataclasses.replace(response.key_shares[0], share=shamir.Share(share.x, share.values[:-1]).to_bytes())
    with pytest.raises(ProtocolError, match="wrong length"):
        harness.server.receive_unmask_response(dataclasses.replace(response, key_shares=(short,)))
    harness.server.receive_unmask_response(response)
    with pytest.raises(ProtocolError, match="already answered"):
        harness.server.receive_unmask_response(response)
    with pytest.raises(ProtocolError, match="not a survivor"):
        harness.server.receive_unmask_response(dataclasses.replace(response, sender=5))
    harness.unmask(request, [2, 3, 4])
    check_result(harness.server.finish(), config, harness.inputs, harness.encoded, {1, 2, 3, 4})


def test_corrupted_key_shares_are_caught_when_rebuilding() -> None:
    config = make_config(3)
    harness = Harness(config)
    request = harness.through_consistency([1, 2])
    responses: list[UnmaskResponse] = [harness.clients[party].unmask(request) for party in (1, 2)]
    share = responses[0].key_shares[0]
    corrupted = dataclasses.replace(share, share=share.share[:-1] + bytes([share.share[-1] ^ 1]))
    harness.server.receive_unmask_response(dataclasses.replace(responses[0], key_shares=(corrupted,)))
    harness.server.receive_unmask_response(responses[1])
    assert not harness.server.ready()
    with pytest.raises(ThresholdError, match="party 1 sent a bad unmask share for party 3"):
        harness.server.finish()
    assert set(harness.server.culprits) == {1}
    with pytest.raises(ProtocolError, match="aborted"):
        harness.server.finish()
