"""The noised evaluation's tail sums (`fedfair.fairness.tail`): sensitivity, estimates and their 95% intervals.

The exact figures are `pooled` on the held-out losses clipped at the cap. The stated intervals claim
95% coverage each; over T independent noises the misses are then at most Binomial(T, 0.05), and the
tests allow up to that law's quantile of 1 - 1e-6 (a false alarm once in a million runs if the claim
is exactly tight).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from fedfair.core.errors import ConfigError
from fedfair.fairness import pooled, tail, tail_bounds

CAP, RHO = 3.0, 0.3
TRIALS = 300
ALLOWED_MISSES = int(stats.binom.ppf(1.0 - 1e-6, TRIALS, 1.0 - tail.CONFIDENCE))


def held_out(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cross-entropy-like losses (a heavy tail past the cap), errors that follow them, and labels (24% positive)."""
    rng = np.random.default_rng(seed)
    labels = (rng.random(rows) < 0.24).astype(np.int64)
    losses = rng.exponential(0.3, rows) * np.where(labels == 1, 3.0, 1.0)
    errors = (losses > math.log(2.0)).astype(np.float64)
    return losses, errors, labels


def exact_worst(losses: np.ndarray) -> float:
    return pooled.group_risk_report(np.minimum(losses, CAP), np.ones(losses.size), RHO).worst_risk


def test_one_record_moves_the_answer_by_at_most_one_in_l2_and_exactly_one_at_worst() -> None:
    query = tail.TailQuery(CAP)
    losses, errors, labels = held_out(200)
    base = tail.tail_answers(query, losses, errors, labels, 0.4)
    l1, l2 = query.sensitivity()
    for loss, error, label in [(5.0, 1.0, 1), (0.0, 0.0, 0), (0.41, 1.0, 3), (2.9, 0.0, 15)]:
        grown = tail.tail_answers(
            query, np.append(losses, loss), np.append(errors, error), np.append(labels, label), 0.4
        )
        move = grown - base
        assert np.linalg.norm(move) <= l2 + 1e-12 and np.abs(move).sum() <= l1 + 1e-12
    worst = tail.tail_answers(query, np.append(losses, 9.0), np.append(errors, 1.0), np.append(labels, 1), 0.4)
    assert np.linalg.norm(worst - base) == pytest.approx(1.0, rel=1e-12) == l2


def f_at(losses: np.ndarray, c: float) -> float:
    """F(c) = c + E[(l - c)+] / rho of the clipped losses, straight from its definition."""
    return c + float(np.maximum(np.minimum(losses, CAP) - c, 0.0).mean()) / RHO


def test_without_noise_the_bracket_holds_the_exact_value_between_the_envelope_and_the_least_f() -> None:
    losses, errors, labels = held_out(5000)
    query = tail.TailQuery(CAP)
    quantile = float(np.quantile(np.minimum(losses, CAP), 1.0 - RHO))
    exact = exact_worst(losses)
    for threshold in (quantile, quantile - 0.2, quantile + 0.3, 0.0, CAP):
        answers = tail.tail_answers(query, losses, errors, labels, threshold)
        figures = tail.tail_report(query, answers, threshold, RHO, noise_std=0.0)
        points = query.points(threshold)
        assert threshold not in (quantile - 0.2, quantile + 0.3) or threshold in points  # c-bar is a boundary
        least = min(f_at(losses, c) for c in points)
        raw = answers * query.scales(threshold)
        bounds = tail_bounds.worst_bounds(points, raw[tail.HEAD + tail.LABEL_SLOTS :], np.zeros(query.layers),
                                          np.float64(raw[0]), 0.0, RHO)  # fmt: skip
        assert float(bounds.upper) == pytest.approx(least, rel=1e-9) and figures.point in points
        # CVaR is F's minimum over every c: the least F over the boundaries is above it, the envelope below.
        assert float(bounds.lower) - 1e-9 <= exact <= least + 1e-9
        middle, bracket = (float(bounds.lower) + least) / 2.0, least - float(bounds.lower)
        assert figures.worst.value == pytest.approx(middle, rel=1e-9)
        # The interval reaches twice the bracket each side: the middle's error is a quarter of its half-width.
        assert figures.worst.low <= max(middle - 2 * bracket, 0.0) + 1e-12 <= exact
        assert exact <= middle + 2 * bracket - 1e-12 <= figures.worst.high + 1e-12
        assert figures.mean.value == pytest.approx(float(np.minimum(losses, CAP).mean()), rel=1e-9)
        assert figures.error.value == pytest.approx(float(errors.mean()), rel=1e-9)


