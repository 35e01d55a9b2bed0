"""The worst-group risk's bracket and interval (`fedfair.fairness.tail_bounds`) on loss shapes beyond smooth ones.

Noise-free, the bracket [lower, upper] must hold the exact CVaR of the clipped losses for every loss shape
(continuous, a few values, one value, heavy tails), whatever c-bar is; the interval has width 0 only when the
figure is exact (no noise and no bracket). Under noise, the stated interval claims 95%: over T noises its misses
are at most Binomial(T, 0.05), and the coverage test allows that law's quantile of 1 - 1e-6.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedfair.fairness import pooled, tail, tail_bounds

CAP = 3.0
TRIALS = 2000
ALLOWED_MISSES = int(stats.binom.ppf(1.0 - 1e-6, TRIALS, 1.0 - tail.CONFIDENCE))


def exact_worst(losses: np.ndarray, rho: float) -> float:
    return pooled.group_risk_report(np.minimum(losses, CAP), np.ones(losses.size), rho).worst_risk


def noise_free(losses: np.ndarray, rho: float, threshold: float) -> tail_bounds.WorstBounds:
    """The bounds from the exact answers: no noise in any coordinate."""
    query = tail.TailQuery(CAP)
    raw = tail.tail_answers(query, losses, np.zeros(losses.size), np.zeros(losses.size, np.int64), threshold)
    raw = raw * query.scales(threshold)
    layers = raw[tail.HEAD + tail.LABEL_SLOTS :]
    return tail_bounds.worst_bounds(query.points(threshold), layers, np.zeros(layers.size), raw[0], 0.0, rho)


shapes = st.one_of(
    st.lists(st.floats(0.0, 8.0), min_size=1, max_size=80),  # continuous, past the cap
    st.lists(st.sampled_from([0.05, 0.33, 0.537, 0.81, 1.47, 2.2, 3.0, 5.0]), min_size=1, max_size=80),  # few values
    st.tuples(st.floats(0.0, 4.0), st.integers(1, 50)).map(lambda pair: [pair[0]] * pair[1]),  # one value
)


@settings(max_examples=300, deadline=None)
@given(shapes, st.floats(0.02, 0.98), st.floats(-1.0, 4.0))
def test_noise_free_the_bracket_holds_the_exact_worst_group_risk(
    values: list[float], rho: float, threshold: float
) -> None:
    losses = np.array(values)
    bounds = noise_free(losses, rho, threshold)
    exact = exact_worst(losses, rho)
    # Float sums of up to 80 values below 8: their rounding is far below 1e-9.
    assert float(bounds.lower) <= exact + 1e-9 <= float(bounds.upper) + 2e-9
    assert float(bounds.low) <= float(bounds.lower) + 1e-12 and float(bounds.upper) <= float(bounds.high) + 1e-12
    # The point is the bracket's middle: its error at most a quarter (here a fifth) of the half-width.
    half = (float(bounds.high) - float(bounds.low)) / 2.0
    assert abs(float(bounds.value) - exact) <= half / 4.0 + 1e-9
    # Width 0 only for an exact figure: a bracket of width 0 (one value on a boundary, or every loss at 0).
    if float(bounds.high) - float(bounds.low) <= 0.0:
        assert float(bounds.upper) - float(bounds.lower) <= 1e-12 and abs(float(bounds.value) - exact) <= 1e-9


def test_one_value_off_the_grid_is_bracketed_and_its_envelope_is_exact() -> None:
    # The constant losses: the least F over the boundaries is (1 - rho) of a step above CVaR = the value.
    losses = np.full(2000, 0.53)
    bounds = noise_free(losses, 0.3, 0.3)
    assert float(bounds.lower) == pytest.approx(0.53, abs=1e-12)  # one value: a kink, the envelope is exact
    assert float(bounds.upper) == pytest.approx(0.60, abs=1e-9)  # F at the next boundary
    assert float(bounds.low) < 0.53 < 0.60 < float(bounds.high)


@pytest.mark.parametrize(
    ("shape", "rho"),
    [("discrete", 0.3), ("constant", 0.3), ("heavy tail", 0.05)],
)
def test_under_noise_the_interval_covers_the_exact_value_at_its_confidence_and_never_has_width_0(
    shape: str, rho: float
) -> None:
    rng = np.random.default_rng(77)
    rows = 2000
    losses = {
        "discrete": rng.choice([0.05, 0.33, 0.81, 1.47, 2.2], rows, p=[0.4, 0.25, 0.2, 0.1, 0.05]),
        "constant": np.full(rows, 0.53),
        "heavy tail": np.exp(rng.normal(-1.5, 1.2, rows)),
    }[shape]
    query, threshold = tail.TailQuery(CAP), 1.0 if shape == "heavy tail" else 0.3
    release = tail.answer_release(1.0, 1e-5, 1e-12, (0.0, 0.0, 0))
    sigma = math.sqrt(2.0 * release.mu) / 2.0**20
    answers = tail.tail_answers(query, losses, np.zeros(rows), np.zeros(rows, np.int64), threshold)
    scales = query.scales(threshold)
    raw = (answers + rng.normal(0.0, sigma, (TRIALS, answers.size))) * scales
    head = tail.HEAD + tail.LABEL_SLOTS
    sd = sigma * scales
    bounds = tail_bounds.worst_bounds(query.points(threshold), raw[:, head:], sd[head:] ** 2, raw[:, 0], sd[0], rho)
    exact = exact_worst(losses, rho)
    misses = int(np.sum((bounds.low > exact) | (exact > bounds.high)))
    assert misses <= ALLOWED_MISSES, (misses, ALLOWED_MISSES)
    assert (bounds.high - bounds.low > 0.0).all()
    # One noise read by the report itself: the same interval, nowhere of width 0.
    figures = tail.tail_report(query, raw[0] / scales, threshold, rho, noise_std=sigma, classes=1)
    assert (figures.worst.low, figures.worst.high) == pytest.approx((bounds.low[0], bounds.high[0]), rel=1e-12)


def test_the_high_end_holds_at_every_boundary_at_once() -> None:
    # 30 even layers: the least of 30 standardised walk values, about 2.73 (Bonferroni would take 3.15).
    z = tail_bounds.simultaneous_z(np.full(30, 0.01))
    assert 2.6 < z < 2.85 and z > tail_bounds.Z_ONE_SIDED
    assert tail_bounds.simultaneous_z(np.array([4.0])) == pytest.approx(1.96, abs=0.04)  # one boundary: one z
    assert tail_bounds.simultaneous_z(np.zeros(30)) == tail_bounds.Z_ONE_SIDED


def test_whether_resolved_is_decided_on_the_label_counts_rows_not_the_figure_s_own_noise() -> None:
    points, variances = np.linspace(0.0, CAP, 31), np.full(30, 4.0)
    at = tail_bounds.resolution_noise(points, variances, 0.3, np.array([2000.0, 1000.0, 0.0]), 0.3)
    # The 27 layers above c-bar = 0.3; half the rows, twice the noise; none counted, never resolved.
    assert at[0] == pytest.approx(tail_bounds.Z_ONE_SIDED * math.sqrt(27 * 4.0) / 600.0, rel=1e-12)
    assert at[1] == pytest.approx(2 * at[0], rel=1e-12) and at[2] == math.inf
