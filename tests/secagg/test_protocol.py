"""The secure-aggregation protocol end to end: recovery through dropouts, and every refusal."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from scipy import stats

from fedfair.pki.identity import (
    generate_identity_key,
    pinned_verifier,
    public_key_bytes,
    sign,
)
from fedfair.secagg import keys
from fedfair.secagg.client import Client
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig
from fedfair.secagg.errors import (
    AuthenticationError,
    PrivacyWarning,
    ProtocolError,
    StaleMessageError,
    ThresholdError,
    UnmaskRefusedError,
)
from fedfair.secagg.messages import (
    AdvertiseKeys,
    KeyDirectory,
    MaskedInput,
    Message,
    ShareBundle,
    ShareKeys,
    Stage,
    UnmaskRequest,
    UnmaskResponse,
    advertisement_payload,
)
from fedfair.secagg.server import AggregateResult, Server
from fedfair.secagg.simulate import simulate_round

DIMENSION = 24
CLIP, MAX_WEIGHT = 1.0, 10.0


def make_config(
    parties: int,
    round_number: int = 0,
    neighbours: int | None = None,
    modulus_bits: int = 32,
    dimension: int = DIMENSION,
) -> SecAggConfig:
    encoding = EncodingConfig(CLIP, MAX_WEIGHT, fractional_bits=16, modulus_bits=modulus_bits)
    names = tuple(f"site-{i}" for i in range(1, parties + 1))
    return SecAggConfig("test-federation", round_number, names, dimension, encoding, neighbours=neighbours)


def make_inputs(config: SecAggConfig, seed: int = 0) -> dict[int, tuple[np.ndarray, float]]:
    """Test data (numpy's generator is fine here: it never touches a key or a mask)."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for party in range(1, config.size + 1):
        weight = float(rng.uniform(0.5, MAX_WEIGHT))
        inputs[party] = (weight * rng.uniform(-CLIP, CLIP, config.dimension), weight)
    return inputs


def encode_all(config: SecAggConfig, inputs: dict[int, tuple[np.ndarray, float]]) -> dict[int, np.ndarray]:
    return {
        party: config.encoder.encode(vector, weight, randomness_key=bytes([party]) * 32)
        for party, (vector, weight) in inputs.items()
    }


def check_result(
    result: AggregateResult,
    config: SecAggConfig,
    inputs: dict[int, tuple[np.ndarray, float]],
    encoded: dict[int, np.ndarray],
    contributors: set[int],
) -> None:
    """Bit-exact in the encoded domain, within the derived bound after decoding."""
    assert set(result.contributors) == contributors
    expected = np.zeros(config.dimension + 1, dtype=config.encoder.dtype)
    for party in contributors:
        expected += encoded[party]
    np.testing.assert_array_equal(result.encoded_sum, expected)
    plain_sum = sum(inputs[party][0] for party in contributors)
    plain_weight = sum(inputs[party][1] for party in contributors)
    bound = result.decoded.error_bound
    assert bound == len(contributors) * 2.0**-config.encoding.fractional_bits
    assert np.max(np.abs(result.decoded.weighted_sum - plain_sum)) <= bound + 1e-12
    assert abs(result.decoded.total_weight - plain_weight) <= bound + 1e-12


def run(
    config: SecAggConfig,
    drop: dict[Stage, list[int]] | None = None,
    seed: int = 0,
    observe: object = None,
) -> tuple[AggregateResult, dict[int, tuple[np.ndarray, float]], dict[int, np.ndarray]]:
    inputs = make_inputs(config, seed)
    encoded = encode_all(config, inputs)
    # Masking happens in place, so every party gets a copy and the originals stay plain.
    trace = simulate_round(config, lambda party: encoded[party].copy(), drop, observe)  # type: ignore[arg-type]
    return trace.result, inputs, encoded


def dropout_cases() -> list[object]:
    """(n, stage, how many drop) for every stage and every count from 1 to n - t."""
    return [
        pytest.param(parties, stage, count, id=f"n{parties}-{stage.name}-{count}")
        for parties in (3, 5, 10)
        for stage in Stage
        for count in range(1, parties - (parties // 2 + 1) + 1)
    ]


def test_no_dropout_recovers_the_sum_exactly() -> None:
    for parties in (3, 5, 10):
        config = make_config(parties)
        result, inputs, encoded = run(config)
        check_result(result, config, inputs, encoded, set(range(1, parties + 1)))
        assert all(not dropped for dropped in result.dropped.values())


@pytest.mark.parametrize(("parties", "stage", "count"), dropout_cases())
def test_dropouts_at_every_stage_up_to_n_minus_t(parties: int, stage: Stage, count: int) -> None:
    config = make_config(parties)
    dropped = list(range(2, 2 + count))
    result, inputs, encoded = run(config, {stage: dropped}, seed=parties * 10 + count)
    everyone = set(range(1, parties + 1))
    # Parties that leave after masking are still in the sum; earlier leavers are not.
    contributors = everyone if stage is Stage.UNMASK else everyone - set(dropped)
    check_result(result, config, inputs, encoded, contributors)
    assert result.dropped[stage] == tuple(dropped)


@pytest.mark.parametrize("parties", [5, 10])
def test_dropouts_spread_over_all_stages(parties: int) -> None:
    config = make_config(parties)
    spare = parties - config.t
    stages = list(itertools.islice(itertools.cycle(Stage), spare))
    drop: dict[Stage, list[int]] = {}
    for party, stage in zip(range(parties, 0, -1), stages, strict=False):
        drop.setdefault(stage, []).append(party)
    result, inputs, encoded = run(config, drop)
    gone_before_masking = {p for stage, ps in drop.items() if stage is not Stage.UNMASK for p in ps}
    check_result(result, config, inputs, encoded, set(range(1, parties + 1)) - gone_before_masking)


@pytest.mark.parametrize("stage", list(Stage))
def test_below_threshold_aborts_cleanly(stage: Stage) -> None:
    config = make_config(5)
    too_many = list(range(1, 5 - config.t + 2))
    with pytest.raises(ThresholdError, match="below the threshold"):
        run(config, {stage: too_many})


def test_an_aborted_round_refuses_everything_after() -> None:
    config = make_config(3)
    server = Harness(config).server
    with pytest.raises(ThresholdError, match="round aborted"):
        server.key_directory()
    with pytest.raises(ProtocolError, match="aborted"):
        server.share_bundles()


@pytest.mark.parametrize("modulus_bits", [32, 64])
def test_secagg_plus_graph_recovers_the_sum_through_dropouts(modulus_bits: int) -> None:
    config = make_config(10, neighbours=4, modulus_bits=modulus_bits)
    assert config.t == 3
    drop = {Stage.MASK: [4], Stage.UNMASK: [7]}
    result, inputs, encoded = run(config, drop)
    check_result(result, config, inputs, encoded, set(range(1, 11)) - {4})


def test_secagg_plus_parties_share_only_with_their_neighbours() -> None:
    config = make_config(10, neighbours=4)
    recipients: dict[int, set[int]] = {}

    def observe(message: Message) -> None:
        if isinstance(message, ShareKeys):
            recipients[message.sender] = {entry.recipient for entry in message.shares}

    run(config, observe=observe)
    assert recipients == {party: set(config.graph[party]) for party in range(1, 11)}


def test_two_parties_warn_and_still_aggregate() -> None:
    with pytest.warns(PrivacyWarning):
        config = make_config(2)
    result, inputs, encoded = run(config)
    check_result(result, config, inputs, encoded, {1, 2})


@pytest.mark.parametrize("modulus_bits", [32, 64])
def test_masked_inputs_look_uniform(modulus_bits: int) -> None:
    # All-zero inputs: whatever structure the server could see would come from the masks.
    config = make_config(4, modulus_bits=modulus_bits, dimension=1 << 14)
    masked: list[np.ndarray] = []

    def observe(message: Message) -> None:
        if isinstance(message, MaskedInput):
            masked.append(np.array(message.vector))

    zeros = config.encoder.encode(np.zeros(config.dimension), 0.0)
    simulate_round(config, lambda party: zeros.copy(), observe=observe)
    assert len(masked) == 4
    shift = masked[0].dtype.type(modulus_bits - 8)
    for vector in masked:
        # Top byte and bottom byte, 256 bins each. A false alarm has probability 1e-6 per check.
        for byte in (vector >> shift, vector & vector.dtype.type(0xFF)):
            counts = np.bincount(byte.astype(np.int64), minlength=256)
            assert stats.chisquare(counts).pvalue > 1e-6
    assert not np.array_equal(masked[0], masked[1])


# ---------------------------------------------------------------------------------------------
# Driving the state machines by hand, for the attacks.


class Harness:
    """One round's parties and server, with pinned identity keys, driven stage by stage."""

    def __init__(self, config: SecAggConfig, identities: dict[str, ec.EllipticCurvePrivateKey] | None = None) -> None:
        self.config = config
        self.identities = identities or {name: generate_identity_key() for name in config.parties}
        self.verify = pinned_verifier({name: key.public_key() for name, key in self.identities.items()})
        self.clients = {
            config.party_id(name): Client(config, name, key, public_key_bytes(key), self.verify)
            for name, key in self.identities.items()
        }
        self.server = Server(config, self.verify)
        self.inputs = make_inputs(config)
        self.encoded = encode_all(config, self.inputs)

    def advertise(self) -> dict[int, AdvertiseKeys]:
        advertisements = {party: client.advertise() for party, client in self.clients.items()}
        for advertisement in advertisements.values():
            self.server.receive_advertisement(advertisement)
        return advertisements

    def share(self, directory: KeyDirectory) -> dict[int, ShareKeys]:
        shares = {party: client.share_keys(directory) for party, client in self.clients.items()}
        for message in shares.values():
            self.server.receive_shares(message)
        return shares

    def mask(self, bundles: dict[int, ShareBundle], parties: list[int]) -> dict[int, MaskedInput]:
        masked = {
            party: self.clients[party].masked_input(bundles[party], self.encoded[party].copy()) for party in parties
        }
        for message in masked.values():
            self.server.receive_masked_input(message)
        return masked

    def through_masking(self, maskers: list[int]) -> UnmaskRequest:
        self.advertise()
        self.share(self.server.key_directory())
        self.mask(self.server.share_bundles(), maskers)
        return self.server.unmask_request()


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