def test_the_layers_give_f_at_every_boundary_whatever_c_bar_is() -> None:
    # T(b_j) is the sum of the layers above b_j: each clipped loss split into its parts between the boundaries.
    losses, errors, labels = held_out(3000, seed=4)
    query = tail.TailQuery(CAP)
    for threshold in (0.37, 1.234, -1.0, 7.0):
        points = query.points(threshold)
        assert points[0] == 0.0 and points[-1] == CAP and (np.diff(points) > 0).all()
        assert np.diff(points).min() >= CAP / query.layers / 2 or points[1] == threshold  # no layer pinched
        raw = tail.tail_answers(query, losses, errors, labels, threshold) * query.scales(threshold)
        tails = np.cumsum(raw[tail.HEAD + tail.LABEL_SLOTS :][::-1])[::-1]
        for c, total in zip(points[:-1], tails, strict=True):
            assert total == pytest.approx(float(np.maximum(np.minimum(losses, CAP) - c, 0.0).sum()), rel=1e-9)


@pytest.mark.parametrize(("rows", "epsilon"), [(2000, 1.0), (500, 3.0)])
def test_the_stated_intervals_cover_the_exact_figures_at_their_confidence(rows: int, epsilon: float) -> None:
    losses, errors, labels = held_out(rows, seed=rows)
    query = tail.TailQuery(CAP)
    release = tail.answer_release(epsilon, 1e-5, 1e-12, (0.0, 0.0, 0))
    sigma = math.sqrt(2.0 * release.mu) / 2.0**20
    threshold = float(np.quantile(np.minimum(losses, CAP), 1.0 - RHO)) + 0.05  # a trained c is near, not at, it
    answers = tail.tail_answers(query, losses, errors, labels, threshold)
    exact = pooled.group_risk_report(np.minimum(losses, CAP), 1.0 - errors, RHO)
    rng = np.random.default_rng(7)
    misses = {"worst": 0, "mean": 0, "disparity": 0, "reported disparity": 0}
    for _ in range(TRIALS):
        noised = answers + rng.normal(0.0, sigma, answers.size)
        figures = tail.tail_report(query, noised, threshold, RHO, noise_std=sigma, classes=2)
        for name, value in (("worst", exact.worst_risk), ("mean", exact.mean_risk), ("disparity", exact.disparity)):
            estimate = getattr(figures, name)
            misses[name] += not estimate.low <= value <= estimate.high
        # The record's disparity +/- its bound, the figure the console and final_model.json state.
        report = figures.report(RHO, sigma, CAP).to_dict()
        misses["reported disparity"] += not abs(report["disparity"] - exact.disparity) <= report["disparity_bound"]
        # Every 0-1 error figure of the record with its own stated bound.
        for name, bound in (
            ("worst_error", "group_error_bound"),
            ("best_error", "group_error_bound"),
            ("error_worst_minus_best", "group_error_bound"),
            ("error_disparity", "error_disparity_bound"),
        ):
            misses[name] = misses.get(name, 0) + (not abs(report[name] - getattr(exact, name)) <= report[bound])
    assert all(count <= ALLOWED_MISSES for count in misses.values()), misses


