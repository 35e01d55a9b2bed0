"""Secure aggregation in process.

Each round's updates summed through the real masking protocol, optionally with distributed DP noise added inside
the sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedfair.core import server
from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.core.update import Update
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.distributed import TrainingNoise, party_mu
from fedfair.privacy.ring import Ring
from fedfair.privacy.calibration import distributed_training_noise, threshold_clip
from fedfair.secagg import Decoded, EncodingConfig, SecAggConfig, simulate_round
from fedfair.secagg.encode import noised_encoding
from fedfair.secagg.recovery import check_range


@dataclass(frozen=True)
class DistributedDP:
    """What the secure sum needs to noise DP-SGD rounds, all of it public plan data.

    privacy: the collaborators' settings (mode "distributed": target epsilon, delta, clip bounds).
    local: the local step sizes, which set one record's sensitivity.
    objective: the RCVaR objective (c's natural clip bound), None for FedAvg (no c).
    sample_rate: the largest collaborator's Poisson rate b_k / n_k: the noise meets every collaborator's
        target (each one's own accounting, at its own rate, is then an upper bound).
    rounds: the planned rounds (one step each).
    colluders: how many collaborators may collude with the aggregator; the other survivors carry the noise.
    weight_per_record: the largest w_k / b_k of the sums' weights, which scales one record's sensitivity
        (:func:`fedfair.privacy.calibration.record_sensitivity`).
    """

    privacy: PrivacyConfig
    local: LocalConfig
    objective: ObjectiveConfig | None
    sample_rate: float
    rounds: int
    colluders: int = 0
    weight_per_record: float = 1.0

    def __post_init__(self) -> None:
        if self.privacy.mode != "distributed" or not self.privacy.enabled:
            raise ConfigError("distributed noise needs privacy enabled with mode = distributed")

    def noise(self, dimension: int, ring: Ring | None = None) -> TrainingNoise:
        """The calibrated noise for updates of ``dimension`` coordinates (what every collaborator derives).

        With ``ring``, at fractional bits that keep the sum within its words.
        """
        objective = self.objective
        threshold = None if objective is None else threshold_clip(self.privacy, objective.epsilon, objective.rho)
        return distributed_training_noise(
            self.privacy,
            self.local.lr,
            self.local.threshold_lr,
            threshold,
            self.sample_rate,
            self.rounds,
            dimension,
            self.weight_per_record,
            ring,
        )


class SecureSum:
    """Sums each round's updates through the real secure-aggregation protocol, in process.

    Every collaborator encodes [w * delta, w * delta_c] (followed by w * control with
    drift correction) and w, masks it, and the server recovers only the sum, exactly as in a
    deployment but without the network; the decoded sum differs from the plain one by at most
    `error_bounds[r]` per coordinate.

    With `distributed`, every collaborator also rotates, rounds and adds its Skellam share
    (`fedfair.secagg.noise`): mu / (n - colluders) each for the calibrated total mu, so the honest
    survivors alone carry it (every collaborator survives here, so the decoded sum carries
    n / (n - colluders) times it: `noise_excess`). `noise_stds[r]` is round r's noise standard deviation
    per coordinate of the decoded weighted sum.

    `masked` False adds the encodings directly instead of running the masking protocol: the masks
    cancel exactly modulo 2^k, so the decoded sum is the same for the same encodings (a test holds
    this); for utility sweeps over many collaborators, where the protocol's key agreement and secret
    sharing dominate (two seconds a round for 51 parties).
    """

    def __init__(
        self,
        encoding: EncodingConfig,
        federation_id: str = "simulation",
        distributed: DistributedDP | None = None,
        *,
        masked: bool = True,
    ) -> None:
        self.encoding = encoding
        self.masked = masked
        self.federation_id = federation_id
        self.distributed = distributed
        self.error_bounds: list[float] = []
        self.noise_stds: list[float] = []
        self.training_noise: TrainingNoise | None = None

    def __call__(self, updates: list[Update]) -> server.Aggregate:
        """The next round's sum of `updates` (weighted, with their control variates if any), as decoded.

        Each call is one round: it appends the round's `error_bounds` and `noise_stds` entries.
        """
        vectors = [update.weighted_vector().numpy() for update in updates]
        round_number = len(self.error_bounds) + 1
        parties = len(updates)
        encoding = self._round_encoding(round_number, vectors[0].size, parties)
        config = SecAggConfig(
            federation_id=self.federation_id,
            round=round_number,
            parties=tuple(f"collaborator-{index}" for index in range(parties)),
            # A rotated encoding is padded to a power of two.
            dimension=vectors[0].size if encoding.noise is None else encoding.noise.encoded_dimension,
            encoding=encoding,
            max_colluding=0 if self.distributed is None else self.distributed.colluders,
        )
        decoded = self._sum(config, vectors, [update.weight for update in updates])
        self.error_bounds.append(decoded.error_bound)
        self.noise_stds.append(decoded.noise_std)
        # Drift-corrected updates carry their control variates in the same masked vector.
        with_control = updates[0].control is not None
        weighted_sum = torch.from_numpy(decoded.weighted_sum.copy())
        return server.Aggregate.from_vector(weighted_sum, decoded.total_weight, with_control=with_control)

    def _sum(self, config: SecAggConfig, vectors: list[np.ndarray], weights: list[float]) -> Decoded:
        """The decoded sum of every party's encoding: through the masking protocol, or added directly."""
        encoder = config.encoder

        def encoded(party: int) -> np.ndarray:
            return encoder.encode(vectors[party - 1], weights[party - 1])

        if self.masked:
            return simulate_round(config, encoded).result.decoded
        total = np.zeros(config.dimension + 1, dtype=encoder.dtype)
        for party in range(1, len(vectors) + 1):
            total += encoded(party)
        decoded = encoder.decode(total, len(vectors))
        check_range(decoded, len(vectors), config.encoding)  # as the server checks a masked sum
        return decoded

    def _round_encoding(self, round_number: int, dimension: int, parties: int) -> EncodingConfig:
        """This round's encoding.

        The plain one, or with distributed DP the noise step (the noise calibrated once, its fractional bits,
        each party's share, a rotation keyed by the round).
        """
        if self.distributed is None:
            return self.encoding
        if self.training_noise is None:
            colluders = self.distributed.colluders
            # In expected batch records, as the encoder's projection radius counts them.
            per_record = self.distributed.weight_per_record
            weights = tuple(weight / per_record for weight in self.encoding.weights)
            honest = max(1, parties - colluders)
            ring = Ring(self.encoding.modulus_bits, parties, honest, self.encoding.max_weight / per_record, weights)
            self.training_noise = self.distributed.noise(dimension, ring)
        share = party_mu(self.training_noise.release.mu, parties, self.distributed.colluders)
        return noised_encoding(self.encoding, self.training_noise, share, self.federation_id, round_number, dimension)
