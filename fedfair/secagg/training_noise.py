"""The encoding of a distributed-DP training round: the plan's encoding with the noise step of that round.

Every party and the server of one round derive it alike, from the plan's encoding and the privacy settings'
:class:`~fedfair.privacy.distributed.TrainingNoise`; the encoder (:mod:`fedfair.secagg.encode`) then rotates,
rounds and noises each party's vector by it.
"""

from __future__ import annotations

from dataclasses import replace

from fedfair.privacy.distributed import ROUNDING_BETA, TrainingNoise
from fedfair.secagg.encode import EncodingConfig
from fedfair.secagg.noise import NoiseConfig
from fedfair.secagg.rotation import rotation_key


def noised_encoding(
    encoding: EncodingConfig, noise: TrainingNoise, share: float, federation_id: str, round_number: int, dimension: int
) -> EncodingConfig:
    """`encoding` with the noise step of a distributed DP-SGD round.

    `noise`'s fractional bits, this party's Skellam `share` mu, the norm bound of a Poisson batch's clipped sum
    (:func:`~fedfair.privacy.rounding.batch_radius` records' sensitivity, :meth:`NoiseConfig.radius`), and a
    rotation keyed by the federation and the round; what every party and the
    server of one round derive alike.
    """
    step = NoiseConfig(
        mu=share,
        norm_clip=noise.sensitivity / noise.weight_per_record,
        dimension=dimension,
        rotation_key=rotation_key(federation_id, round_number, "training"),
        weight_per_record=noise.weight_per_record,
        beta=ROUNDING_BETA,  # the conditional rounding's failure that delta_addon counts
    )
    return replace(encoding, fractional_bits=noise.fractional_bits, noise=step)