@pytest.mark.parametrize("offset", [0.6, -0.25])
def test_a_c_bar_off_the_quantile_neither_biases_the_estimate_nor_breaks_its_coverage(offset: float) -> None:
    # Reading F at c-bar would overstate the risk by F(c-bar) - CVaR (the old report's "room below"); the least F
    # over the boundaries does not depend on where c-bar is.
    losses, errors, labels = held_out(2000, seed=9)
    query = tail.TailQuery(CAP)
    release = tail.answer_release(1.0, 1e-5, 1e-12, (0.0, 0.0, 0))
    sigma = math.sqrt(2.0 * release.mu) / 2.0**20
    threshold = float(np.quantile(np.minimum(losses, CAP), 1.0 - RHO)) + offset
    answers = tail.tail_answers(query, losses, errors, labels, threshold)
    exact = exact_worst(losses)
    rng = np.random.default_rng(13)
    figures = [
        tail.tail_report(query, answers + rng.normal(0.0, sigma, answers.size), threshold, RHO, noise_std=sigma)
        for _ in range(TRIALS)
    ]
    values = np.array([figure.worst.value for figure in figures])
    misses = sum(not figure.worst.low <= exact <= figure.worst.high for figure in figures)
    assert misses <= ALLOWED_MISSES
    # The mean error over the trials: within 5 standard errors of 0 (a false alarm once in 3 million runs),
    # allowing the grid's own rise above the minimum (at most the step times the density there over rho, as above).
    standard_error = float(np.mean([figure.worst.half_width for figure in figures])) / tail.Z / math.sqrt(TRIALS)
    step = CAP / query.layers
    rise = step * float(np.mean(np.abs(np.minimum(losses, CAP) - threshold + offset) <= step)) / RHO
    assert -5.0 * standard_error <= float(values.mean()) - exact <= 5.0 * standard_error + rise
    assert f_at(losses, threshold) - exact > 10.0 * standard_error + rise  # what reading at c-bar would add


def test_a_noised_mean_above_its_worst_group_is_pooled_into_the_order_every_true_pair_has() -> None:
    worst, mean = tail.Estimate(0.50, 0.30, 0.70), tail.Estimate(0.60, 0.55, 0.65)
    # The least-squares point of {mean <= worst}: the inverse-variance average (sd 0.1 and 0.025 here).
    kept_worst, kept_mean = tail._feasible(worst, mean, 0.1, 0.025)
    pooled_value = (0.50 / 0.1**2 + 0.60 / 0.025**2) / (1 / 0.1**2 + 1 / 0.025**2)
    assert kept_worst.value == pytest.approx(pooled_value) == kept_mean.value
    assert (kept_worst.low, kept_worst.high, kept_mean.low, kept_mean.high) == (0.30, 0.70, 0.55, 0.65)
    assert tail._feasible(mean, worst, 0.025, 0.1) == (mean, worst)  # already in order: unchanged


def test_the_class_prior_baseline_is_the_cvar_of_minus_log_the_label_shares() -> None:
    _, _, labels = held_out(4000)
    counts = np.bincount(labels, minlength=2).astype(np.float64)
    per_row = -np.log(counts[labels] / labels.size)
    expected = pooled.group_risk_report(per_row, np.ones(labels.size), RHO).worst_risk
    assert tail.class_prior_worst_risk(counts, RHO) == pytest.approx(expected, rel=1e-9)
    # At 24% positives the worst 30% hold every positive: far above ln 2.
    assert tail.class_prior_worst_risk(counts, RHO) > 1.1 > math.log(2.0)


def test_a_count_lost_in_the_noise_is_refused_naming_the_fix() -> None:
    query = tail.TailQuery(CAP)
    losses, errors, labels = held_out(3)
    with pytest.raises(ConfigError, match="more rows or give the answers more epsilon"):
        tail.tail_report(query, tail.tail_answers(query, losses, errors, labels, 0.5), 0.5, RHO, noise_std=50.0)


