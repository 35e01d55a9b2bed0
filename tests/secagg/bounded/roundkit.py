"""A bounded secure sum driven step by step, with every key at hand, for tests that tamper between steps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedfair.pki.identity import generate_identity_key
from fedfair.runtime.collaborator.kinds.bounded import lying_witness
from fedfair.secagg import keys
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.exchange import Reveal
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.parameters import BoundedParameters
from fedfair.secagg.bounded.simulate import BoundedTrace, simulate_bounded_round
from fedfair.secagg.bounded.upload import LeaderUpload, SealedSeed, make_uploads
from fedfair.secagg.bounded.verifier import Role
from fedfair.secagg.bounded.verifying import RoundVerifier

liar_witness = lying_witness
"""What a liar can claim (the runtime's liar fault proves with the same witness)."""


def packed_raw(values: list[int] | np.ndarray) -> bytes:
    """52-bit values packed as on the wire without to_wire's check that each is below p: a peer's bad bytes."""
    packed = np.zeros(field.wire_bytes(len(values)) + 8, dtype=np.uint8)
    field.loops().pack(np.asarray(values, dtype=np.uint64), packed)
    return packed[:-8].tobytes()


DIMENSION = 60
FRACTIONAL_BITS = 8
UPDATE_NORM = 1.0


def simulated(inputs: Mapping[int, np.ndarray], weights: Mapping[int, float], **options: Any) -> BoundedTrace:
    """`simulate_bounded_round` of the sites' encoded `inputs` (all of one dimension) at this kit's bits and norm;
    `options` are its faults, witnesses and noise."""
    dimension = len(next(iter(inputs.values())))
    return simulate_bounded_round(
        dimension=dimension,
        fractional_bits=FRACTIONAL_BITS,
        update_norm=UPDATE_NORM,
        weights=weights,
        encoded_input=inputs.__getitem__,
        **options,
    )


def bounded_parameters(
    sites: tuple[int, ...], round_number: int = 1
) -> tuple[BoundedParameters, dict[int, ec.EllipticCurvePrivateKey], ec.EllipticCurvePrivateKey]:
    """A round of `sites` of weight 1: its parameters, the identity keys of the sites and the auditor (under
    AUDITOR), and the aggregator's."""
    private = {party: generate_identity_key() for party in (AUDITOR, *sites)}
    aggregator = generate_identity_key()
    parameters = BoundedParameters(
        federation_id="f",
        round_number=round_number,
        session_id=b"s" * 16,
        dimension=DIMENSION,
        fractional_bits=FRACTIONAL_BITS,
        update_norm=UPDATE_NORM,
        weights=dict.fromkeys(sites, 1.0),
        aggregator_key=aggregator.public_key(),
        auditor_key=private[AUDITOR].public_key(),
        site_keys={party: private[party].public_key() for party in sites},
        floor=2,
    )
    return parameters, private, aggregator


def vector_at(norm: float, dimension: int, seed: int) -> np.ndarray:
    """A random direction scaled to ``norm``."""
    direction = np.random.default_rng(seed).normal(size=dimension)
    return direction * (norm / np.linalg.norm(direction))


def over_bound(context: BoundedContext, party: int, factor: float, seed: int) -> np.ndarray:
    """An encoded update ``factor`` times ``party``'s bound (rounded to nearest; a liar does not clip)."""
    bound = np.sqrt(context.bounds[party])
    return np.round(vector_at(factor * bound, context.dimension, seed)).astype(np.int64)


@dataclass
class Round:
    """A context, every key, and the two verifiers, before any upload."""

    context: BoundedContext
    site_keys: dict[int, ec.EllipticCurvePrivateKey]
    aggregator_key: ec.EllipticCurvePrivateKey
    auditor_key: ec.EllipticCurvePrivateKey
    auditor_cipher: X25519PrivateKey
    leader: RoundVerifier
    helper: RoundVerifier

    def upload(self, party: int, encoded: np.ndarray, liar: bool = False) -> tuple[LeaderUpload, SealedSeed]:
        """``party``'s two parts (a liar proves with :func:`liar_witness`)."""
        if liar:
            return make_uploads(self.context, party, self.site_keys[party], encoded, liar_witness)[:2]
        return make_uploads(self.context, party, self.site_keys[party], encoded)[:2]

    def exchange_until_reveal(self) -> tuple[Reveal, Reveal]:
        """Close the uploads and run VERIFY up to the reveals: (the aggregator's, the auditor's)."""
        rosters = self.leader.close_uploads(), self.helper.close_uploads()
        halves = self.leader.receive_roster(rosters[1]), self.helper.receive_roster(rosters[0])
        commitments = self.leader.receive_seed(halves[1]), self.helper.receive_seed(halves[0])
        return self.leader.receive_commitments(commitments[1]), self.helper.receive_commitments(commitments[0])


def new_round(weights: dict[int, float], noise_mu: float = 0.0, dimension: int = DIMENSION) -> Round:
    """Fresh keys, the round's context, and both verifiers."""
    site_keys = {party: generate_identity_key() for party in weights}
    aggregator_key, auditor_key = generate_identity_key(), generate_identity_key()
    cipher = keys.generate_key_pair()
    context = BoundedContext.from_plan(
        federation_id="test",
        round_number=3,
        session_id=b"session",
        dimension=dimension,
        fractional_bits=FRACTIONAL_BITS,
        update_norm=UPDATE_NORM,
        weights=weights,
        aggregator_key=aggregator_key.public_key(),
        auditor_key=auditor_key.public_key(),
        auditor_cipher_key=keys.public_bytes(cipher),
        floor=2,
        noise_mu=noise_mu,
    )
    public = {party: key.public_key() for party, key in site_keys.items()}
    return Round(
        context,
        site_keys,
        aggregator_key,
        auditor_key,
        cipher,
        RoundVerifier(context, Role.LEADER, aggregator_key, public),
        RoundVerifier(context, Role.HELPER, auditor_key, public, cipher),
    )
