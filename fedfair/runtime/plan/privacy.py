"""The plan's ``[privacy]``: distributed differential privacy of what the aggregator decodes.

Each collaborator adds Skellam noise to its encoded input before masking; the honest parties of the
smallest survivor set the plan allows carry it in full (:func:`fedfair.privacy.distributed.party_mu`).
Three releases, each charged to the institution's ledger before it leaves: training updates under
``mode = "distributed"`` (:func:`training_noise`); under ``report_epsilon``, evaluation answers
(:func:`answer_release`) and, with a ``[schema]``, the table statistics before round 1
(:func:`statistics_release`). Without ``report_epsilon`` the statistics and answers are exact sums, which a
plan with a training DP mode may not have (it is refused); without ``mode = "distributed"`` the updates are
exact; agreed weights are never noised.

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.datasets.schema import Schema
from fedfair.datasets.statistics import (
    NOISED_STATISTICS_FRACTIONAL_BITS,
    column_ranges,
    statistics_dimension,
    statistics_sensitivity,
)
from fedfair.fairness import sums, tail
from fedfair.privacy import distributed, rounding
from fedfair.privacy.calibration import distributed_training_noise, threshold_clip
from fedfair.privacy.ring import Ring
from fedfair.privacy.config import PrivacyConfig
from fedfair.runtime.plan.limits import number_in, positive
from fedfair.runtime.composition_counts import CompositionColumn, composition_length, composition_sensitivity
from fedfair.core.tables import Table, field_names
from fedfair.secagg.config import holders_per_secret, threshold_in_force
from fedfair.secagg.security import SecurityParameters
from fedfair.secagg.noise import check_mu

ROUNDING_BETA = 1e-12
"""The probability that stochastic rounding leaves the inflated L2 bound (counted in delta)."""

MODES = ("off", "local", "distributed")
"""Training DP: none, each institution's own DP-SGD, or DP-SGD noised inside the secure sum."""


