"""The words a noised training sum travels in, and what bounds its range: so how many fractional bits fit.

Each party projects its weighted update onto the clipped sum of a Poisson batch
(:func:`~fedfair.privacy.rounding.batch_radius` records' sensitivity), rotates, rounds and adds its Skellam
share; :class:`Ring` bounds the probability that such a sum wraps modulo 2^k, which the calibration
(:func:`fedfair.privacy.distributed.training_noise`) keeps at most 2^-40 and counts in delta.

Why: docs/design.md, "Inside the privacy library".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedfair.core.errors import ConfigError
from fedfair.privacy.rounding import batch_radius, largest_total, rotated_wrap_probability


@dataclass(frozen=True)
class Ring:
    """The words a noised training sum travels in, and who adds into them: what bounds its range.

    modulus_bits: k, the word size of the secure sum (16, 32 or 64).
    parties: the most inputs one sum adds (the plan's collaborators).
    honest: the parties that carry the noise (the survivor floor less the shares one reader knows,
        :func:`~fedfair.privacy.distributed.honest_parties`); all
        ``parties`` add a share, so a sum carries up to parties / honest times the calibrated mu.
    max_weight: the largest weight a party sends, in expected batch records (its weight over w_k / b_k): the
        encoder projects its vector onto :func:`~fedfair.privacy.rounding.batch_radius` of it times one record's
        sensitivity.
    weights: every party's agreed weight in the same records, when the plan fixes them: a sum then holds at
        most the ``parties`` largest radii (3 sites of batches 875, 98 and 51: 1397 records' sensitivity, not
        3 x 1112); () when not agreed.
    """

    modulus_bits: int
    parties: int
    honest: int
    max_weight: float
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.modulus_bits not in (16, 32, 64):
            raise ConfigError(f"modulus_bits={self.modulus_bits} is not supported; use 16, 32 or 64")
        if not 1 <= self.honest <= self.parties:
            raise ConfigError(f"honest={self.honest} must be from 1 to the {self.parties} parties")
        if not (math.isfinite(self.max_weight) and self.max_weight > 0):
            raise ConfigError(f"max_weight={self.max_weight!r} must be a positive finite number")
        if not all(0.0 < weight <= self.max_weight for weight in self.weights):
            raise ConfigError(f"every agreed weight must be in (0, max_weight = {self.max_weight:g}]")

    def records(self) -> float:
        """A bound, in records' sensitivities, on the sum of the parties' projected vectors."""
        most = self.parties * batch_radius(self.max_weight)
        if not self.weights:
            return most
        return min(most, largest_total((batch_radius(weight) for weight in self.weights), self.parties))

    def wrap_probability(self, record_units: float, mu: float, dimension: int) -> float:
        """A bound on the probability that one noised sum wraps modulo 2^k, its noise calibrated to ``mu``.

        ``mu`` is the honest parties' total (a release's); ``record_units`` one record's move in encoded units
        before rounding (2^f times the sensitivity), the unit of the parties' projection radii.

        The rotated signal and every party's noise (:func:`~fedfair.privacy.rounding.rotated_wrap_probability`,
        as the encoder checks it). The weight word has its own scale
        (:func:`~fedfair.secagg.encode.weight_fractional_bits`), so it does not bound f.
        """
        total_mu = mu * self.parties / self.honest
        norm = self.records() * record_units / self.parties
        return rotated_wrap_probability(total_mu, norm, self.parties, self.modulus_bits, dimension)
