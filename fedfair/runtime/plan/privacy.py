"""The plan's ``[privacy]``: distributed differential privacy of everything the aggregator decodes.

Secure aggregation shows the aggregator only sums, but it chooses the model a sum is taken on,
and under ``dropouts = "allowed"`` who is summed, so exact sums can be differenced. With this
section each collaborator adds Skellam noise to its encoded input before masking, and the
honest parties of the smallest survivor set the plan allows carry the noise in full
(:func:`fedfair.privacy.distributed.party_mu`). Two kinds of release:

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.fairness import sums
from fedfair.privacy import distributed, rounding
from fedfair.privacy.calibration import distributed_training_noise, threshold_clip
from fedfair.privacy.config import PrivacyConfig
from fedfair.runtime.composition_counts import CompositionColumn, composition_length, composition_sensitivity
from fedfair.core.tables import Table, field_names
from fedfair.secagg.noise import check_mu

ROUNDING_BETA = 1e-12
"""The probability that stochastic rounding leaves the inflated L2 bound (counted in delta)."""

MODES = ("off", "local", "distributed")
"""Training DP: none, each institution's own DP-SGD, or DP-SGD noised inside the secure sum."""


@dataclass(frozen=True)
class PlanPrivacy:
    """The plan's [privacy].

    mode: training DP (:data:`MODES`); epsilon: what the plan's training rounds spend in all under
    "distributed"; max_grad_norm: theta's per-record clip bound then; report_epsilon: epsilon of one
    evaluation answer (None: reports are exact sums); delta: of every release; budget: the most
    epsilon all of one institution's releases, training and answers together, may spend.
    """

    mode: str = "off"
    epsilon: float | None = None
    max_grad_norm: float = 20.0
    report_epsilon: float | None = None
    delta: float = 1e-5
    budget: float = 10.0

    @property
    def noised(self) -> bool:
        """Whether evaluation answers carry noise."""
        return self.report_epsilon is not None

    @property
    def distributed(self) -> bool:
        """Whether training updates carry noise inside the secure sum."""
        return self.mode == "distributed"


def read_plan_privacy(source: str, data: Mapping[str, object], secure: bool, local: LocalConfig) -> PlanPrivacy:
    """The plan's [privacy] (defaults when absent); a ConfigError naming the key and the fix.

    `secure` and `local` are the plan's secure aggregation and local steps.
    """
    t = Table.of(source, data, "privacy", field_names(PlanPrivacy))
    d = PlanPrivacy()
    positive = "a positive number"

    def optional(key: str) -> float | None:
        return t.number(key, check=lambda x: x > 0, expected=positive) if t.given(key) else None

    mode = t.string("mode", d.mode, choices=MODES)
    settings = PlanPrivacy(
        mode=mode,
        epsilon=optional("epsilon"),
        max_grad_norm=t.number("max_grad_norm", d.max_grad_norm, check=lambda x: x > 0, expected=positive),
        report_epsilon=optional("report_epsilon"),
        delta=t.number("delta", d.delta, check=lambda x: 0 < x < 1e-2, expected="a probability below 0.01, e.g. 1e-5"),
        budget=t.number("budget", d.budget, check=lambda x: x > 0, expected=positive),
    )
    if settings.distributed:
        if settings.epsilon is None:
            t.fail('[privacy] mode = "distributed" calibrates the training noise to a target: set epsilon, e.g. 3.0')
        if local.local_steps != 1 or local.drift_correction != "none":
            t.fail(
                '[privacy] mode = "distributed" sums one clipped DP-SGD step per round inside the secure sum; set '
                '[training] local_steps = 1 and drift_correction = "none"'
            )
    elif settings.epsilon is not None:
        t.fail(
            f'[privacy] epsilon is the training target of mode = "distributed", and mode is "{mode}"; set '
            'mode = "distributed" or remove epsilon'
        )
    if (settings.distributed or settings.noised) and not secure:
        t.fail(
            "[privacy] adds noise inside the secure sum, and [secure_aggregation] is off; turn secure "
            'aggregation on, or remove report_epsilon and mode = "distributed"'
        )
    least = max(settings.epsilon or 0.0, settings.report_epsilon or 0.0)
    if settings.budget < least:
        t.fail(
            f"[privacy] budget = {settings.budget:g} is below {least:g}, what one training run or one evaluation "
            "answer spends; raise budget"
        )
    if settings.report_epsilon is not None:
        try:
            answer_release(settings, ())  # refuses now an epsilon the encoding cannot carry
        except ConfigError as error:
            t.fail(f"[privacy] report_epsilon = {settings.report_epsilon:g}: {error}")
    return settings