def test_the_expected_half_width_falls_as_one_over_rows_and_meets_the_goal_just_past_2000_rows() -> None:
    at_2000 = tail.expected_half_width(2000, RHO, 1.0, 1e-5, CAP)
    assert tail.expected_half_width(20000, RHO, 1.0, 1e-5, CAP) == pytest.approx(at_2000 / 10, rel=1e-9)
    # The bracket's simultaneous high end costs a fifth more than 1.96 sd each side: +/- 0.0504 at 2,000 rows.
    assert tail.expected_half_width(2100, RHO, 1.0, 1e-5, CAP) < 0.05 < at_2000 < 0.051
    assert tail.rows_for(at_2000, 2000, target=at_2000 / 2) == pytest.approx(4000)


@pytest.mark.parametrize("rows", [700, 2000])
def test_the_expected_half_width_is_the_reported_intervals_within_what_its_noise_allows(rows: int) -> None:
    """The prediction against the mean realised half-width over TRIALS noises. Each end of the interval is F's noise
    at the worst group's boundary b times its z, so the mean is at least sqrt((cap - b) / cap) of the prediction
    (which takes the noise at c = 0); the low end also reads two neighbouring slopes (at most 4 layers' variance
    more) and both the row count's noise ((F - b) n_sd / n, F the exact risk): at most sqrt(1 + 4 / K + that^2)
    of it. The grid's
    bracket (a few thousandths here) stays inside the noise's reach. The prediction before the bracket, 1.96 sd
    each side, fell below that range at both sizes (0.042 and 0.120 against 0.051 and 0.140 realised)."""
    losses, errors, labels = held_out(rows, seed=3)
    query, c_bar = tail.TailQuery(CAP), float(np.quantile(np.minimum(losses, CAP), 1.0 - RHO))
    sigma = math.sqrt(2.0 * tail.answer_release(1.0, 1e-5, 1e-12, (0.0, 0.0, 0)).mu) / 2.0**20
    answers = tail.tail_answers(query, losses, errors, labels, c_bar)
    boundary = tail.tail_report(query, answers, c_bar, RHO, noise_std=0.0).point
    rng = np.random.default_rng(rows)
    halves = [
        tail.tail_report(
            query, answers + rng.normal(0.0, sigma, answers.size), c_bar, RHO, noise_std=sigma
        ).worst.half_width
        for _ in range(TRIALS)
    ]
    realised, spread = float(np.mean(halves)), 3.0 * float(np.std(halves)) / math.sqrt(TRIALS)
    predicted = tail.expected_half_width(rows, RHO, 1.0, 1e-5, CAP)
    noise_at_zero = tail.noise_at_zero(sigma, rows, RHO, CAP) / tail.Z  # one sd of F(0)
    rows_term = (exact_worst(losses) - boundary) * sigma / math.sqrt(tail.SHARES["rows"]) / rows / noise_at_zero
    least = math.sqrt((CAP - boundary) / CAP) * predicted
    most = math.sqrt(1.0 + 4.0 / tail.LAYERS + rows_term**2) * predicted
    assert least - spread <= realised <= most + spread, (least, realised, most)


def test_losses_above_the_cap_are_counted_and_the_figures_are_of_the_clipped_losses() -> None:
    query = tail.TailQuery(CAP)
    losses, errors, labels = held_out(4000)
    heavy = np.concatenate([losses, np.full(200, 8.0)])
    wrong, classes = np.concatenate([errors, np.ones(200)]), np.concatenate([labels, np.ones(200, dtype=np.int64)])
    threshold = float(np.quantile(np.minimum(heavy, CAP), 1.0 - RHO))
    figures = tail.tail_report(
        query, tail.tail_answers(query, heavy, wrong, classes, threshold), threshold, RHO, noise_std=0.0
    )
    assert figures.above_cap.value == pytest.approx(float((heavy > CAP).sum()), rel=1e-9)
    clipped, unclipped = exact_worst(heavy), pooled.group_risk_report(heavy, np.ones(heavy.size), RHO).worst_risk
    # The figure is the clipped losses' (each above the cap counted as the cap), an estimate with its interval.
    assert figures.worst.low <= clipped <= figures.worst.high < unclipped
    assert abs(figures.worst.value - clipped) <= figures.worst.half_width / 4.0


