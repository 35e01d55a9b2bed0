"""Secure aggregation in process.

Each round's updates summed through the real masking protocol, optionally with distributed DP noise added inside
the sum.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from fedfair.core import server
from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.errors import ConfigError
from fedfair.core.update import Update
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.distributed import Release, TrainingNoise, honest_parties, noise_excess, party_mu
from fedfair.privacy.ring import Ring
from fedfair.privacy.calibration import distributed_training_noise, threshold_clip
from fedfair.secagg import Decoded, EncodingConfig, SecAggConfig, SecurityParameters, simulate_round
from fedfair.secagg.training_noise import noised_encoding
from fedfair.secagg.recovery import check_range
from fedfair.simulation.federation import Federation


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
    beside: the releases every collaborator makes once a round besides its update, with the planned rounds as
        steps: the noise is calibrated so that they and the rounds spend the target together (`TrainingNoise`).
    """

    privacy: PrivacyConfig
    local: LocalConfig
    objective: ObjectiveConfig | None
    sample_rate: float
    rounds: int
    colluders: int = 0
    weight_per_record: float = 1.0
    beside: tuple[Release, ...] = ()

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
            self.beside,
        )


def plan_sample_rate(training: TrainingConfig, sizes: list[int]) -> float:
    """The Poisson rate every site samples its records at under distributed DP: the plan's batch fraction.

    ``batch_fraction`` when set, 1 under full batches (``batch_size`` 0), else the total batch over all the
    records (which `make_learners` refuses to exceed), so that one record's chance of taking part is the same
    at every site.
    """
    if training.batch_fraction is not None:
        return training.batch_fraction
    if training.batch_size == 0:
        return 1.0
    return training.batch_size / sum(sizes)


def federation_dp(
    federation: Federation,
    training: TrainingConfig,
    objective: ObjectiveConfig,
    privacy: PrivacyConfig,
    colluders: int,
) -> DistributedDP:
    """Distributed DP for FedSRCVaR on ``federation``: every site samples at the plan's rate (`plan_sample_rate`).

    The plan's ``privacy`` carries that rate, so the sites' learners and accountants and the secure sum
    derive the same noise; declared weights (w_k = b_k), one step a round for ``training.rounds`` rounds.
    """
    rate = plan_sample_rate(training, [client.size for client in federation.train])
    sampled = replace(privacy, sample_rate=rate)
    return DistributedDP(sampled, training.local, objective, rate, training.rounds, colluders)


class SecureSum:
    """Sums each round's updates through the real secure-aggregation protocol, in process.

    Every collaborator encodes [w * delta, w * delta_c] (followed by w * control with
    drift correction) and w, masks it, and the server recovers only the sum, exactly as in a
    deployment but without the network; the decoded sum differs from the plain one by at most
    `error_bounds[r]` per coordinate.

    With `distributed`, every collaborator also rotates, rounds and adds its Skellam share
    (`fedfair.secagg.noise`): mu / h each for the calibrated total mu, h = n - max(colluders, 1)
    (`honest_parties`: any one reader knows its own share, or the colluders'), so the shares no single
    reader knows carry it (every collaborator survives here, so the decoded sum carries n / h times
    it: `noise_excess`). `noise_stds[r]` is round r's noise standard deviation
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
        self.parties = 0

    def __call__(self, updates: list[Update]) -> server.Aggregate:
        """The next round's sum of `updates` (weighted, with their control variates if any), as decoded.

        Each call is one round: it appends the round's `error_bounds` and `noise_stds` entries.
        """
        vectors = [update.weighted_vector().numpy() for update in updates]
        round_number = len(self.error_bounds) + 1
        parties = self.parties = len(updates)
        encoding = self._round_encoding(round_number, vectors[0].size, parties)
        config = SecAggConfig(
            federation_id=self.federation_id,
            round=round_number,
            parties=tuple(f"collaborator-{index}" for index in range(parties)),
            # A rotated encoding is padded to a power of two.
            dimension=vectors[0].size if encoding.noise is None else encoding.noise.encoded_dimension,
            encoding=encoding,
            security=SecurityParameters(max_colluding=0 if self.distributed is None else self.distributed.colluders),
        )
        decoded = self._sum(config, vectors, [update.weight for update in updates])
        self.error_bounds.append(decoded.error_bound)
        self.noise_stds.append(decoded.noise_std)
        # Drift-corrected updates carry their control variates in the same masked vector.
        with_control = updates[0].control is not None
        weighted_sum = torch.from_numpy(decoded.weighted_sum.copy())
        return server.Aggregate.from_vector(weighted_sum, decoded.total_weight, with_control=with_control)

    def noise_report(self) -> dict[str, float | int]:
        """What the decoded sums carried under distributed DP, for a run's report; empty without noise.

        noise_std: the last round's standard deviation per coordinate of the decoded weighted sum (real
        units; the server's step divides it by the total weight). noise_multiplier: that over how far one
        record moves the sum (`TrainingNoise.sensitivity`): the sigma of the central DP-SGD run the sum
        amounts to, the colluders' excess included. mu and fractional_bits: the calibrated total in encoded
        units. noise_excess: parties / honest_parties(parties, colluders), the target noise's multiple
        the sum carries when every party survives. epsilon: what the rounds summed account to at delta, by the sum's own
        calibration (each site's accountant reports its own, in the run's privacy section).
        """
        plan, noise = self.distributed, self.training_noise
        if plan is None or noise is None:
            return {}
        rounds = len(self.noise_stds)
        return {
            "noise_std": self.noise_stds[-1],
            "noise_multiplier": self.noise_stds[-1] / noise.sensitivity,
            "mu": noise.release.mu,
            "fractional_bits": noise.fractional_bits,
            "parties": self.parties,
            "colluders": plan.colluders,
            "noise_excess": noise_excess(self.parties, self.parties, plan.colluders),
            "sample_rate": plan.sample_rate,
            "rounds": rounds,
            "delta": plan.privacy.delta,
            "epsilon": noise.epsilon(rounds, plan.privacy.delta),
        }

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
            honest = max(1, honest_parties(parties, colluders))
            ring = Ring(self.encoding.modulus_bits, parties, honest, self.encoding.max_weight / per_record, weights)
            self.training_noise = self.distributed.noise(dimension, ring)
        share = party_mu(self.training_noise.release.mu, parties, self.distributed.colluders)
        return noised_encoding(self.encoding, self.training_noise, share, self.federation_id, round_number, dimension)