def answer_release(settings: PlanPrivacy, columns: tuple[CompositionColumn, ...]) -> distributed.Release:
    """The Skellam release of one evaluation answer (with composition counts for `columns`).

    Mu is the total the decoded sum carries from the honest parties, sensitivities in encoded units after
    rounding.
    """
    if settings.report_epsilon is None:
        raise ConfigError("the plan's evaluation answers are not noised ([privacy] report_epsilon unset)")
    l1, l2 = sums.RECORD_L1, sums.RECORD_L2
    if columns:
        extra_l1, extra_l2 = composition_sensitivity(columns)
        l1, l2 = l1 + extra_l1, math.hypot(l2, extra_l2)
    scale = math.ldexp(1.0, sums.ENCODING.fractional_bits)
    dimension = sums.vector_length() + composition_length(columns)
    rounded = rounding.rounded_l2(l2 * scale, dimension, ROUNDING_BETA)
    shape = distributed.Release("skellam", 1.0, l1 * scale + dimension, rounded)
    mu = distributed.calibrate(settings.report_epsilon, settings.delta - ROUNDING_BETA, [shape])
    check_mu(mu)
    return distributed.Release("skellam", mu, shape.l1, shape.l2)


def plan_floor(collaborators: int, max_colluding: int, tolerates_dropouts: bool, threshold: int = 0) -> int:
    """The fewest survivors the plan itself allows in a sum.

    Every collaborator under ``dropouts = "none"``, else the larger of the isolation bound max_colluding + 2 and
    the least secure-aggregation `threshold` t of any round (no sum is unmasked below t survivors). A manifest's
    min_round_size may only raise it, which a collaborator enforces, so noise calibrated to this floor is never
    too little.
    """
    return collaborators if not tolerates_dropouts else min(collaborators, max(max_colluding + 2, threshold))


def party_mu(release: distributed.Release, floor: int, colluders: int) -> float:
    """This party's share of the release's noise.

    The honest parties of a `floor`-party survivor set carry it all
    (:func:`fedfair.privacy.distributed.party_mu`).
    """
    return check_mu(distributed.party_mu(release.mu, floor, colluders))


def decoded_noise_std(release: distributed.Release, floor: int, colluders: int, summands: int) -> float:
    """The standard deviation of each decoded coordinate's noise (real units) in a sum of `summands` answers."""
    return math.sqrt(2.0 * summands * party_mu(release, floor, colluders)) / math.ldexp(
        1.0, sums.ENCODING.fractional_bits
    )


def training_privacy(settings: PlanPrivacy, batch_fraction: float) -> PrivacyConfig:
    """The DP-SGD settings every collaborator trains with under mode "distributed".

    No local noise, each record's gradient clipped, Poisson sampling at the plan's batch fraction (the same
    everywhere, so one record's chance of taking part is the plan's), calibrated to the plan's epsilon.
    """
    return PrivacyConfig(
        enabled=True,
        mode="distributed",
        target_epsilon=settings.epsilon,
        max_grad_norm=settings.max_grad_norm,
        delta=settings.delta,
        accountant="rdp",
        sample_rate=batch_fraction,
    )


@functools.lru_cache(maxsize=8)
def training_noise(
    settings: PlanPrivacy,
    local: LocalConfig,
    objective: ObjectiveConfig,
    rounds: int,
    rate: float,
    dimension: int,
    floor: int,
    colluders: int,
    ring: distributed.Ring | None = None,
) -> tuple[distributed.TrainingNoise, float]:
    """The calibrated noise of the plan's distributed DP-SGD rounds for updates of `dimension` values.

    Also returns each party's Skellam share of it: the honest parties of a `floor`-party survivor set
    (`colluders` of them may collude) carry it all. With `ring`, the fractional bits keep the sum within the
    plan's words. Cached: the calibration bisects over RDP curves, and every round asks the same.
    """
    privacy = training_privacy(settings, rate)
    threshold_norm = threshold_clip(privacy, objective.epsilon, objective.rho)
    noise = distributed_training_noise(
        privacy, local.lr, local.threshold_lr, threshold_norm, rate, rounds, dimension, ring
    )
    return noise, check_mu(distributed.party_mu(noise.release.mu, floor, colluders))


def privacy_shortfall(own: PrivacyConfig, plan: PlanPrivacy) -> str | None:
    """Why this institution may not train under the plan's [privacy], or None.

    A plan whose training noise is below what the institution's own [privacy] asks (a larger epsilon or delta,
    or no distributed noise where it asks for it), or local DP-SGD on top of the plan's distributed noise (its
    own noise would be counted nowhere in the sum's calibration). Each reason names the fix.
    """
    if not own.enabled:
        return None
    if own.mode == "local":
        if plan.distributed:
            return (
                "its [privacy] adds local DP-SGD noise, and the plan adds distributed noise inside the secure sum "
                '(mode = "distributed"); set mode = "distributed" and a target_epsilon in this institution\'s '
                "[privacy] to accept the plan's noise, or remove [privacy]"
            )
        return None
    if not plan.distributed:
        return (
            f"its [privacy] asks for distributed noise (target_epsilon {own.target_epsilon:g}), and the plan's "
            f'[privacy] mode is "{plan.mode}"; ask the operator for mode = "distributed" in a new plan, or use '
            'mode = "local" here'
        )
    assert plan.epsilon is not None and own.target_epsilon is not None  # both validated when read
    if plan.epsilon > own.target_epsilon or plan.delta > own.delta:
        return (
            f"the plan's training noise spends epsilon {plan.epsilon:g} at delta {plan.delta:g}, more than this "
            f"institution's [privacy] allows (epsilon {own.target_epsilon:g}, delta {own.delta:g}); ask the "
            "operator for a plan within it"
        )
    return None
