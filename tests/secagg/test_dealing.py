"""One signature per dealer: a party signs all its share entries at once (its dealing), the server and each
holder verify it once, and every check the per-entry signatures made still names the right party."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator

import pytest

from fedfair.core.errors import AuthenticationError, ProtocolError
from fedfair.pki import identity
from fedfair.secagg import shamir
from fedfair.secagg.messages import ShareBundle
from fedfair.secagg.shares import Kind
from tests.secagg.helpers import Harness, check_result, make_config
from tests.secagg.test_active import corrupt, signed_dealing

LIAR = 2


def finish_without(harness: Harness, excluded: int) -> None:
    """Close CHECK and run the round to its end without ``excluded``; the sum must be everyone else's."""
    masking_set = harness.server.masking_set()
    assert excluded not in masking_set.parties
    others = [party for party in harness.clients if party != excluded]
    harness.mask(masking_set, others)
    harness.sign(harness.server.survivor_set())
    harness.unmask(harness.server.unmask_request())
    check_result(harness.server.finish(), harness.config, harness.inputs, harness.encoded, set(others))


def shared(harness: Harness) -> dict[int, ShareBundle]:
    harness.advertise()
    harness.share(harness.server.key_directory())
    return harness.server.share_bundles()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How many signatures the parties make and verify in SHARE and CHECK, and the server verifies there."""
    counts: Counter[str] = Counter()

    def counting(name: str, function: object) -> object:
        def wrapper(*args: object) -> object:
            counts[name] += 1
            return function(*args)  # type: ignore[operator]

        return wrapper

    verify = identity.is_valid_signature
    monkeypatch.setattr("fedfair.secagg.client.sign", counting("party signs", identity.sign))
    monkeypatch.setattr("fedfair.secagg.shares.is_valid_signature", counting("party verifies", verify))
    monkeypatch.setattr("fedfair.secagg.server.is_valid_signature", counting("server verifies", verify))
    yield counts


def test_each_dealer_signs_once_and_everyone_verifies_each_dealing_once(counted: Counter[str]) -> None:
    harness = Harness(make_config(6))
    harness.advertise()
    directory = harness.server.key_directory()
    counted.clear()  # the advertisements' signatures are not the dealings'
    harness.share(directory)
    harness.check(harness.server.share_bundles())
    # Per party: one dealing and one share check signed; five peers' dealings verified. The server
    # verifies six dealings and six share checks.
    assert counted == {"party signs": 6 * 2, "party verifies": 6 * 5, "server verifies": 6 + 6}


def test_a_tampered_ciphertext_under_a_valid_dealing_gets_its_sender_accused() -> None:
    harness = Harness(make_config(5))
    bundles = shared(harness)
    for recipient in (1, 3, 4, 5):
        entries = tuple(
            dataclasses.replace(entry, ciphertext=entry.ciphertext[:-1] + bytes([entry.ciphertext[-1] ^ 1]))
            if entry.sender == LIAR
            else entry
            for entry in bundles[recipient].shares
        )
        bundles[recipient] = dataclasses.replace(bundles[recipient], shares=entries)
    checks = harness.check(bundles)
    assert all(checks[party].accused == (LIAR,) for party in (1, 3, 4, 5))
    assert harness.clients[1].accusations[LIAR] == "its share entry does not match its signed dealing"
    finish_without(harness, LIAR)


def test_a_dealing_with_a_bad_signature_is_refused_by_the_server_and_accused_by_its_holders() -> None:
    harness = Harness(make_config(5))
    harness.advertise()
    directory = harness.server.key_directory()
    message = harness.clients[LIAR].share_keys(directory)
    forged = dataclasses.replace(message, signature=message.signature[:-1] + bytes([message.signature[-1] ^ 1]))
    with pytest.raises(AuthenticationError, match=f"party {LIAR}'s share entries are not signed by it"):
        harness.server.receive_shares(forged)
    # A dealing signed over other entries than the ones sent is refused alike.
    reordered = dataclasses.replace(message, shares=message.shares[::-1])
    with pytest.raises(ProtocolError, match="in order"):
        harness.server.receive_shares(reordered)
    harness.server.receive_shares(message)
    harness.share(directory, [1, 3, 4, 5])
    bundles = harness.server.share_bundles()
    # Relayed with a dealing whose signature fails, the entry gets its sender accused (the server may have
    # lied, so the sender is accused, never proven guilty).
    bundles[1] = dataclasses.replace(
        bundles[1],
        dealings=tuple(
            dataclasses.replace(dealing, signature=forged.signature) if dealing.dealer == LIAR else dealing
            for dealing in bundles[1].dealings
        ),
    )
    harness.check(bundles)
    assert harness.clients[1].accusations == {LIAR: "its dealing's signature does not verify"}
    finish_without(harness, LIAR)
    assert harness.server.accusations == {LIAR: (1,)}
    assert LIAR not in harness.server.proven


def test_a_server_that_alters_a_relayed_dealing_only_gets_the_sender_accused_never_proven() -> None:
    harness = Harness(make_config(5))
    bundles = shared(harness)
    # The server swaps the commitments in party 2's line for party 1: the dealing no longer covers it.
    entries = tuple(
        dataclasses.replace(entry, seed_commitment=entry.key_commitment, key_commitment=entry.seed_commitment)
        if entry.sender == LIAR
        else entry
        for entry in bundles[1].shares
    )
    bundles[1] = dataclasses.replace(bundles[1], shares=entries)
    harness.check(bundles)
    assert harness.clients[1].accusations == {LIAR: "its share entry does not match its signed dealing"}
    finish_without(harness, LIAR)
    assert LIAR not in harness.server.proven
    assert set(harness.server.culprits) == {LIAR}


def test_a_dealer_that_seals_other_shares_than_it_committed_to_is_accused_by_the_holder() -> None:
    # Party 2 commits to one pair of shares for party 1 and seals another: party 1 finds out at CHECK, so
    # it never holds a share whose reveal would name it.
    harness = Harness(make_config(5))
    harness.advertise()
    directory = harness.server.key_directory()
    for party, client in harness.clients.items():
        message = client.share_keys(directory)
        if party == LIAR:
            shares = tuple(
                dataclasses.replace(entry, seed_commitment=bytes(32)) if entry.recipient == 1 else entry
                for entry in message.shares
            )
            message = signed_dealing(harness, dataclasses.replace(message, shares=shares))
        harness.server.receive_shares(message)
    harness.check(harness.server.share_bundles())
    assert harness.clients[1].accusations == {LIAR: "its shares do not match the commitments in its signed dealing"}
    finish_without(harness, LIAR)


def test_a_revealed_share_that_is_not_the_dealt_one_names_its_holder_even_when_it_is_well_formed() -> None:
    # Party 1 reveals, as its share of party 4's seed, a share of party 4's seed at its own x that lies on
    # another polynomial than the dealt one: well formed, but not what party 4's dealing commits to.
    config = make_config(5)
    harness = Harness(config)
    request = harness.through_consistency([1, 2, 3, 4, 5])
    held = harness.clients[1]._held[4]
    other = shamir.split(b"\x07" * 32, config.t, range(1, 6))[1].to_bytes()
    assert Kind.SEED.commitment(harness.server.session_id, 4, 1, other) != Kind.SEED.commitment(
        harness.server.session_id, 4, 1, held.seed
    )
    for party in (1, 2, 3, 4, 5):
        response = harness.clients[party].unmask(request)
        harness.server.receive_unmask_response(corrupt(response, 4, other) if party == 1 else response)
    result = harness.server.finish()
    check_result(result, config, harness.inputs, harness.encoded, {1, 2, 3, 4, 5})
    assert list(result.culprits) == [1]
    assert "does not match the dealer's signed dealing" in result.culprits[1]
