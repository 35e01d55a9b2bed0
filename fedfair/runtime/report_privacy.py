"""The plan's ``[privacy]``: distributed differential privacy of the evaluations the aggregator decodes.

An evaluation answer (each site's histogram of held-out losses, and at the final round its
composition counts) is summed under secure aggregation, so the aggregator decodes only the sum;
but it chooses the model evaluated, and under ``dropouts = "allowed"`` who is summed. With
``report_epsilon`` set, each collaborator adds Skellam noise to its encoded answer before
masking, so the decoded sum carries Skellam noise that the honest parties of the smallest
survivor set the plan allows carry in full (:func:`fedfair.privacy.distributed.party_mu`):

- the mechanism is Skellam inside the secure sum, one release per fresh answer;
- the sensitivity is one held-out record's: ``fairness.sums.RECORD_L1`` / ``RECORD_L2``
  (and ``runtime.composition.composition_sensitivity`` at the final round), scaled by the
  encoding's 2^f and inflated for stochastic rounding;
- the noise is calibrated so that one answer spends ``report_epsilon`` at ``delta``
  (RDP, :func:`fedfair.privacy.distributed.calibrate`); each institution's record charges
  every fresh answer before it is kept and refuses one past ``report_budget``
  (:meth:`fedfair.runtime.collaborator.record.InputRecord.charge`). A re-sent answer is the
  same bits, so it costs nothing more.

Statistics (round 0) are not noised: see ``datasets.statistics.statistics_sensitivity``.
Training differential privacy stays each institution's own ``[privacy]`` (local DP-SGD).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fedfair.core.errors import ConfigError
from fedfair.fairness import sums
from fedfair.privacy import distributed
from fedfair.runtime.composition import CompositionColumn, composition_length, composition_sensitivity
from fedfair.runtime.toml_tables import Table, field_names
from fedfair.secagg.noise import check_mu

ROUNDING_BETA = 1e-12
"""The probability that stochastic rounding leaves the inflated L2 bound (counted in delta)."""


@dataclass(frozen=True)
class ReportPrivacy:
    """The plan's [privacy]: report_epsilon (epsilon of one evaluation answer; None: reports are exact
    sums), delta, and report_budget (the most epsilon all of one institution's answers may spend)."""

    report_epsilon: float | None = None
    delta: float = 1e-5
    report_budget: float = 10.0

    @property
    def noised(self) -> bool:
        """Whether evaluation answers carry noise."""
        return self.report_epsilon is not None


def read_report_privacy(source: str, data: Mapping[str, object], secure: bool) -> ReportPrivacy:
    """The plan's [privacy] (defaults when absent); a ConfigError naming the key and the fix."""
    t = Table.of(source, data, "privacy", field_names(ReportPrivacy))
    d = ReportPrivacy()
    positive = "a positive number"
    epsilon = t.number("report_epsilon", check=lambda x: x > 0, expected=positive) if t.given("report_epsilon") else None
    settings = ReportPrivacy(
        report_epsilon=epsilon,
        delta=t.number("delta", d.delta, check=lambda x: 0 < x < 1e-2, expected="a probability below 0.01, e.g. 1e-5"),
        report_budget=t.number("report_budget", d.report_budget, check=lambda x: x > 0, expected=positive),
    )
    if epsilon is None:
        return settings
    if settings.report_budget < epsilon:
        t.fail(
            f"[privacy] report_budget = {settings.report_budget:g} is below report_epsilon = {epsilon:g}, "
            "so not one evaluation could be answered; raise report_budget"
        )
    if not secure:
        t.fail(
            "[privacy] report_epsilon adds noise inside the secure sum, and [secure_aggregation] is "
            "off; turn secure aggregation on, or remove report_epsilon"
        )
    try:
        answer_release(settings, ())  # refuses now an epsilon the encoding cannot carry
    except ConfigError as error:
        t.fail(f"[privacy] report_epsilon = {epsilon:g}: {error}")
    return settings


def answer_release(settings: ReportPrivacy, columns: tuple[CompositionColumn, ...]) -> distributed.Release:
    """The Skellam release of one evaluation answer (with composition counts for `columns`): mu is the total
    the decoded sum carries from the honest parties, sensitivities in encoded units after rounding."""
    if settings.report_epsilon is None:
        raise ConfigError("the plan's evaluation answers are not noised ([privacy] report_epsilon unset)")
    l1, l2 = sums.RECORD_L1, sums.RECORD_L2
    if columns:
        extra_l1, extra_l2 = composition_sensitivity(columns)
        l1, l2 = l1 + extra_l1, math.hypot(l2, extra_l2)
    scale = math.ldexp(1.0, sums.ENCODING.fractional_bits)
    dimension = sums.vector_length() + composition_length(columns)
    rounded = distributed.rounded_l2(l2 * scale, dimension, ROUNDING_BETA)
    shape = distributed.Release("skellam", 1.0, l1 * scale + dimension, rounded)
    mu = distributed.calibrate(settings.report_epsilon, settings.delta - ROUNDING_BETA, [shape])
    check_mu(mu)
    return distributed.Release("skellam", mu, shape.l1, shape.l2)


def plan_floor(collaborators: int, max_colluding: int, tolerates_dropouts: bool) -> int:
    """The fewest survivors the plan itself allows in a sum: every collaborator under ``dropouts = "none"``,
    else the isolation bound max_colluding + 2 (a manifest's min_round_size may only raise it, which a
    collaborator enforces, so noise calibrated to this floor is never too little)."""
    return collaborators if not tolerates_dropouts else min(collaborators, max_colluding + 2)


def party_mu(release: distributed.Release, floor: int, colluders: int) -> float:
    """This party's share of the release's noise: the honest parties of a `floor`-party survivor set carry
    it all (:func:`fedfair.privacy.distributed.party_mu`)."""
    return check_mu(distributed.party_mu(release.mu, floor, colluders))


def decoded_noise_std(release: distributed.Release, floor: int, colluders: int, summands: int) -> float:
    """The standard deviation of each decoded coordinate's noise (real units) in a sum of `summands` answers."""
    return math.sqrt(2.0 * summands * party_mu(release, floor, colluders)) / math.ldexp(
        1.0, sums.ENCODING.fractional_bits
    )
