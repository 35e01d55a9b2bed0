"""What every party of a bounded secure sum starts from: from the plan, the manifest and the round.

Every party derives the same :class:`BoundedParameters` from the plan, the manifest and the round; the round's
:class:`~fedfair.secagg.bounded.context.BoundedContext` follows once the auditor's round key is known (the
first stage of :data:`~fedfair.secagg.bounded.stages.BOUNDED_ROUND`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ConfigError
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.messages import round_binding
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.round import RoundSetup


@dataclass(frozen=True)
class BoundedParameters:
    """What every party of a bounded secure sum knows before it starts (from the plan, the manifest, the round).

    federation_id, round_number, session_id: the round.
    dimension, fractional_bits, update_norm, weights, noise_mu: as :meth:`BoundedContext.from_plan` takes them
        (weights: site party id -> its influence weight; every site of the round).
    aggregator_key, auditor_key: the two verifiers' identity public keys.
    site_keys: site party id -> its identity public key, which signs its parts.
    floor: the fewest accepted inputs a total may cover (:attr:`BoundedContext.floor`).
    """

    federation_id: str
    round_number: int
    session_id: bytes
    dimension: int
    fractional_bits: int
    update_norm: float
    weights: dict[int, float]
    aggregator_key: ec.EllipticCurvePublicKey = field(compare=False)
    auditor_key: ec.EllipticCurvePublicKey = field(compare=False)
    site_keys: dict[int, ec.EllipticCurvePublicKey] = field(compare=False)
    floor: int
    noise_mu: float = 0.0

    def __post_init__(self) -> None:
        if AUDITOR in self.weights or set(self.site_keys) != set(self.weights):
            raise ConfigError(
                "a bounded sum's sites are the parties with weights, each with its identity key, and none has "
                "the auditor's id: give every site of the round a weight and a key"
            )

    @cached_property
    def binding(self) -> bytes:
        """What the auditor's round key is signed over: this round (:func:`round_binding`)."""
        return round_binding(self.federation_id, self.round_number, self.session_id)

    @property
    def sites(self) -> tuple[int, ...]:
        """Every site of the round, in increasing order."""
        return tuple(sorted(self.weights))

    def context(self, auditor_cipher_key: bytes) -> BoundedContext:
        """The round's context once the auditor's round key is known."""
        return BoundedContext.from_plan(
            federation_id=self.federation_id,
            round_number=self.round_number,
            session_id=self.session_id,
            dimension=self.dimension,
            fractional_bits=self.fractional_bits,
            update_norm=self.update_norm,
            weights=dict(self.weights),
            aggregator_key=self.aggregator_key,
            auditor_key=self.auditor_key,
            auditor_cipher_key=auditor_cipher_key,
            floor=self.floor,
            noise_mu=self.noise_mu,
        )


def round_parameters(config: SecAggConfig, setup: RoundSetup) -> BoundedParameters:
    """The parameters of a round of `config` as every party derives them: the aggregator, the auditor, each site.

    The round's roster, dimension and fixed point are the config's (its encoding's fractional bits), and so is the floor
    on the inputs a total covers: the threshold t the masked round of the same config runs under (:attr:`SecAggConfig.t`,
    from the plan's threshold and max_colluding, which each site checks against its own plan); the session, the
    bound, the weights, the identity keys and the verifiers' noise are the runner's (:class:`RoundSetup`, from the plan, the manifest's
    pins and the certificates relayed with the round's public parameters).

    Raises:
        ConfigError: a party of the roster has no weight or no identity key, or the aggregator or the auditor no key.
    """
    missing = sorted(
        name
        for name in (*config.parties, setup.aggregator, setup.auditor)
        if name not in setup.keys or (name in config.parties and name not in setup.weights)
    )
    if missing or not setup.session:
        raise ConfigError(
            f"a bounded round needs a session, a weight and an identity key for every site, and the aggregator's and "
            f"the auditor's keys; missing for {', '.join(map(repr, missing)) or 'the session'}: the round's parameters "
            "must carry every certificate, and the plan weigh every site"
        )
    sites = {config.party_id(name): name for name in config.parties}
    return BoundedParameters(
        federation_id=config.federation_id,
        round_number=config.round,
        session_id=setup.session,
        dimension=config.dimension,
        fractional_bits=config.encoding.fractional_bits,
        update_norm=setup.update_norm,
        weights={party: float(setup.weights[name]) for party, name in sites.items()},
        aggregator_key=setup.keys[setup.aggregator],
        auditor_key=setup.keys[setup.auditor],
        site_keys={party: setup.keys[name] for party, name in sites.items()},
        floor=config.t,
        noise_mu=setup.noise_mu,
    )
