"""What the secure-aggregation tests share: configurations, seeded inputs and their encodings, the
check of a round's result, and a harness that drives one round by hand."""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.pki.identity import (
    generate_identity_key,
    pinned_verifier,
    public_key_bytes,
)
from fedfair.secagg.client import Client
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig
from fedfair.secagg.messages import (
    AdvertiseKeys,
    KeyDirectory,
    MaskedInput,
    ShareBundle,
    ShareKeys,
    UnmaskRequest,
)
from fedfair.secagg.server import AggregateResult, Server

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
