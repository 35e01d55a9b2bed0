"""Every refusal of the secure-aggregation state machines, driven stage by stage: forged, swapped,
replayed, late, tampered and misattributed messages."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedfair.pki.identity import generate_identity_key, public_key_bytes, sign
from fedfair.secagg import keys
from fedfair.secagg.errors import (
    AuthenticationError,
    ProtocolError,
    StaleMessageError,
    ThresholdError,
    UnmaskRefusedError,
)
from fedfair.secagg.messages import UnmaskResponse, advertisement_payload
from tests.secagg.helpers import Harness, check_result, make_config


def test_forged_advertisement_is_refused_by_the_server_and_the_party_excluded() -> None:
    config = make_config(5)
    harness = Harness(config)
    attacker = generate_identity_key()
    honest = {party: client.advertise() for party, client in harness.clients.items()}
    genuine = honest[3]
    # Someone swaps in their own mask key for party 3 and signs it with their own identity key.
    mask_key = keys.public_bytes(keys.generate_key_pair())
    forged_signature = sign(attacker, advertisement_payload(config.digest, 3, genuine.cipher_public_key, mask_key))
    for credential in (genuine.credential, public_key_bytes(attacker)):
        forged = dataclasses.replace(
            genuine, mask_public_key=mask_key, signature=forged_signature, credential=credential
        )
        with pytest.raises(AuthenticationError):
            harness.server.receive_advertisement(forged)
    # A key swapped under the genuine signature fails too.
    with pytest.raises(AuthenticationError, match="signature"):
        harness.server.receive_advertisement(dataclasses.replace(genuine, mask_public_key=mask_key))
    for party, advertisement in honest.items():
        if party != 3:
            harness.server.receive_advertisement(advertisement)
    directory = harness.server.key_directory()
    assert [a.sender for a in directory.advertisements] == [1, 2, 4, 5]
    survivors = [1, 2, 4, 5]
    for party in survivors:
        harness.server.receive_shares(harness.clients[party].share_keys(directory))
    bundles = harness.server.share_bundles()
    harness.mask(bundles, survivors)
    request = harness.server.unmask_request()
    for party in survivors:
        harness.server.receive_unmask_response(harness.clients[party].unmask(request))
    check_result(harness.server.finish(), config, harness.inputs, harness.encoded, set(survivors))


def test_swapped_key_in_the_directory_is_detected_by_every_peer() -> None:
    config = make_config(5)
    harness = Harness(config)
    harness.advertise()
    directory = harness.server.key_directory()
    # A key-swapping aggregator replaces party 2's mask key with one it controls.
    swapped = tuple(
        dataclasses.replace(a, mask_public_key=keys.public_bytes(keys.generate_key_pair())) if a.sender == 2 else a
        for a in directory.advertisements
    )
    tampered = dataclasses.replace(directory, advertisements=swapped)
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
    payload = advertisement_payload(config.digest, 1, genuine.cipher_public_key, low_order)
    signed = dataclasses.replace(
        genuine, mask_public_key=low_order, signature=sign(harness.identities["site-1"], payload)
    )
    with pytest.raises(AuthenticationError, match="low order"):
        harness.server.receive_advertisement(signed)


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
    old_masked = old.mask(old_bundles, [1, 2, 3])
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
        again.clients[1].masked_input(old_bundles[1], again.encoded[1].copy())
    # Rewriting the session id in the header does not help: the shares' AEAD binds the session.
    forged_bundle = dataclasses.replace(old_bundles[1], header=bundles[1].header)
    with pytest.raises(AuthenticationError):
        again.clients[1].masked_input(forged_bundle, again.encoded[1].copy())
    again.mask(bundles, [1, 2, 3])
    with pytest.raises(StaleMessageError):
        again.server.receive_masked_input(old_masked[1])
    request = again.server.unmask_request()
    with pytest.raises(StaleMessageError):
        again.clients[1].unmask(old_request)
    for party in (1, 2, 3):
        again.server.receive_unmask_response(again.clients[party].unmask(request))
    check_result(again.server.finish(), config, again.inputs, again.encoded, {1, 2, 3})
    assert new_directory.header.round == 1


def test_late_and_duplicate_messages_are_refused() -> None:
    config = make_config(3)
    harness = Harness(config)
    advertisements = harness.advertise()
    with pytest.raises(ProtocolError, match="already advertised"):
        harness.server.receive_advertisement(advertisements[1])
    directory = harness.server.key_directory()
    with pytest.raises(StaleMessageError, match="arrived while"):
        harness.server.receive_advertisement(advertisements[1])
    shares = harness.share(directory)
    with pytest.raises(ProtocolError, match="already sent"):
        harness.server.receive_shares(shares[2])
    with pytest.raises(ProtocolError, match="out of order"):
        harness.clients[1].share_keys(directory)


def test_server_refuses_incomplete_shares_and_malformed_masked_inputs() -> None:
    config = make_config(4)
    harness = Harness(config)
    harness.advertise()
    directory = harness.server.key_directory()
    shares = {party: client.share_keys(directory) for party, client in harness.clients.items()}
    partial = dataclasses.replace(shares[1], shares=shares[1].shares[:-1])
    with pytest.raises(ProtocolError, match="exactly one share"):
        harness.server.receive_shares(partial)
    for message in shares.values():
        harness.server.receive_shares(message)
    bundles = harness.server.share_bundles()
    masked = harness.clients[1].masked_input(bundles[1], harness.encoded[1].copy())
    with pytest.raises(ProtocolError, match="wrong word size or length"):
        harness.server.receive_masked_input(dataclasses.replace(masked, vector=masked.vector[:-1]))


def test_client_refuses_a_tampered_bundle_and_then_accepts_the_genuine_one() -> None:
    config = make_config(3)
    harness = Harness(config)
    harness.advertise()
    harness.share(harness.server.key_directory())
    bundles = harness.server.share_bundles()
    entry = bundles[1].shares[0]
    flipped = dataclasses.replace(entry, ciphertext=entry.ciphertext[:-1] + bytes([entry.ciphertext[-1] ^ 1]))
    encoded = harness.encoded[1].copy()
    with pytest.raises(AuthenticationError):
        harness.clients[1].masked_input(
            dataclasses.replace(bundles[1], shares=(flipped, *bundles[1].shares[1:])), encoded
        )
    np.testing.assert_array_equal(encoded, harness.encoded[1])  # untouched by the refusal
    with pytest.raises(ProtocolError, match="another party"):
        harness.clients[1].masked_input(bundles[2], encoded)
    harness.clients[1].masked_input(bundles[1], encoded)
    assert not np.array_equal(encoded, harness.encoded[1])  # masked in place


def test_server_never_obtains_both_shares_of_one_party() -> None:
    config = make_config(5)
    harness = Harness(config)
    request = harness.through_masking([1, 2, 3, 4])  # party 5 dropped before masking
    assert (request.survivors, request.dropped) == ((1, 2, 3, 4), (5,))
    client = harness.clients[1]
    response = client.unmask(request)
    assert {r.owner for r in response.seed_shares} == {1, 2, 3, 4}
    assert {r.owner for r in response.key_shares} == {5}
    assert client.unmask(request) == response  # a retransmitted request gets the same answer

    # Now the server claims party 4 dropped too, to get its mask key after its seed.
    greedy = dataclasses.replace(request, survivors=(1, 2, 3), dropped=(4, 5))
    with pytest.raises(UnmaskRefusedError, match="party 4's mask key share after its self-mask seed share"):
        client.unmask(greedy)
    with pytest.raises(UnmaskRefusedError, match="both survivor and dropped"):
        client.unmask(dataclasses.replace(request, dropped=(4, 5)))
    with pytest.raises(UnmaskRefusedError, match="lists this party as dropped"):
        client.unmask(dataclasses.replace(request, survivors=(2, 3, 4), dropped=(1, 5)))
    with pytest.raises(ThresholdError):
        client.unmask(dataclasses.replace(request, survivors=(1, 2), dropped=(5,)))
    # Another party, asked first for party 4's mask key, then refuses its seed.
    other = harness.clients[2]
    other.unmask(dataclasses.replace(request, survivors=(1, 2, 3), dropped=(4, 5)))
    with pytest.raises(UnmaskRefusedError, match="self-mask seed share after its mask key share"):
        other.unmask(request)


def test_server_refuses_unrequested_or_misattributed_shares() -> None:
    config = make_config(5)
    harness = Harness(config)
    request = harness.through_masking([1, 2, 3, 4])
    response = harness.clients[1].unmask(request)
    # Shares of party 5's seed were not asked for (it dropped): refused.
    misfiled = dataclasses.replace(
        response, seed_shares=(*response.seed_shares, *[dataclasses.replace(r, owner=5) for r in response.key_shares])
    )
    with pytest.raises(ProtocolError, match="unrequested"):
        harness.server.receive_unmask_response(misfiled)
    with pytest.raises(ProtocolError, match="another party's x"):
        harness.server.receive_unmask_response(dataclasses.replace(response, sender=2))
    harness.server.receive_unmask_response(response)
    with pytest.raises(ProtocolError, match="already answered"):
        harness.server.receive_unmask_response(response)
    with pytest.raises(ProtocolError, match="not a survivor"):
        harness.server.receive_unmask_response(dataclasses.replace(response, sender=5))
    for party in (2, 3, 4):
        harness.server.receive_unmask_response(harness.clients[party].unmask(request))
    check_result(harness.server.finish(), config, harness.inputs, harness.encoded, {1, 2, 3, 4})


def test_corrupted_key_shares_are_caught_when_rebuilding() -> None:
    config = make_config(3)
    harness = Harness(config)
    request = harness.through_masking([1, 2])
    responses: list[UnmaskResponse] = [harness.clients[party].unmask(request) for party in (1, 2)]
    share = responses[0].key_shares[0]
    corrupted = dataclasses.replace(share, share=share.share[:-1] + bytes([share.share[-1] ^ 1]))
    harness.server.receive_unmask_response(dataclasses.replace(responses[0], key_shares=(corrupted,)))
    harness.server.receive_unmask_response(responses[1])
    with pytest.raises(ProtocolError):
        harness.server.finish()
