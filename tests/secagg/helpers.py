"""What the secure-aggregation tests share: configurations, seeded inputs and their encodings, the
check of a round's result, and a harness that drives one round by hand, stage by stage."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.pki.identity import (
    generate_identity_key,
    pinned_verifier,
    public_key_bytes,
)
from fedfair.secagg.client import Client
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig, largest_safe_fractional_bits
from fedfair.secagg.messages import (
    AdvertiseKeys,
    ConsistencySignature,
    KeyDirectory,
    MaskedInput,
    MaskingSet,
    ShareBundle,
    ShareCheck,
    ShareKeys,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
)
from fedfair.secagg.round import StageSpec
from fedfair.secagg.round_order import PartyOrder, ServerOrder
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.security import SecurityParameters
from fedfair.secagg.server import AggregateResult, Server

DIMENSION = 24
CLIP, MAX_WEIGHT = 1.0, 10.0


def make_config(
    parties: int,
    round_number: int = 0,
    neighbours: int | None = None,
    modulus_bits: int = 32,
    dimension: int = DIMENSION,
    max_colluding: int = 0,
    threshold: int | None = None,
) -> SecAggConfig:
    # 16-bit words hold the range only at the finest step that still fits.
    bits = 16 if modulus_bits > 16 else largest_safe_fractional_bits(CLIP, modulus_bits, parties, MAX_WEIGHT)
    encoding = EncodingConfig(CLIP, MAX_WEIGHT, fractional_bits=bits, modulus_bits=modulus_bits)
    names = tuple(f"site-{i}" for i in range(1, parties + 1))
    return SecAggConfig(
        "test-federation",
        round_number,
        names,
        dimension,
        encoding,
        SecurityParameters(max_colluding, threshold, neighbours),
    )


def make_inputs(config: SecAggConfig, seed: int = 0) -> dict[int, tuple[np.ndarray, float]]:
    """Test data (numpy's generator is fine here: it never touches a key or a mask)."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for party in range(1, config.size + 1):
        weight = float(rng.uniform(0.5, config.encoding.max_weight))
        inputs[party] = (weight * rng.uniform(-config.encoding.clip, config.encoding.clip, config.dimension), weight)
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
    """One round's parties and server, with pinned identity keys, driven stage by stage.

    Each step runs the given parties' client step (all parties by default) and hands every
    message to the server, returning the messages so tests can tamper with or replay them.
    """

    def __init__(
        self,
        config: SecAggConfig,
        identities: dict[str, ec.EllipticCurvePrivateKey] | None = None,
        *,
        verified: bool = False,
    ) -> None:
        self.config = config
        self.identities = identities or {name: generate_identity_key() for name in config.parties}
        self.verify = pinned_verifier({name: key.public_key() for name, key in self.identities.items()})
        self.clients = {
            config.party_id(name): Client(config, name, key, public_key_bytes(key), self.verify, verified=verified)
            for name, key in self.identities.items()
        }
        self.server = Server(config, self.verify)
        self.inputs = make_inputs(config)
        self.encoded = encode_all(config, self.inputs)
        self.directory: KeyDirectory | None = None

    def key(self, party: int) -> ec.EllipticCurvePrivateKey:
        """A party's identity private key (what a colluding party hands the aggregator)."""
        return self.identities[self.config.name_of(party)]

    def _parties(self, parties: Iterable[int] | None) -> list[int]:
        return sorted(self.clients if parties is None else parties)

    def advertise(self, parties: Iterable[int] | None = None) -> dict[int, AdvertiseKeys]:
        advertisements = {party: self.clients[party].advertise() for party in self._parties(parties)}
        for advertisement in advertisements.values():
            self.server.receive_advertisement(advertisement)
        return advertisements

    def share(self, directory: KeyDirectory, parties: Iterable[int] | None = None) -> dict[int, ShareKeys]:
        shares = {party: self.clients[party].share_keys(directory) for party in self._parties(parties)}
        for message in shares.values():
            self.server.receive_shares(message)
        return shares

    def check(self, bundles: dict[int, ShareBundle], parties: Iterable[int] | None = None) -> dict[int, ShareCheck]:
        chosen = self._parties(parties or bundles)
        checks = {party: self.clients[party].check_shares(bundles[party]) for party in chosen}
        for message in checks.values():
            self.server.receive_share_check(message)
        return checks

    def mask(self, masking_set: MaskingSet, parties: Iterable[int]) -> dict[int, MaskedInput]:
        masked = {
            party: self.clients[party].masked_input(masking_set, self.encoded[party].copy())
            for party in self._parties(parties)
        }
        for message in masked.values():
            self.server.receive_masked_input(message)
        return masked

    def sign(self, survivor_set: SurvivorSet, parties: Iterable[int] | None = None) -> dict[int, ConsistencySignature]:
        chosen = survivor_set.survivors if parties is None else parties
        signatures = {party: self.clients[party].consistency(survivor_set) for party in self._parties(chosen)}
        for message in signatures.values():
            self.server.receive_consistency(message)
        return signatures

    def unmask(self, request: UnmaskRequest, parties: Iterable[int] | None = None) -> dict[int, UnmaskResponse]:
        chosen = request.survivors if parties is None else parties
        responses = {party: self.clients[party].unmask(request) for party in self._parties(chosen)}
        for message in responses.values():
            self.server.receive_unmask_response(message)
        return responses

    def through_check(self) -> MaskingSet:
        """ADVERTISE, SHARE and CHECK by everyone; the masking set (the key directory is kept)."""
        self.advertise()
        self.directory = self.server.key_directory()
        self.share(self.directory)
        self.check(self.server.share_bundles())
        return self.server.masking_set()

    def through_masking(self, maskers: list[int]) -> SurvivorSet:
        """Everyone up to CHECK, then ``maskers`` mask; the survivor set."""
        self.mask(self.through_check(), maskers)
        return self.server.survivor_set()

    def through_consistency(self, maskers: list[int], signers: list[int] | None = None) -> UnmaskRequest:
        """Up to MASK, then ``signers`` (default: every survivor) sign; the unmask request."""
        self.sign(self.through_masking(maskers), signers)
        return self.server.unmask_request()


def order_at(spec: StageSpec, verified: bool = False) -> ServerOrder:
    """A server's order of SECURE_ROUND with every stage before `spec` closed (each close a no-op): `spec` open.

    For a test that drove the server itself to `spec` and checks what its runner refuses from there on.
    """
    order = ServerOrder(SECURE_ROUND, verified)
    order.begin()
    for earlier in SECURE_ROUND.stages(verified):
        if earlier is spec:
            return order
        if earlier is SECURE_ROUND.sum_stages[-1]:
            order.close(earlier, lambda: None)
            order.verify()
        else:
            order.close(earlier, lambda: None)
    raise AssertionError(f"{spec.wire} is not a stage of the round")


def party_order_at(spec: StageSpec) -> PartyOrder:
    """A party's order of a verified SECURE_ROUND with every stage before `spec` taken (each step a no-op).

    For a test whose party the harness drove to `spec` itself, handed to a runner that takes its steps in order.
    """
    stages = SECURE_ROUND.stages(True)
    order = PartyOrder(stages)
    for earlier in stages[: stages.index(spec)]:
        order.take(earlier, lambda: None)
    return order


def view_table(rows: list[tuple[str, str, str, str]]) -> str:
    """A view audit's "Who reads what" table for docs/security.md: a header and one line per role, indented
    under its bullet."""
    header = [("role", "holds", "subtracts", "left on what it reads"), ("---", "---", "---", "---")]
    return "\n".join("  | " + " | ".join(row) + " |" for row in header + rows) + "\n"
