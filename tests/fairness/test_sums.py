"""Federated group risk from secure sums (`fedfair.fairness.sums`) against the exact pooled report.

The exact numbers come from `pooled.group_risk_report` on the pooled losses; the
federated ones only from the sum of the institutions' evaluation vectors, as secure
aggregation returns it. They must agree within the certified gap the report carries
(plus float64 rounding, see `rounding`), and that gap must itself respect the
worst-case bound g(hi) (hi - lo) for the threshold pair it rests on: the consecutive
pair at the group boundary, or the narrowest wider pair holding `min_bucket_count`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.core.objective import cvar
from fedfair.fairness import histogram, pooled, sums
from fedfair.fairness.report import GroupRiskReport, SecureSumCertificate
from tests.fairness.strategies import loss_vectors, rhos, scale

ROUNDING = 1e-9
"""Float64 rounding allowance for the realistic test sets below (16k samples, losses up to ~100)."""


def institutions(seed: int, sizes: tuple[int, ...] = (13946, 1561, 774)) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Held-out cross-entropy-like losses (a heavy tail, many near 0) and 0/1 errors per institution."""
    rng = np.random.default_rng(seed)
    losses = [rng.exponential(0.4, size) * rng.choice([0.2, 1.0, 4.0], size) for size in sizes]
    errors = [(rng.random(size) < 0.1 + 0.2 * index).astype(float) for index, size in enumerate(sizes)]
    return losses, errors


def summed_answers(losses: list[np.ndarray], errors: list[np.ndarray], grid: np.ndarray) -> np.ndarray:
    """What one secure-sum round returns: the institutions' evaluation vectors, added up."""
    summed: np.ndarray = np.sum([sums.local_answers(loss, error, grid) for loss, error in zip(losses, errors)], axis=0)
    return summed


def federated(
    losses: list[np.ndarray],
    errors: list[np.ndarray],
    loss_range: tuple[float, float],
    rho: float,
    sum_error: float = 0.0,
    thresholds: int = sums.THRESHOLDS,
    min_bucket_count: int = 1,
) -> GroupRiskReport:
    """The report from the summed answers on the grid of `loss_range` (1: never widen, the bare contract)."""
    grid = sums.threshold_grid(loss_range, thresholds)
    summed = summed_answers(losses, errors, grid)
    return sums.report_from_sums(summed, grid, rho, sum_error=sum_error, min_bucket_count=min_bucket_count)


def certificate_of(report: GroupRiskReport) -> SecureSumCertificate:
    assert report.certificate is not None, "a report from sums is certified"
    return report.certificate