def with_tail(rows: int, share: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`held_out` with a `share` of its rows' losses drawn again uniformly above the cap, up to 3 caps."""
    losses, errors, labels = held_out(rows, seed)
    rng = np.random.default_rng(seed + 1)
    beyond = rng.random(rows) < share
    losses[beyond] = rng.uniform(CAP, 3 * CAP, int(beyond.sum()))
    errors[beyond] = 1.0
    return losses, errors, labels


def test_the_unclipped_worst_group_risk_lies_between_the_low_end_and_the_caps_consequence() -> None:
    # Exact sums: CVaR(l) <= CVaR(min(l, cap)) + E[(l - cap)+] / rho <= top + share * (max - cap), the
    # first step an equality when every row above the cap is in the worst group (here 4.4% of 30%).
    query = tail.TailQuery(CAP)
    losses, errors, labels = with_tail(4000, 0.044, 3)
    threshold = float(np.quantile(np.minimum(losses, CAP), 1.0 - RHO))
    figures = tail.tail_report(
        query, tail.tail_answers(query, losses, errors, labels, threshold), threshold, RHO, noise_std=0.0
    )
    above = float((losses > CAP).sum())
    assert figures.cap_share.value == pytest.approx(above / (RHO * losses.size), rel=1e-9)
    unclipped = pooled.group_risk_report(losses, np.ones(losses.size), RHO).worst_risk
    excess = float(np.maximum(losses - CAP, 0.0).sum()) / (RHO * losses.size)
    assert unclipped == pytest.approx(exact_worst(losses) + excess, rel=1e-9)
    top = figures.unclipped_high(CAP, float(losses.max()))
    assert figures.worst.low <= exact_worst(losses) < unclipped <= top + 1e-9
    # The bound is loose by the worst group's share times the excess it does not know: max - mean above the cap.
    mean_excess = float(np.maximum(losses - CAP, 0.0).sum()) / above
    slack = figures.cap_share.value * (float(losses.max()) - CAP - mean_excess)
    assert top - unclipped == pytest.approx(slack + figures.worst.high - exact_worst(losses), abs=1e-9)


@pytest.mark.parametrize("rows", [700, 2000])
def test_under_noise_the_low_end_and_the_caps_consequence_hold_the_unclipped_value(rows: int) -> None:
    # The rehearsal: 31 of 700 held-out losses above the cap 3, a count the noise cannot resolve.
    losses, errors, labels = with_tail(rows, 31 / 700, rows)
    query = tail.TailQuery(CAP)
    release = tail.answer_release(1.0, 1e-5, 1e-12, (0.0, 0.0, 0))
    sigma = math.sqrt(2.0 * release.mu) / 2.0**20
    threshold = float(np.quantile(np.minimum(losses, CAP), 1.0 - RHO)) + 0.05
    answers = tail.tail_answers(query, losses, errors, labels, threshold)
    unclipped = pooled.group_risk_report(losses, np.ones(rows), RHO).worst_risk
    rng = np.random.default_rng(11)
    clipped = exact_worst(losses)
    misses = {"low": 0, "high": 0, "clipped": 0}
    for _ in range(TRIALS):
        figures = tail.tail_report(
            query, answers + rng.normal(0.0, sigma, answers.size), threshold, RHO, noise_std=sigma
        )
        misses["low"] += not figures.worst.low <= unclipped
        misses["high"] += not unclipped <= figures.unclipped_high(CAP, 3 * CAP)
        # Whatever the count above the cap, the figure is an estimate of the clipped losses' risk with both ends.
        misses["clipped"] += not figures.worst.low <= clipped <= figures.worst.high
        assert 0.0 < figures.worst.high - figures.worst.low < CAP
    # Each end claims 97.5% one-sided; together at least 95%.
    assert all(count <= ALLOWED_MISSES for count in misses.values()), misses
    assert unclipped > exact_worst(losses) + 0.2  # the clipped figure alone would understate it


def test_the_noised_report_states_no_best_group_risk_and_a_disparity_of_worst_against_the_rest() -> None:
    losses, errors, labels = held_out(2000, seed=3)
    query = tail.TailQuery(CAP)
    threshold = float(np.quantile(np.minimum(losses, CAP), 1.0 - RHO))
    release = tail.answer_release(1.0, 1e-5, 1e-12, (0.0, 0.0, 0))
    sigma = math.sqrt(2.0 * release.mu) / 2.0**20
    noised = tail.tail_answers(query, losses, errors, labels, threshold)
    noised = noised + np.random.default_rng(5).normal(0.0, sigma, noised.size)
    figures = tail.tail_report(query, noised, threshold, RHO, noise_std=sigma, classes=2)
    report = figures.report(RHO, sigma, CAP)
    # The answers hold no best-group query: no figure for it, nor for the gap to it, in the record.
    assert report.best_risk is None and report.worst_minus_best is None
    record = report.to_dict()
    assert not {"best_risk", "best_risk_gap", "worst_minus_best"} & set(record), sorted(record)
    # The disparity is the worst group against the other 1 - rho, from the two figures the answers estimate.
    assert record["disparity"] == pytest.approx((figures.worst.value - figures.mean.value) / (1.0 - RHO), rel=1e-12)
    assert record["disparity_bound"] == pytest.approx(figures.disparity.half_width, rel=1e-12)


@given(
    st.floats(-50.0, 50.0),
    st.floats(0.0, 10.0),
    st.floats(0.0, 10.0),
    st.floats(-5.0, 5.0),
    st.floats(0.1, 20.0),
)
def test_a_clamped_interval_covers_what_the_unclamped_one_does_and_never_collapses_for_noise(
    value: float, below: float, above: float, low: float, span: float
) -> None:
    high = low + span
    estimate = tail._clamped(value, below, above, low, high)
    assert low <= estimate.low <= estimate.value <= estimate.high <= high
    # Every feasible true value the noise's interval covers is still covered.
    for truth in np.linspace(low, high, 11):
        if value - below <= truth <= value + above:
            assert estimate.low <= truth <= estimate.high
    # A draw beyond a bound keeps the noise's reach from it: no "0 +/- 0" for a noised count.
    if value + above < low:
        assert estimate.high == min(low + above, high)
    if value - below > high:
        assert estimate.low == max(high - below, low)


def test_label_counts_the_noise_took_below_zero_give_the_one_row_bound_that_a_record_can_hold() -> None:
    """A draw whose noised label counts add up to 0 or less (likely at few rows or little epsilon) once made the
    noise infinite, and the aggregator died writing it to the round log (JSON holds no infinity)."""
    query = tail.TailQuery(CAP)
    losses, errors, labels = held_out(400)
    threshold = float(np.quantile(np.minimum(losses, CAP), 1.0 - RHO))
    answers = tail.tail_answers(query, losses, errors, labels, threshold)
    answers[tail.HEAD : tail.HEAD + tail.LABEL_SLOTS] = -1.0  # every label count noised below 0
    figures = tail.tail_report(query, answers, threshold, RHO, noise_std=1.0, classes=2)
    layers_var = (query.scales(threshold)[tail.HEAD + tail.LABEL_SLOTS :]) ** 2
    one_row = tail_bounds.resolution_noise(query.points(threshold), layers_var, threshold, 1.0, RHO)
    assert figures.worst_noise == pytest.approx(float(one_row), rel=1e-12) and figures.worst_noise > CAP
    json.dumps(figures.report(RHO, 1.0, CAP).to_dict(), allow_nan=False)  # as the round log writes it