@dataclass(frozen=True)
class PlanPrivacy:
    """The plan's [privacy].

    mode: training DP (:data:`MODES`); epsilon: what the plan's training rounds spend in all under
    "distributed"; max_grad_norm: theta's per-record clip bound then; report_epsilon: epsilon of the
    final evaluation's answer (None: reports are exact sums); interim_report_epsilon: epsilon of each
    earlier evaluation's answer (None: report_epsilon, as the final one); delta: of every release;
    budget: the most epsilon all of one institution's releases, training and answers together, may spend.
    """

    mode: str = "off"
    epsilon: float | None = None
    max_grad_norm: float = 20.0
    report_epsilon: float | None = None
    interim_report_epsilon: float | None = None
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

    def optional(key: str) -> float | None:
        return number_in(t, key, positive("an epsilon")) if t.given(key) else None

    mode = t.string("mode", d.mode, choices=MODES)
    settings = PlanPrivacy(
        mode=mode,
        epsilon=optional("epsilon"),
        max_grad_norm=number_in(t, "max_grad_norm", positive("a clip bound"), d.max_grad_norm),
        report_epsilon=optional("report_epsilon"),
        interim_report_epsilon=optional("interim_report_epsilon"),
        delta=t.number("delta", d.delta, check=lambda x: 0 < x < 1e-2, expected="a probability below 0.01, e.g. 1e-5"),
        budget=number_in(t, "budget", positive("an epsilon"), d.budget),
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
    if mode != "off" and settings.report_epsilon is None:
        # Noised training next to exact answers: the evaluation answers and the table statistics would decode to
        # the very sums (held-out losses, label counts) the training noise keeps from the aggregator.
        # Without secure aggregation report_epsilon is refused too (above): name both steps, or the two
        # messages send the operator back and forth.
        noise_them = (
            "set report_epsilon (e.g. 1.0) to noise them too"
            if secure
            else "turn [secure_aggregation] on and set report_epsilon (e.g. 1.0) to noise them too, inside the "
            "secure sum"
        )
        t.fail(
            f'[privacy] mode = "{mode}" protects training, but without report_epsilon the evaluation answers and '
            f'the table statistics go to the aggregator exact; {noise_them}, or mode = "off" if no noise is wanted'
        )
    if settings.interim_report_epsilon is not None and settings.report_epsilon is None:
        t.fail(
            "[privacy] interim_report_epsilon noises the earlier evaluations of a plan whose final one is noised; "
            "set report_epsilon too, or remove interim_report_epsilon"
        )
    least = max(settings.epsilon or 0.0, settings.report_epsilon or 0.0, settings.interim_report_epsilon or 0.0)
    if settings.budget < least:
        t.fail(
            f"[privacy] budget = {settings.budget:g} is below {least:g}, what one training run or one evaluation "
            "answer spends; raise budget"
        )
    for key, value in (
        ("report_epsilon", settings.report_epsilon),
        ("interim_report_epsilon", settings.interim_report_epsilon),
    ):
        if value is not None:
            try:
                _answer_release(value, settings.delta, ())  # refuses now an epsilon the encoding cannot carry
            except ConfigError as error:
                t.fail(f"[privacy] {key} = {value:g}: {error}")
    return settings


def answer_release(
    settings: PlanPrivacy, columns: tuple[CompositionColumn, ...], *, final: bool = True
) -> distributed.Release:
    """The Skellam release of one evaluation answer (with composition counts for `columns`).

    The final evaluation's at report_epsilon, an earlier one's at interim_report_epsilon (report_epsilon when
    unset): the answer of :mod:`fedfair.fairness.tail`. Mu is the total the decoded sum carries from the honest
    parties, sensitivities in encoded units after rounding.
    """
    if settings.report_epsilon is None:
        raise ConfigError("the plan's evaluation answers are not noised ([privacy] report_epsilon unset)")
    interim = settings.interim_report_epsilon
    epsilon = settings.report_epsilon if final or interim is None else interim
    return _answer_release(epsilon, settings.delta, columns)


def composition_release(settings: PlanPrivacy, columns: tuple[CompositionColumn, ...]) -> distributed.Release:
    """The Skellam release, at report_epsilon, of the final evaluation's composition counts sent on their own.

    Only when the final model was answered at an earlier evaluation: each site sends that kept answer again
    (one answer per model) and the counts beside it, a fresh release charged by itself; one record moves them
    by :func:`~fedfair.runtime.composition_counts.composition_sensitivity`.
    """
    l1, l2 = composition_sensitivity(columns)
    return _skellam_release(settings, l1, l2, sums.ENCODING.fractional_bits, composition_length(columns))


def statistics_release(settings: PlanPrivacy, schema: Schema) -> distributed.Release:
    """The Skellam release of one site's table statistics before round 1 (:func:`noised_statistics_vector`).

    It spends one evaluation answer's epsilon (report_epsilon) at the plan's delta; one record moves the
    statistics by :func:`~fedfair.datasets.statistics.statistics_sensitivity` in real units, encoded with
    :data:`~fedfair.datasets.statistics.NOISED_STATISTICS_FRACTIONAL_BITS` fractional bits. A ConfigError
    names a numeric column without the public range the bound needs.
    """
    column_ranges(schema)
    l1, l2 = statistics_sensitivity(schema)
    dimension = statistics_dimension(schema, noised=True)
    return _skellam_release(settings, l1, l2, NOISED_STATISTICS_FRACTIONAL_BITS, dimension)


def _skellam_release(
    settings: PlanPrivacy, l1: float, l2: float, fractional_bits: int, dimension: int
) -> distributed.Release:
    """The Skellam release at report_epsilon of a `dimension`-long vector one record moves by (l1, l2) real units.

    Encoded with `fractional_bits` and stochastically rounded: the sensitivities it carries are in encoded
    units after rounding (L2 inflated except with probability ROUNDING_BETA, counted in delta), and mu is the
    total the decoded sum carries from the honest parties.
    """
    if settings.report_epsilon is None:
        raise ConfigError("the plan's evaluation answers are not noised ([privacy] report_epsilon unset)")
    scale = math.ldexp(1.0, fractional_bits)
    rounded = rounding.rounded_l2(l2 * scale, dimension, ROUNDING_BETA)
    shape = distributed.Release("skellam", 1.0, l1 * scale + dimension, rounded)
    mu = distributed.calibrate(settings.report_epsilon, settings.delta - ROUNDING_BETA, [shape])
    check_mu(mu)
    return distributed.Release("skellam", mu, shape.l1, shape.l2)


def _answer_release(epsilon: float, delta: float, columns: tuple[CompositionColumn, ...]) -> distributed.Release:
    extra_l1, extra_l2 = composition_sensitivity(columns) if columns else (0.0, 0.0)
    release = tail.answer_release(epsilon, delta, ROUNDING_BETA, (extra_l1, extra_l2, composition_length(columns)))
    check_mu(release.mu)
    return release


@functools.lru_cache(maxsize=64)
def plan_floor(collaborators: int, quorum: int, security: SecurityParameters, tolerates_dropouts: bool) -> int:
    """The fewest survivors of any sum the secure-aggregation protocol can unmask under the plan.

    Every collaborator under ``dropouts = "none"``. Else the least threshold t in force over every round size p
    the plan allows, from `quorum` ([quorum] min_collaborators) to `collaborators`, by the protocol's own rules
    (:func:`fedfair.secagg.config.holders_per_secret`, :func:`~fedfair.secagg.config.threshold_in_force`) under the
    plan's `security` (its threshold, collusion bound and masking graph's degree, None for the complete graph). On
    the complete graph, which a degree of `collaborators` - 1 is as well, t follows each round's own size, so the
    smallest round decides. No client signs a survivor set below t, and the rule keeps t >= max_colluding + 2: at
    least two honest survivors. A manifest's min_round_size may only raise the floor, which a collaborator
    enforces, so noise calibrated to it is never too little.

    Raises:
        ConfigError: no round size the plan allows can run under the threshold rule, so no floor exists.
    """
    if not tolerates_dropouts:
        return collaborators
    thresholds = []
    for parties in range(quorum, collaborators + 1):
        try:
            holders = holders_per_secret(parties, collaborators, security.neighbours)
            thresholds.append(threshold_in_force(security.threshold, holders, security.max_colluding))
        except ConfigError:
            continue  # the protocol runs no round of this size
    if not thresholds:
        raise ConfigError(
            f"no round of {quorum} to {collaborators} collaborators satisfies the secure-aggregation threshold "
            f"rule (threshold {security.threshold}, max_colluding {security.max_colluding}), so no noise floor "
            "holds; omit threshold or lower max_colluding"
        )
    return min(thresholds)


def party_mu(release: distributed.Release, floor: int, colluders: int) -> float:
    """This party's share of the release's noise.

    The parties of a `floor`-party survivor set whose shares no single reader knows carry it all
    (:func:`fedfair.privacy.distributed.party_mu`).
    """
    return check_mu(distributed.party_mu(release.mu, floor, colluders))


def decoded_noise_std(
    release: distributed.Release,
    floor: int,
    colluders: int,
    summands: int,
    fractional_bits: int = sums.ENCODING.fractional_bits,
) -> float:
    """The standard deviation of each decoded coordinate's noise (real units) in a sum of `summands` answers.

    `fractional_bits`: of the answers' encoding (the evaluation's by default).
    """
    return math.sqrt(2.0 * summands * party_mu(release, floor, colluders)) / math.ldexp(1.0, fractional_bits)


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
    weight_per_record: float = 1.0,
    ring: Ring | None = None,
) -> tuple[distributed.TrainingNoise, float]:
    """The calibrated noise of the plan's distributed DP-SGD rounds for updates of `dimension` values.

    Calibrated to one record's true move of the secure sum, (w_k / b_k) sqrt((lr C)^2 + (threshold_lr C_c)^2)
    at the largest `weight_per_record` w_k / b_k of the plan's weights
    (:meth:`~fedfair.runtime.plan.influence.InfluenceSettings.weight_per_record`: 1 under declared weights,
    1 / min b_k under equal ones). Also returns each party's Skellam share of it: the honest parties of a
    `floor`-party survivor set (`colluders` of them may collude) carry it all. With `ring`, the fractional
    bits keep the sum within the plan's words. Cached: the calibration bisects over RDP curves, and every
    round asks the same.
    """
    privacy = training_privacy(settings, rate)
    threshold_norm = threshold_clip(privacy, objective.epsilon, objective.rho)
    noise = distributed_training_noise(
        privacy, local.lr, local.threshold_lr, threshold_norm, rate, rounds, dimension, weight_per_record, ring
    )
    return noise, check_mu(distributed.party_mu(noise.release.mu, floor, colluders))


