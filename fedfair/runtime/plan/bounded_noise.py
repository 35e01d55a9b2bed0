"""Distributed DP under the two-verifier input bound: each verifier's noise and the bits the sites encode at.

Under ``input_bound = "two_verifiers"`` each verifier adds Skellam(noise_mu) per coordinate to its own total (the
auditor's bound by its tags, the aggregator's by the noise key its verdict record commits to), so that either
verifier, which knows its own noise, still reads the sum under the other's. noise_mu is the whole noise the
accountant asks for, charged once (what each verifier alone faces), calibrated from the plan exactly as the masked
round's total noise
(:meth:`~fedfair.runtime.plan.learning_settings.LearningSettings.training_noise`): the same sensitivity per
record in the encoded scale, sampling, rounds and target. Every party derives it from the plan it holds, so
none trusts another's number, and each site charges its ledger the same release a masked round's would.

Why: docs/security.md, "Bounded inputs (two verifiers)", "Distributed DP".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedfair.runtime.plan.learning_settings import LearningSettings


def bounded_noise_mu(settings: LearningSettings, collaborators: int, dimension: int) -> float:
    """The Skellam parameter each verifier adds to its total (encoded scale); 0 without distributed DP.

    `collaborators`: the plan's roster's size; `dimension`: the update's values, as a masked round calibrates them.
    """
    if not settings.privacy.distributed:
        return 0.0
    noise, _ = settings.training_noise(collaborators, dimension)
    return noise.release.mu


def bounded_fractional_bits(settings: LearningSettings, collaborators: int, dimension: int) -> int:
    """The fixed point a bounded round's updates are encoded and proven at.

    The plan's fractional_bits, or under distributed DP the noise's (one record moves the sum by 2^11 to 2^12
    units, what the noise was calibrated for). They do not depend on `dimension`: the bounded sum is in a 52-bit
    field, not the plan's words, so no wrap lowers them.
    """
    if not settings.privacy.distributed:
        return settings.secure_aggregation.fractional_bits
    noise, _ = settings.training_noise(collaborators, dimension)
    return noise.fractional_bits
