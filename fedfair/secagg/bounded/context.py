"""What one bounded secure sum is bound to: the round, every party's bound, the verifiers' keys, the noise.

Every party derives the same :class:`BoundedContext` from the plan and the round, and every signature,
every encryption to the auditor and every verifier message is bound to its :meth:`BoundedContext.digest`,
so nothing said in one round (or under another bound) can be replayed in another.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from functools import cached_property

from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ConfigError, VerificationError, VerifyReason
from fedfair.pki.identity import public_key_bytes
from fedfair.secagg import keys
from fedfair.secagg.bounded.layout import Layout, squared_bound
from fedfair.secagg.codec import Writer


@dataclass(frozen=True)
class BoundedContext:
    """The public parameters of one bounded secure sum, identical at every party.

    federation_id, round, session_id: the round the sum belongs to.
    dimension: d, coordinates of every party's encoded update.
    fractional_bits: f, the fixed point of the encoding (an update coordinate u is about u 2^f).
    bounds: party id -> B^2 in the encoded scale (:func:`squared_bound` of update_norm and its weight).
    aggregator_key, auditor_key: the two verifiers' identity public keys (ECDSA P-256).
    auditor_cipher_key: the auditor's X25519 public key for the round, to which the clients seal its seed.
    noise_mu: the Skellam parameter each verifier adds to its own total (encoded scale); 0 for no noise.
    floor: the fewest accepted inputs a total may cover (the plan's threshold t, which the masked round's secret
        sharing enforces): a total over fewer would show whoever reads it too few sites' sum, at one site its
        input, so the auditor signs none and no site tags one (:meth:`check_floor`).
    """

    federation_id: str
    round: int
    session_id: bytes
    dimension: int
    fractional_bits: int
    bounds: dict[int, int]
    aggregator_key: ec.EllipticCurvePublicKey = field(compare=False)
    auditor_key: ec.EllipticCurvePublicKey = field(compare=False)
    auditor_cipher_key: bytes
    floor: int
    noise_mu: float = 0.0

    def __post_init__(self) -> None:
        if not self.bounds:
            raise ConfigError("a bounded secure sum needs at least one party with a bound")
        if self.floor < 2:
            raise ConfigError(
                f"floor={self.floor}: a bounded total must cover at least 2 inputs, since a total of one is that "
                "input; the plan's threshold sets it (at least max_colluding + 2)"
            )
        if not (math.isfinite(self.noise_mu) and self.noise_mu >= 0):
            raise ConfigError(f"noise_mu={self.noise_mu!r} must be finite and non-negative (0 for no noise)")
        keys.check_public_key(self.auditor_cipher_key)
        for party in sorted(self.bounds):
            self.layout(party)  # refuses a bound the field cannot hold, naming it, before anyone uploads

    @classmethod
    def from_plan(
        cls,
        *,
        federation_id: str,
        round_number: int,
        session_id: bytes,
        dimension: int,
        fractional_bits: int,
        update_norm: float,
        weights: dict[int, float],
        aggregator_key: ec.EllipticCurvePublicKey,
        auditor_key: ec.EllipticCurvePublicKey,
        auditor_cipher_key: bytes,
        floor: int,
        noise_mu: float = 0.0,
    ) -> BoundedContext:
        """The context of a round whose plan bounds party i's update by ``update_norm`` times ``weights[i]``."""
        bounds = {party: squared_bound(update_norm, weight, fractional_bits) for party, weight in weights.items()}
        return cls(
            federation_id,
            round_number,
            session_id,
            dimension,
            fractional_bits,
            bounds,
            aggregator_key,
            auditor_key,
            auditor_cipher_key,
            floor,
            noise_mu,
        )

    @property
    def parties(self) -> tuple[int, ...]:
        """Every party that may upload, in increasing order."""
        return tuple(sorted(self.bounds))

    def layout(self, party: int) -> Layout:
        """The circuit ``party``'s proof is checked against (its own bound).

        Raises:
            ConfigError: ``party`` has no bound in this round.
        """
        if party not in self.bounds:
            raise ConfigError(f"party {party} has no bound in this round; the plan's weights name every party")
        return _layout(self.dimension, self.bounds[party])

    def check_floor(self, accepted: tuple[int, ...], who: str) -> None:
        """Refuse a total over fewer than :attr:`floor` accepted inputs; ``who`` is what refuses it, for the message.

        Raises:
            VerificationError: BELOW_FLOOR, naming the round, how many inputs the total covers, and the floor.
        """
        if len(accepted) < self.floor:
            raise VerificationError(
                self.round,
                VerifyReason.BELOW_FLOOR,
                f"the bounded total covers {len(accepted)} accepted input(s) ({', '.join(map(str, accepted)) or 'none'})"
                f", fewer than the plan's threshold of {self.floor}: whoever reads it would read too few sites' sum "
                f"(one site's is its input), so {who}",
            )

    @cached_property
    def digest(self) -> bytes:
        """SHA-256 of every field's canonical bytes: what every signature and encryption is bound to."""
        writer = Writer().text(self.federation_id).u64(self.round).blob(self.session_id)
        writer.u64(self.dimension).u8(self.fractional_bits).f64(self.noise_mu).u32(self.floor).u32(len(self.bounds))
        for party in self.parties:
            writer.u32(party).blob(self.bounds[party].to_bytes(16, "big"))
        writer.blob(public_key_bytes(self.aggregator_key)).blob(public_key_bytes(self.auditor_key))
        writer.blob(self.auditor_cipher_key)
        return hashlib.sha256(b"fedfair bounded v1 context\x00" + writer.getvalue()).digest()


@functools.lru_cache(maxsize=256)
def _layout(dimension: int, bound_sq: int) -> Layout:
    """One :class:`Layout` per (d, B^2), shared by every context: its derived sizes are computed once."""
    return Layout(dimension, bound_sq)