def privacy_shortfall(own: PrivacyConfig, plan: PlanPrivacy, secure: bool) -> str | None:
    """Why this institution may not train under the plan's [privacy], or None.

    A plan whose training noise is below what the institution's own [privacy] asks (a larger epsilon or delta,
    or no distributed noise where it asks for it), local DP-SGD on top of the plan's distributed noise (its
    own noise would be counted nowhere in the sum's calibration), or local DP-SGD under a `secure` plan whose
    evaluation answers and table statistics decode exact (no report_epsilon: they would tell the aggregator the
    sums the training noise keeps from it); or no [privacy] of its own under a plan whose mode = "local" leaves the
    training's noise to each institution; or local DP-SGD that cannot hold within the plan's budget (no noise, a
    target past the budget, a delta above the plan's; :func:`_beyond_plan_budget`). Without secure aggregation a plan cannot set report_epsilon, so
    local DP-SGD is accepted there: the aggregator reads each site's answers and statistics exact whatever the
    site does, and refusing would leave it no noise at all (docs/security.md). Each reason names the fix.
    """
    if not own.enabled:
        if plan.mode == "local":
            # The plan's "local" is a promise that each institution adds its own DP-SGD: nothing else noises the
            # training, so a site without it would send exact updates under a plan that says they are private.
            return (
                "the plan's [privacy] mode = \"local\" trains under each institution's own DP-SGD, and this "
                "institution's config has no [privacy] enabled, so its updates would leave un-noised; set "
                "[privacy] enabled = true (with noise_multiplier or target_epsilon) in this institution's config, "
                'or ask the operator for mode = "off" if un-noised training is intended'
            )
        return None
    if own.mode == "local":
        if plan.distributed:
            return (
                "its [privacy] adds local DP-SGD noise, and the plan adds distributed noise inside the secure sum "
                '(mode = "distributed"); set mode = "distributed" and a target_epsilon (the most the plan\'s '
                "training may spend) in this institution's [privacy] to accept the plan's noise, with a "
                "budget_epsilon above it for the noised answers (the target is the budget without one), or remove "
                "[privacy]"
            )
        beyond = _beyond_plan_budget(own, plan)
        if beyond is not None:
            return beyond
        if secure and not plan.noised:
            return (
                "its [privacy] adds local DP-SGD noise to training, and the plan sends the evaluation answers and "
                "the table statistics to the aggregator exact ([privacy] report_epsilon unset); ask the operator "
                "for a plan with report_epsilon (e.g. 1.0) to noise them too, or remove [privacy] here if exact "
                "answers are acceptable"
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


def _beyond_plan_budget(own: PrivacyConfig, plan: PlanPrivacy) -> str | None:
    """Why this institution's local DP-SGD cannot hold within the plan's [privacy] budget, or None.

    The budget binds the DP-SGD steps too (the learner stops at it), so a site whose steps add no noise (no finite
    epsilon), whose target is past the budget, or whose delta is above the plan's (an epsilon at a larger delta says
    less than the budget, which is stated at the plan's delta) is refused here, before any update leaves, rather
    than joining a plan that says every institution's training is noised within its budget. A noise multiplier too
    small for even one round is refused by the learner at its first round, which knows the sampling rate.
    """
    if own.noise_multiplier == 0.0:
        return (
            "its [privacy] noise_multiplier = 0 adds no noise to DP-SGD: its updates would leave clipped but exact, "
            f"with no finite epsilon, under a plan whose [privacy] budget is {plan.budget:g}; set target_epsilon = "
            f"{plan.budget:g} or less (or a noise_multiplier above 0) in this institution's [privacy]"
        )
    if own.target_epsilon is not None and own.target_epsilon > plan.budget:
        return (
            f"its [privacy] target_epsilon = {own.target_epsilon:g} is past the plan's [privacy] budget "
            f"{plan.budget:g}, the most this institution's training and answers may spend together; set "
            f"target_epsilon = {plan.budget:g} or less in this institution's [privacy], or ask the operator for a "
            "plan with a larger budget"
        )
    if own.delta > plan.delta:
        return (
            f"its [privacy] delta = {own.delta:g} is above the plan's [privacy] delta {plan.delta:g}, at which the "
            f"plan's budget {plan.budget:g} is stated: its DP-SGD epsilon would say less than the budget means; set "
            f"delta = {plan.delta:g} or less in this institution's [privacy]"
        )
    return None


def sizing_line(settings: PlanPrivacy, rho: float, cap: float, rows: int, held_out_share: float, excess: float) -> str:
    """What the plan's final evaluation can resolve, for a site holding `rows` rows (said by ``fedfair data check``).

    The expected 95% half-width of the worst-group risk over this site's held-out rows alone, and the held-out
    rows in all (the federation's) or the report_epsilon that would give +/- :data:`fedfair.fairness.tail.RESOLVED`;
    `excess` is how many times the target noise the sum carries (:func:`fedfair.privacy.distributed.noise_excess`).
    """
    if settings.report_epsilon is None:
        return (
            "the plan's evaluations are exact sums ([privacy] report_epsilon unset): no noise, and two evaluations "
            "over survivor sets one site apart would difference to a site's held-out losses"
        )
    held_out = max(round(rows * held_out_share), 1)
    half = tail.expected_half_width(held_out, rho, settings.report_epsilon, settings.delta, cap, excess=excess)
    needed = tail.rows_for(half, held_out)
    epsilon = tail.epsilon_for(half, settings.report_epsilon)
    return (
        f"privacy sized to the data: with report_epsilon {settings.report_epsilon:g} (rho {rho:g}, losses clipped "
        f"at {cap:g}), this table's {held_out:,} held-out rows (a {held_out_share:g} share) alone would give the "
        f"final worst-group risk +/- {half:.2g} (95%, from the noise); the federation's held-out rows in all shrink "
        f"it in proportion: +/- {tail.RESOLVED:g} needs about {needed:,.0f} of them, or report_epsilon "
        f"{epsilon:.2g} on this table alone"
    )