def leaves_of(summed: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The leaf counts (rounded: they are integers) and leaf offset sums of a summed evaluation vector."""
    nodes = 2 * grid.size - 1
    return np.rint(summed[: grid.size]), summed[nodes : nodes + grid.size]


def slope_counts(losses: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """By brute force, the counts the report's slopes use: #{l > t} at each t, and for the negated losses
    at -t in increasing order #{l <= t} (#{l < 0} = 0 at t_0 = 0); losses clipped at the grid's top."""
    clipped = np.minimum(losses, grid[-1])
    negated = np.array([np.count_nonzero(clipped <= t) for t in grid[::-1]], dtype=np.float64)
    negated[-1] = 0.0
    return np.array([np.count_nonzero(clipped > t) for t in grid], dtype=np.float64), negated


def boundary(counts: np.ndarray, total: float, rho: float) -> int:
    """The index of the first threshold with at most a rho-fraction of the values above it."""
    return int(np.flatnonzero(counts <= rho * total)[0])


def worst_case_gap(grid: np.ndarray, counts: np.ndarray, total: float, rho: float) -> float:
    """g(hi) (hi - lo) for the consecutive thresholds lo < hi around the group boundary; 0 when hi is the first."""
    high = boundary(counts, total, rho)
    if high == 0:
        return 0.0
    return float((1.0 - counts[high] / (rho * total)) * (grid[high] - grid[high - 1]))


def rounding(values: np.ndarray, rho: float, grid: np.ndarray) -> float:
    """Float64 rounding of a federated risk, F(t) = t + S(t) / (rho n) at a threshold t of the grid.

    S(t) is a suffix sum of n values of size at most `scale`, less t times a count of
    at most rho n: off by about n eps (n scale) + eps |t| rho n + eps |S|, with
    |S| <= rho n (scale + |t|). Divided by rho n that is n eps scale / rho + 2 eps
    (scale + |t|); the exact CVaR rounds the same way. The gap's lower supporting line
    sits at the threshold below the boundary, where up to all n values lie above t: its
    slope 1 - count / (rho n) reaches 1 - 1 / rho, and slope times t (as large as the
    grid's 10^4 sentinel) is rounded there, which adds eps |t| / rho. A factor 8 covers
    the sum over institutions and the few operations after it.
    """
    eps = float(np.finfo(np.float64).eps)
    extent = float(np.abs(grid).max())
    return 8 * eps * (values.size * scale(values) / rho + scale(values) + extent / rho)


@st.composite
def split_test_sets(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Pooled losses, pooled 0/1 errors, and a random split of the samples into up to 5 institutions.

    An institution may hold no samples at all: it answers zeros.
    """
    losses = draw(loss_vectors)
    errors = np.array(draw(st.lists(st.booleans(), min_size=losses.size, max_size=losses.size)), dtype=np.float64)
    order = np.array(draw(st.permutations(range(losses.size))), dtype=np.intp)
    cuts = sorted(draw(st.lists(st.integers(0, losses.size), max_size=4)))
    return losses, errors, np.split(order, cuts)


loss_ranges = st.one_of(
    st.just(sums.LOSS_RANGE),
    st.tuples(st.floats(0.0, 10.0), st.floats(0.01, 25.0)).map(lambda pair: (pair[0], pair[0] + pair[1])),
)
grid_sizes = st.sampled_from([8, 64, sums.THRESHOLDS])


@given(split_test_sets(), rhos, loss_ranges, grid_sizes)
# A loss beyond the range at a small rho: the lower supporting line then rests on the 10^4 sentinel.
@example((np.array([3.3919930837143912]), np.array([0.0]), [np.array([0])]), 0.01171875, (0.0, 3.0), 8)
def test_any_split_gives_the_pooled_report_within_the_certified_gap(
    test_set: tuple[np.ndarray, np.ndarray, list[np.ndarray]],
    rho: float,
    loss_range: tuple[float, float],
    thresholds: int,
) -> None:
    losses, errors, parts = test_set
    exact = pooled.group_risk_report(losses, 1.0 - errors, rho)
    report = federated(
        [losses[part] for part in parts], [errors[part] for part in parts], loss_range, rho, 0.0, thresholds
    )
    certificate = certificate_of(report)
    grid = sums.threshold_grid(loss_range, thresholds)
    tolerance = rounding(losses, rho, grid)
    assert certificate.samples == losses.size
    # F(hi) >= CVaR_rho: the worst group is reported from above, the best (worst of -l) from below.
    assert -tolerance <= report.worst_risk - exact.worst_risk <= certificate.worst_risk_gap + tolerance
    assert -tolerance <= exact.best_risk - report.best_risk <= certificate.best_risk_gap + tolerance
    assert abs(report.mean_risk - exact.mean_risk) <= tolerance and certificate.mean_error_bound == 0.0
    # Error-rate groups need only the error count: exact, whatever the split.
    for key in ("accuracy", "mean_error", "worst_error", "best_error", "error_disparity"):
        assert getattr(report, key) == pytest.approx(getattr(exact, key), abs=1e-12)
    # The certified gap is never wider than the grid allows at the group boundary.
    above, negated = slope_counts(losses, grid)
    worst_bound = worst_case_gap(grid, above, losses.size, rho)
    best_bound = worst_case_gap(-grid[::-1], negated, losses.size, rho)
    assert 0.0 <= certificate.worst_risk_gap <= worst_bound + tolerance
    assert 0.0 <= certificate.best_risk_gap <= best_bound + tolerance


@given(split_test_sets(), rhos, loss_ranges)
def test_zero_one_values_have_their_exact_cvar_within_the_gap(
    test_set: tuple[np.ndarray, np.ndarray, list[np.ndarray]], rho: float, loss_range: tuple[float, float]
) -> None:
    # Heavy ties at 0 and 1, and the first threshold on a tie: the contract still holds for 0-1 values as losses.
    _, errors, parts = test_set
    report = federated([errors[part] for part in parts], [errors[part] for part in parts], loss_range, rho)
    tolerance = rounding(errors, rho, sums.threshold_grid(loss_range))
    assert -tolerance <= report.worst_risk - cvar(errors, rho) <= certificate_of(report).worst_risk_gap + tolerance
    # The closed-form error group from the count is the same number.
    assert report.worst_error == pytest.approx(cvar(errors, rho), abs=1e-12)


@given(split_test_sets(), loss_ranges)
def test_answers_are_a_histogram_tree_whose_cumulative_sums_are_the_threshold_sums(
    test_set: tuple[np.ndarray, np.ndarray, list[np.ndarray]], loss_range: tuple[float, float]
) -> None:
    losses, errors, parts = test_set
    grid = sums.threshold_grid(loss_range, 64)
    k, nodes = grid.size, 2 * grid.size - 1
    whole = sums.local_answers(losses, errors, grid)
    assert whole.size == sums.vector_length(k) == 2 * nodes + 1 and whole[-1] == errors.sum()
    # Leaf 0 holds the losses equal to t_0 = 0, leaf i those in (t_{i-1}, t_i]; every parent is its two children.
    edges = [(losses == 0.0)] + [(losses > low) & (losses <= high) for low, high in zip(grid[:-1], grid[1:])]
    leaves, leaf_offsets = leaves_of(whole, grid)
    assert np.array_equal(leaves, [np.count_nonzero(mask) for mask in edges])
    counts, offsets = whole[:nodes], whole[nodes : 2 * nodes]
    start = 0
    for size in (k >> level for level in range(k.bit_length())):
        level_counts, level_offsets = counts[start : start + size], offsets[start : start + size]
        assert level_counts.sum() == losses.size and np.all((0 <= level_offsets) & (level_offsets <= level_counts))
        if size > 1:
            assert np.array_equal(
                level_counts[::2] + level_counts[1::2], counts[start + size : start + size + size // 2]
            )
        start += size
    # Each leaf's loss sum is its lower end times its count plus its width times its offset sum.
    lows = grid[np.maximum(np.arange(k) - 1, 0)]
    widths = grid - lows
    assert np.allclose(lows * leaves + widths * leaf_offsets, [losses[mask].sum() for mask in edges], atol=1e-9)
    # The cumulative counts and sums the aggregator forms after decoding: A(t), S(t), #{l <= t}, sum (t - l)+.
    above, excess, at_most, shortfall = sums.cumulative(leaves, leaf_offsets, grid)
    assert np.array_equal(above, [np.count_nonzero(losses > t) for t in grid])
    assert np.array_equal(at_most, [np.count_nonzero(losses <= t) for t in grid])
    assert np.allclose(excess, [np.maximum(losses - t, 0.0).sum() for t in grid], rtol=1e-12, atol=1e-9)
    assert np.allclose(shortfall, [np.maximum(t - losses, 0.0).sum() for t in grid], rtol=1e-12, atol=1e-9)
    split = summed_answers([losses[part] for part in parts], [errors[part] for part in parts], grid)
    integers = np.r_[0:nodes, -1]
    assert np.array_equal(split[integers], whole[integers]), "integer counts add up exactly"
    assert np.allclose(split, whole, rtol=1e-12, atol=1e-12)


@given(loss_vectors, st.sampled_from([8, 64, sums.THRESHOLDS]))
def test_one_record_moves_the_vector_by_at_most_the_stated_sensitivity(losses: np.ndarray, thresholds: int) -> None:
    grid = sums.threshold_grid(sums.LOSS_RANGE, thresholds)
    errors = np.zeros(losses.size)
    errors[::2] = 1.0
    with_all = sums.local_answers(losses, errors, grid)
    without_first = sums.local_answers(losses[1:], errors[1:], grid)
    moved = np.abs(with_all - without_first)
    l1, l2 = histogram.record_sensitivity(thresholds)
    assert moved.sum() <= l1 + 1e-9 and np.sqrt((moved**2).sum()) <= l2 + 1e-9
    # Exactly one count per level and the error count: the L1 bound is met by the counts alone but for offsets.
    assert np.count_nonzero(moved[: 2 * thresholds - 1]) == thresholds.bit_length()
    assert (sums.RECORD_L1, sums.RECORD_L2) == histogram.record_sensitivity(sums.THRESHOLDS) == (27.0, np.sqrt(27.0))


def test_an_institution_without_held_out_data_answers_zeros() -> None:
    answers = sums.local_answers(np.array([]), np.array([]), sums.threshold_grid())
    assert answers.shape == (sums.vector_length(),) and not answers.any()


@pytest.mark.parametrize("rho", [0.05, 0.1, 0.3, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("loss_range", [sums.LOSS_RANGE, (0.0, 1.0), (2.0, 8.0)])
def test_secure_sums_give_the_exact_group_risks_within_the_certified_gap(
    rho: float, loss_range: tuple[float, float]
) -> None:
    losses, errors = institutions(seed=int(rho * 100))
    losses_pooled, errors_pooled = np.concatenate(losses), np.concatenate(errors)
    exact = pooled.group_risk_report(losses_pooled, 1.0 - errors_pooled, rho)
    # The plan's default minimum bucket: the report may widen the boundary pair, never lose the contract.
    report = federated(losses, errors, loss_range, rho, min_bucket_count=sums.MIN_BUCKET_COUNT)
    certificate = certificate_of(report)
    assert certificate.samples == losses_pooled.size
    assert -ROUNDING <= report.worst_risk - exact.worst_risk <= certificate.worst_risk_gap + ROUNDING
    assert -ROUNDING <= exact.best_risk - report.best_risk <= certificate.best_risk_gap + ROUNDING
    assert report.mean_risk == pytest.approx(exact.mean_risk, abs=ROUNDING)
    for key in ("accuracy", "mean_error", "worst_error", "best_error", "error_disparity"):
        assert getattr(report, key) == pytest.approx(getattr(exact, key), abs=1e-12)
    # Dense grid where the worst group's boundary is: the gap is tiny there, even with 10 samples per bracket.
    low, high = loss_range
    if low < np.quantile(losses_pooled, 1.0 - rho) < high:
        assert certificate.worst_risk_gap < 1e-4


def test_the_gap_respects_the_worst_case_bound() -> None:
    losses, errors = institutions(seed=3)
    losses_pooled = np.concatenate(losses)
    rho = 0.3
    grid = sums.threshold_grid()
    summed = summed_answers(losses, errors, grid)
    counts, excess, _, _ = sums.cumulative(*leaves_of(summed, grid), grid)
    bound = sums.cvar_from_sums(grid, counts, excess, losses_pooled.size, rho, values_at_least_first=True)
    assert 0.0 <= bound.gap <= worst_case_gap(grid, counts, losses_pooled.size, rho) + ROUNDING
    assert abs(bound.value - pooled.worst_group_risk(losses_pooled, rho)) <= bound.gap + ROUNDING


@given(split_test_sets(), rhos, st.sampled_from([2, 5, 10]))
def test_a_thin_boundary_bucket_is_widened_to_the_narrowest_pair_that_holds_enough(
    test_set: tuple[np.ndarray, np.ndarray, list[np.ndarray]], rho: float, least: int
) -> None:
    losses, errors, parts = test_set
    grid = sums.threshold_grid(sums.LOSS_RANGE, 64)
    k = grid.size
    summed = summed_answers([losses[part] for part in parts], [errors[part] for part in parts], grid)
    counts, excess, _, _ = sums.cumulative(*leaves_of(summed, grid), grid)
    total = float(losses.size)

    def bound(minimum: int) -> sums.RiskBound:
        return sums.cvar_from_sums(
            grid, counts, excess, total, rho, values_at_least_first=True, min_bucket_count=minimum
        )

    high = boundary(counts, total, rho)
    if high == 0:  # t_0 is a minimiser: no bracket, nothing to widen
        assert bound(least) == bound(1) and bound(least).bracket is None
        return
    low = high - 1
    # Every pair around the consecutive one, by brute force: those holding enough, and the narrowest of them.
    pairs = [(i, j) for i in range(low + 1) for j in range(high, k) if counts[i] - counts[j] >= least]
    if not pairs:
        with pytest.raises(ConfigError, match=f"fewer than {least} held-out values"):
            bound(least)
        return
    widened = bound(least)
    assert widened.bucket >= least and widened.bracket is not None
    narrowest = min(grid[j] - grid[i] for i, j in pairs)
    assert widened.bracket[1] - widened.bracket[0] == narrowest
    assert widened.bracket[0] <= grid[low] and widened.bracket[1] >= grid[high]
    if counts[low] - counts[high] >= least:
        assert widened == bound(1)  # already enough: the consecutive pair itself
    # The contract holds for the wider pair: exact CVaR within the gap, gap within g(hi') (hi' - lo').
    tolerance = rounding(losses, rho, grid)
    assert -tolerance <= widened.value - cvar(losses, rho) <= widened.gap + tolerance
    lower_index, upper_index = np.searchsorted(grid, widened.bracket)
    slope = 1.0 - counts[upper_index] / (rho * total)
    assert 0.0 <= widened.gap <= slope * (grid[upper_index] - grid[lower_index]) + tolerance


def test_a_report_never_rests_on_fewer_samples_than_min_bucket_count() -> None:
    # Spread-out losses where the grid is geometric (about 1.1 % apart): buckets of a few samples each.
    losses = [np.linspace(100.0, 1000.0, 180), np.linspace(101.0, 999.0, 120)]
    errors = [np.zeros(180), np.zeros(120)]
    rho = 0.11  # rho n = 33 falls inside a bucket, not on a threshold: the gap is not 0
    grid = sums.threshold_grid()
    summed = summed_answers(losses, errors, grid)
    counts, excess, _, _ = sums.cumulative(*leaves_of(summed, grid), grid)
    thin = sums.cvar_from_sums(grid, counts, excess, 300, rho, values_at_least_first=True)
    assert thin.bucket < sums.MIN_BUCKET_COUNT  # the consecutive pair at the boundary is thin here
    widened = sums.cvar_from_sums(
        grid,
        counts,
        excess,
        300,
        rho,
        values_at_least_first=True,
        min_bucket_count=sums.MIN_BUCKET_COUNT,
    )
    assert widened.bucket >= sums.MIN_BUCKET_COUNT and widened.gap > thin.gap
    report = sums.report_from_sums(summed, grid, rho)  # the default minimum bucket
    assert certificate_of(report).worst_risk_gap == widened.gap and report.worst_risk == widened.value
    exact = cvar(np.concatenate(losses), rho)
    assert report.worst_risk - certificate_of(report).worst_risk_gap <= exact + ROUNDING
    assert exact <= report.worst_risk + ROUNDING
    # Fewer samples in the whole evaluation than the minimum: no report at all.
    few = summed_answers([np.array([0.5, 1.0, 2.0])], [np.zeros(3)], grid)
    with pytest.raises(ConfigError, match="3 held-out samples, fewer than min_bucket_count = 10"):
        sums.report_from_sums(few, grid, 0.5)
    allowed = sums.report_from_sums(few, grid, 0.5, min_bucket_count=1)
    exact_few = cvar(np.array([0.5, 1.0, 2.0]), 0.5)
    assert allowed.worst_risk - certificate_of(allowed).worst_risk_gap <= exact_few + ROUNDING
    assert exact_few <= allowed.worst_risk + ROUNDING
    # Enough samples, but fewer than the minimum between any two thresholds around the boundary.
    mostly_positive = summed_answers([np.r_[np.zeros(5), np.linspace(1.0, 2.0, 15)]], [np.zeros(20)], grid)
    with pytest.raises(ConfigError, match="fewer than 18 held-out values lie between any two thresholds"):
        sums.report_from_sums(mostly_positive, grid, 0.5, min_bucket_count=18)


@pytest.mark.parametrize("loss_range", [sums.LOSS_RANGE, (0.0, 1e-3), (0.5, 1.5), (9000.0, 1e4), (0.0, 1e4)])
def test_the_grid_is_a_function_of_the_plans_loss_range_only(loss_range: tuple[float, float]) -> None:
    grid = sums.threshold_grid(loss_range)
    # Fixed length whatever the range (points that coincide are topped up below the top), 0 first, increasing.
    assert grid.size == sums.THRESHOLDS and grid[0] == 0.0 and np.all(np.diff(grid) > 0)
    assert grid[-1] == sums.GEOMETRIC_RANGE[1]
    # The dense half: evenly spaced over the range, all of it present.
    dense = np.linspace(*loss_range, sums.THRESHOLDS // 2)
    assert np.isin(dense, grid).all()
    assert np.array_equal(grid, sums.threshold_grid(loss_range))  # both sides compute the same thresholds


def test_the_raw_sums_reveal_the_pooled_histogram_and_bucket_sums_on_the_grid() -> None:
    """What the module doc tells the threat model: the aggregator decodes these, whatever min_bucket_count is."""
    losses, errors = institutions(seed=7, sizes=(300, 200))
    pooled_losses = np.concatenate(losses)
    grid = sums.threshold_grid(sums.LOSS_RANGE, 64)
    leaves, offsets = leaves_of(summed_answers(losses, errors, grid), grid)
    bucket_sums = grid[:-1] * leaves[1:] + np.diff(grid) * offsets[1:]
    inside = [(pooled_losses > low) & (pooled_losses <= high) for low, high in itertools.pairwise(grid)]
    assert np.array_equal(leaves[1:], [np.count_nonzero(mask) for mask in inside])
    assert np.allclose(bucket_sums, [pooled_losses[mask].sum() for mask in inside], rtol=1e-9, atol=1e-9)
    # A bucket holding one loss gives it exactly: min_bucket_count protects the report, not the sums.
    single = int(np.flatnonzero(leaves[1:] == 1)[0])
    assert bucket_sums[single] == pytest.approx(pooled_losses[inside[single]][0], abs=1e-9)


def test_the_encoding_error_widens_the_gap_by_the_occupied_leaves_width_and_counts_stay_exact() -> None:
    losses, errors = institutions(seed=5)
    rho, sum_error = 0.3, 3 * 2.0**-20  # three parties' stochastic rounding, as the secure sum reports it
    plain = certificate_of(federated(losses, errors, sums.LOSS_RANGE, rho))
    rounded = certificate_of(federated(losses, errors, sums.LOSS_RANGE, rho, sum_error=sum_error))
    pooled_losses = np.concatenate(losses)
    total = pooled_losses.size
    grid = sums.threshold_grid()
    # Each S sums occupied leaves' offsets times their widths: W, at most the largest loss plus a leaf.
    occupied = np.unique(np.searchsorted(grid, pooled_losses[pooled_losses > 0], side="left"))
    width = float((grid[occupied] - grid[occupied - 1]).sum())
    assert width <= pooled_losses.max()
    assert rounded.worst_risk_gap == pytest.approx(plain.worst_risk_gap + 2 * sum_error * width / (rho * total))
    assert rounded.mean_error_bound == pytest.approx(sum_error * width / total)


def test_one_institution_answers_only_fixed_size_sums() -> None:
    grid = sums.threshold_grid()
    assert grid.size == sums.THRESHOLDS and grid[0] == 0.0 and np.all(np.diff(grid) > 0)
    small, large = np.array([0.1, 2.0]), np.random.default_rng(0).exponential(1.0, 50_000)
    for losses in (small, large):
        answers = sums.local_answers(losses, np.zeros(losses.size), grid)
        assert answers.shape == (sums.vector_length(),) == (4 * sums.THRESHOLDS - 1,)
    answers = sums.local_answers(small, np.array([1.0, 0.0]), grid)
    nodes = 2 * grid.size - 1
    # The root (last count) holds both; its offsets are the losses over the grid's span; then the error count.
    assert answers[nodes - 1] == 2 and answers[2 * nodes - 1] == pytest.approx(2.1 / grid[-1])
    assert answers[-1] == 1.0


def test_a_report_from_sums_writes_its_keys_in_the_federated_order() -> None:
    losses, errors = [np.array([1.0, 2.0]), np.array([3.0, 6.0])], [np.array([0.0, 0.0]), np.array([1.0, 1.0])]
    report = federated(losses, errors, sums.LOSS_RANGE, 0.25)
    assert isinstance(report, GroupRiskReport)
    assert list(report.to_dict()) == [
        "rho",
        "samples",
        "mean_risk",
        "worst_risk",
        "best_risk",
        "disparity",
        "worst_minus_best",
        "accuracy",
        "mean_error",
        "worst_error",
        "best_error",
        "error_disparity",
        "error_worst_minus_best",
        "worst_risk_gap",
        "best_risk_gap",
        "mean_error_bound",
        "error_rate_bound",
        "disparity_bound",
        "noise_std",
        "confidence",
        "loss_cap",
    ]
    assert report.to_dict()["samples"] == 4
    assert report.disparity == (report.worst_risk - report.mean_risk) / (1 - 0.25)
    assert report.worst_minus_best == report.worst_risk - report.best_risk
    assert report.error_worst_minus_best == report.worst_error - report.best_error
    with pytest.raises(AttributeError):
        report.rho = 0.5  # type: ignore[misc]


def test_edge_cases() -> None:
    # More than (1 - rho) of the losses are exactly 0: the worst group holds every positive loss.
    losses = [np.concatenate([np.zeros(90), np.linspace(1, 2, 10)])]
    errors = [np.zeros(100)]
    report = federated(losses, errors, sums.LOSS_RANGE, 0.3, min_bucket_count=sums.MIN_BUCKET_COUNT)
    exact = pooled.group_risk_report(losses[0], np.ones(100), 0.3)
    assert report.worst_risk == pytest.approx(exact.worst_risk) and report.best_risk == pytest.approx(0.0)
    with pytest.raises(ConfigError, match="diverged"):
        sums.local_answers(np.array([np.nan]), np.zeros(1), sums.threshold_grid())
    # Losses above the grid's top count as the top, and the certificate says so.
    diverged = federated([np.full(10, 1e6)], [np.zeros(10)], sums.LOSS_RANGE, 0.3)
    top = certificate_of(diverged).loss_cap
    assert top == sums.GEOMETRIC_RANGE[1] and diverged.worst_risk == top
    assert diverged.mean_risk == pytest.approx(top, rel=1e-12)
    assert diverged.best_risk <= top <= diverged.best_risk + certificate_of(diverged).best_risk_gap
    with pytest.raises(ConfigError, match="no held-out samples"):
        sums.report_from_sums(np.zeros(sums.vector_length()), sums.threshold_grid(), 0.3)
    with pytest.raises(ConfigError, match="expected"):
        sums.report_from_sums(np.zeros(sums.vector_length() + 1), sums.threshold_grid(), 0.3)


GRID = sums.threshold_grid(sums.LOSS_RANGE, 8)
ONES = np.ones(GRID.size)


@pytest.mark.parametrize(
    ("refused", "message"),
    [
        (lambda: federated([np.array([1.0, 2.0])], [np.zeros(2)], sums.LOSS_RANGE, 0.0), "rho must be in"),
        (lambda: federated([np.array([1.0, 2.0])], [np.zeros(2)], sums.LOSS_RANGE, 1.5), "rho must be in"),
        (lambda: sums.threshold_grid(sums.LOSS_RANGE, 7), "at least 8 thresholds"),
        (lambda: sums.threshold_grid((-1.0, 3.0)), "0 <= low < high"),
        (lambda: sums.threshold_grid((2.0, 2.0)), "0 <= low < high"),
        (lambda: sums.threshold_grid((0.0, float("nan"))), "0 <= low < high"),
        (lambda: sums.threshold_grid((0.0, 1e5)), "0 <= low < high <= 10000"),
        (lambda: sums.cvar_from_sums(GRID, ONES, ONES, 2.0, 0.5, min_bucket_count=0), "at least 1"),
        (lambda: sums.local_answers(np.array([-0.5]), np.zeros(1), GRID), "non-negative"),
        (lambda: sums.local_answers(np.ones(2), np.zeros(3), GRID), "one entry per held-out sample"),
        (lambda: sums.local_answers(np.ones(2), np.array([0.0, 0.5]), GRID), "0 or 1 per held-out sample"),
        (lambda: sums.vector_length(100), "power of two"),
        (lambda: sums.report_from_sums(np.zeros(31), GRID, 0.5, noise_std=-1.0), "non-negative"),
        (lambda: sums.report_from_sums(np.zeros(31), GRID, 0.5, noise_std=1.0, loss_cap=0.0), "loss cap"),
        (lambda: sums.report_from_sums(np.zeros(31), GRID, 0.5, noise_std=1.0, failure=0.0), "failure"),
        # Values below the first threshold, which therefore cannot be shown to be a minimiser.
        (lambda: sums.cvar_from_sums(GRID, ONES, ONES, 2.0, 0.5), "start above the group boundary"),
        (lambda: sums.cvar_from_sums(GRID, ONES, ONES, 0.0, 0.5), "no held-out samples"),
    ],
)
def test_bad_arguments_are_refused(refused: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        refused()
