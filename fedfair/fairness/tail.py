"""The noised evaluation: layered tail sums of the clipped losses, and group risks with 95% intervals.

CVaR_rho = min over c of F(c) = c + T(c) / (rho n), with T(c) the sum of (l - c)+ over the held-out
losses l clipped at the cap. Each site sends, beside its row count, error count, count above the cap
and label counts, the losses cut into layers: between boundaries 0 = b_0 < ... < b_K = cap (an even
grid, its interior point nearest the trained threshold c-bar moved onto it) the sum of
clip(l - b_j, 0, b_(j+1) - b_j). One record moves every layer by at most its width, so the layers
cost the privacy of one tail sum at c = 0, yet T(b_j) is the sum of the layers above b_j: F is known
at every boundary, with noise that shrinks towards the cap. The worst-group risk's interval holds both the
noise and the grid's discretisation (:mod:`fedfair.fairness.tail_bounds`: F's convexity bounds its least value
between the boundaries), with T(0) / n as the mean, each with a 95% interval; the figures are of the clipped
losses, the count above the cap its own estimate. Why: docs/design.md, "Inside the fairness library".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.fairness import sums, tail_bounds
from fedfair.fairness.report import GroupRiskReport, SecureSumCertificate
from fedfair.privacy import distributed, rounding

LAYERS = 30
"""How many layers the clipped losses are cut into (chosen by ``benchmarks/eval_error.py``): F is known every
cap / 30 (0.1 at the cap 3), close enough that the minimum over the boundaries misses the true one by a few
thousandths, while the noise of T(c) does not depend on how many layers there are."""

LABEL_SLOTS = 16
"""Label counts each site sends (labels 0..15; a federation with more classes gets no class-prior baseline)."""

SHARES = {"rows": 0.05, "errors": 0.02, "above_cap": 0.02, "labels": 0.02, "layers": 0.89}
"""Each part's share of the release's squared L2 sensitivity (they add up to 1): most goes to the layers, whose
noise the worst-group risk carries divided by rho n; the rows' share is the one that balances the two noises of
F = c + T / (rho n) at 700 rows (the row count's enters as (F - c) / n per row). Set by that argument, not
searched."""

HEAD = 3
"""The answer's first coordinates: rows, errors, losses above the cap."""

CONFIDENCE = 0.95
"""The stated intervals' nominal coverage."""

Z = 1.959963984540054
"""The standard normal's 97.5% quantile: the noise is a sum of many independent Skellam shares."""

RESOLVED = 0.05
"""The half-width the warnings aim at: a worst-group risk known to +/- this is resolved."""


@dataclass(frozen=True)
class TailQuery:
    """The public shape of a noised evaluation answer: the cap and the number of layers below it.

    Both sides derive it from the plan, so the vector's length and weights never travel.
    """

    cap: float
    layers: int = LAYERS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.cap) and self.cap > 0):
            raise ConfigError(f"the loss cap must be a positive number, got {self.cap}; set [evaluation] loss_range")
        if self.layers < 1:
            raise ConfigError(f"a noised evaluation needs at least one layer below the cap, got {self.layers}")

    @property
    def length(self) -> int:
        """The answer's length: rows, errors, above the cap, the label slots, then one sum per layer."""
        return HEAD + LABEL_SLOTS + self.layers

    def points(self, threshold: float) -> np.ndarray:
        """The K + 1 boundaries 0 = b_0 < ... < b_K = cap: the even grid, its interior point nearest c-bar moved onto it.

        The move keeps every layer at least half a grid step wide (c-bar lies within half a step of the point it
        moves), except a first layer (0, c-bar) for c-bar within half a step of 0, still positive.
        """
        if not math.isfinite(threshold):
            raise ConfigError(f"the evaluated model's threshold c must be finite, got {threshold}")
        points: np.ndarray = np.linspace(0.0, self.cap, self.layers + 1)
        if self.layers > 1 and 0.0 < threshold < self.cap:
            points[1 + int(np.argmin(np.abs(points[1:-1] - threshold)))] = threshold
        return points

    def weights(self) -> np.ndarray:
        """w_i per coordinate: one record moves coordinate i by at most w_i, and sum w_i^2 over what it moves is 1."""
        weights: np.ndarray = np.sqrt(
            np.concatenate(
                [
                    [SHARES["rows"], SHARES["errors"], SHARES["above_cap"]],
                    np.full(LABEL_SLOTS, SHARES["labels"]),
                    np.full(self.layers, SHARES["layers"] / self.layers),
                ]
            )
        )
        return weights

    def sensitivity(self) -> tuple[float, float]:
        """(L1, L2) of one record's move, in real units: it moves rows, errors, above-cap, one label and every layer.

        The layers' weights do not depend on c-bar, so neither does either norm.
        """
        w = self.weights()
        l1 = float(w[:HEAD].sum() + w[HEAD] + w[HEAD + LABEL_SLOTS :].sum())
        l2 = math.sqrt(float((w[:HEAD] ** 2).sum() + w[HEAD] ** 2 + (w[HEAD + LABEL_SLOTS :] ** 2).sum()))
        assert abs(l2 - 1.0) < 1e-9  # the shares add up to 1
        return l1, l2

    def scales(self, threshold: float) -> np.ndarray:
        """Delta_i / w_i per coordinate: a decoded coordinate times this is the raw sum it estimates."""
        deltas = np.concatenate([np.ones(HEAD + LABEL_SLOTS), np.diff(self.points(threshold))])
        scaled: np.ndarray = deltas / self.weights()
        return scaled


def tail_answers(
    query: TailQuery, losses: np.ndarray, errors: np.ndarray, labels: np.ndarray, threshold: float
) -> np.ndarray:
    """One site's noised-evaluation vector (before noise): its raw sums divided by :meth:`TailQuery.scales`.

    Args:
        query: the plan's query.
        losses: per held-out row, its non-negative loss.
        errors: per row, 1 if the model gets it wrong, else 0.
        labels: per row, its integer label.
        threshold: the evaluated model's c-bar (one of the layers' boundaries).
    """
    values = np.asarray(losses, dtype=np.float64).reshape(-1)
    wrong = np.asarray(errors, dtype=np.float64).reshape(-1)
    classes = np.asarray(labels).reshape(-1).astype(np.int64)
    if not values.shape == wrong.shape == classes.shape:
        raise ConfigError("losses, errors and labels need one entry per held-out row")
    if not np.isfinite(values).all() or (values < 0).any():
        raise ConfigError("held-out losses must be finite and non-negative; the evaluated model has diverged")
    if not np.isin(wrong, (0.0, 1.0)).all():
        raise ConfigError("errors must be 0 or 1 per held-out row")
    clipped = np.minimum(values, query.cap)
    points = query.points(threshold)
    counted = classes[(classes >= 0) & (classes < LABEL_SLOTS)]
    layers = np.clip(clipped[None, :] - points[:-1, None], 0.0, np.diff(points)[:, None]).sum(axis=1)
    raw = np.concatenate(
        [
            [float(values.size), float(wrong.sum()), float((values > query.cap).sum())],
            np.bincount(counted, minlength=LABEL_SLOTS).astype(np.float64),
            layers,
        ]
    )
    answers: np.ndarray = raw / query.scales(threshold)
    return answers


@dataclass(frozen=True)
class Estimate:
    """A figure with its 95% interval [low, high] (kept inside the figure's range)."""

    value: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        """Half the interval's width."""
        return (self.high - self.low) / 2.0


def _clamped(value: float, below: float, above: float, low: float, high: float) -> Estimate:
    """[value - below, value + above] inside [low, high], its middle the reported value.

    A draw so far out that the whole interval lies beyond a bound keeps the noise's reach from that bound
    ([low, low + above], or [high - below, high]) rather than collapsing to a point: a count read as
    "0 +/- 0" would claim an exactness the noise never gave. Every true value the unclamped interval covers
    stays covered, so the coverage is at least the unclamped one's.
    """
    lower, upper = max(value - below, low), min(value + above, high)
    if lower > high:
        lower, upper = max(high - below, low), high
    elif upper < low:
        lower, upper = low, min(low + above, high)
    return Estimate((lower + upper) / 2.0, lower, upper)


def class_prior_worst_risk(counts: np.ndarray, rho: float) -> float:
    """CVaR_rho of the class-prior classifier's cross-entropy: it predicts every class at its share of the rows.

    A row of class k then loses -ln p_k; the worst rho-fraction holds the rarest classes first.
    Noised counts below 1 count as 1 (a class of the model is never predicted at 0).
    """
    shares = np.maximum(np.asarray(counts, dtype=np.float64), 1.0)
    shares = shares / shares.sum()
    order = np.argsort(shares)
    remaining, total = rho, 0.0
    for index in order:
        taken = min(remaining, float(shares[index]))
        total += taken * -math.log(float(shares[index]))
        remaining -= taken
        if remaining <= 0.0:
            break
    return total / rho


@dataclass(frozen=True)
class TailReport:
    """The noised evaluation's figures, each with its interval, and the class-prior baseline."""

    rows: Estimate
    above_cap: Estimate
    """Held-out rows whose loss exceeds the cap: each counts as the cap in every figure."""
    cap_share: Estimate
    """Those rows as a share of the worst rho-fraction: see :meth:`unclipped_high`."""
    worst: Estimate
    mean: Estimate
    disparity: Estimate
    error: Estimate
    point: float
    """The boundary b_j where F is least: the worst group's boundary as the noised answers place it."""
    prior_worst: float | None
    """The class-prior classifier's worst-rho risk (None when the classes exceed :data:`LABEL_SLOTS`)."""
    worst_noise: float = 0.0
    """The noise's 95% half-width of F at c-bar, over rows counted apart from the figures' own noise: whether the
    figure is resolved (:func:`fedfair.fairness.tail_bounds.resolution_noise`), and the scale the fixes shrink."""

    def unclipped_high(self, cap: float, loss_max: float) -> float:
        """An upper end for the worst-group risk of the losses themselves, were none above `loss_max`.

        CVaR_rho(l) <= CVaR_rho(min(l, cap)) + E[(l - cap)+] / rho, and E[(l - cap)+] is at most the share of
        rows above the cap times (loss_max - cap): so the interval's top plus the worst group's share at the cap
        times the excess. Each end is one-sided 97.5%, so the sum holds with probability at least 95%.
        """
        return self.worst.high + self.cap_share.high * max(loss_max - cap, 0.0)

    def report(self, rho: float, noise_std: float, cap: float) -> GroupRiskReport:
        """As the federation's :class:`GroupRiskReport`: every bound the 95% half-width of its figure.

        The answers do not query the best group, so its risk (and the worst-minus-best gap) is None, not
        measured: the mean alone says only that it lies between 0 and the mean. The disparity is the paper's,
        the worst group against the other 1 - rho, which the worst-group and mean answers do estimate.
        """
        return GroupRiskReport.from_risks(
            rho=rho,
            mean_risk=self.mean.value,
            worst_risk=self.worst.value,
            best_risk=None,
            mean_error=self.error.value,
            worst_error=min(self.error.value, rho) / rho,
            best_error=max(self.error.value - (1.0 - rho), 0.0) / rho,
            certificate=SecureSumCertificate(
                samples=int(round(max(self.rows.value, 0.0))),
                worst_risk_gap=self.worst.half_width,
                best_risk_gap=None,
                mean_error_bound=self.mean.half_width,
                error_rate_bound=self.error.half_width,
                disparity_bound=self.disparity.half_width,
                noise_std=noise_std,
                confidence=CONFIDENCE,
                loss_cap=cap,
                worst_risk_low=self.worst.low,
                worst_risk_high=self.worst.high,
                prior_worst_risk=self.prior_worst,
                above_cap=self.above_cap.value,
                above_cap_bound=self.above_cap.half_width,
                cap_share_high=self.cap_share.high,
                worst_risk_noise=self.worst_noise,
                group_error_bound=self.error.half_width / rho,
                error_disparity_bound=0.0 if rho >= 1.0 else self.error.half_width * max(1.0 / rho, 1.0 / (1.0 - rho)),
            ),
        )


def _feasible(worst: Estimate, mean: Estimate, worst_sd: float, mean_sd: float) -> tuple[Estimate, Estimate]:
    """The two estimates in the order every true pair has (mean <= worst): unchanged when they already are.

    Otherwise both move to their inverse-variance-weighted average, the least-squares point of that order, kept
    inside each interval (which the move leaves as it is: each still covers its own figure as often).
    """
    if mean.value <= worst.value:
        return worst, mean
    weights = (1.0 / max(worst_sd, 1e-300) ** 2, 1.0 / max(mean_sd, 1e-300) ** 2)
    pooled = (weights[0] * worst.value + weights[1] * mean.value) / (weights[0] + weights[1])
    return (
        Estimate(min(max(pooled, worst.low), worst.high), worst.low, worst.high),
        Estimate(min(max(pooled, mean.low), mean.high), mean.low, mean.high),
    )


def tail_report(
    query: TailQuery,
    summed: np.ndarray,
    threshold: float,
    rho: float,
    *,
    noise_std: float,
    sum_error: float = 0.0,
    classes: int | None = None,
) -> TailReport:
    """The figures from the decoded sum of the sites' :func:`tail_answers`, with 95% intervals.

    `noise_std` is the standard deviation of each decoded coordinate's noise and `sum_error`
    bounds each one's rounding error (both real units); `classes` is the model's K. The worst-group
    risk is the middle of the bracket the grid leaves for min over c of F(c) = c + T(c) / (rho n), its
    interval from :func:`fedfair.fairness.tail_bounds.worst_bounds`; the mean T(0) / n; the disparity their
    difference over 1 - rho, with its variance from the layers they share (at the boundary whose noised F is
    least). All are of the losses clipped at the cap. The worst-group risk's `worst_noise` is
    :func:`fedfair.fairness.tail_bounds.resolution_noise` over the label counts' rows (at least one) when `classes`
    fits the label slots (else over the row count), the scale that says whether it is resolved; finite.

    Raises:
        ConfigError: a sum of the wrong length, or one that holds no rows.
    """
    if summed.size != query.length:
        raise ConfigError(f"a noised evaluation sum has {summed.size} entries; expected {query.length}")
    if not 0.0 < rho < 1.0:
        raise ConfigError(f"rho must be in (0, 1) for a noised evaluation, got {rho}")
    scales = query.scales(threshold)
    raw = np.asarray(summed, dtype=np.float64) * scales
    # Rounding is deterministic and tiny (2^-20 per coordinate); it widens the noise's sd as if it were noise.
    sd = np.hypot(noise_std, sum_error) * scales
    cap = query.cap
    n, n_sd = float(raw[0]), float(sd[0])
    if not n > Z * n_sd:
        raise ConfigError(
            f"the noised evaluation counts {n:.0f} held-out rows, within its noise (+/- {Z * n_sd:.0f}); "
            "evaluate on more rows or give the answers more epsilon ([privacy] report_epsilon)"
        )
    mass = rho * n
    error_value = float(raw[1]) / n
    error_sd = math.hypot(float(sd[1]) / n, error_value * n_sd / n)
    error = _clamped(error_value, Z * error_sd, Z * error_sd, 0.0, 1.0)
    points = query.points(threshold)
    layers, layers_var = raw[HEAD + LABEL_SLOTS :], sd[HEAD + LABEL_SLOTS :] ** 2
    # T(b_j) and its noise's variance for j = 0..K: the layers above b_j (none at the cap).
    tails = np.append(np.cumsum(layers[::-1])[::-1], 0.0)
    tails_var = np.append(np.cumsum(layers_var[::-1])[::-1], 0.0)
    mean_value = float(tails[0]) / n
    mean_sd = math.hypot(math.sqrt(float(tails_var[0])) / n, mean_value * n_sd / n)
    mean = _clamped(mean_value, Z * mean_sd, Z * mean_sd, 0.0, cap)
    bounds = tail_bounds.worst_bounds(points, layers, layers_var, n, n_sd, rho)
    value, point = float(bounds.value), float(bounds.point)
    chosen = int(np.searchsorted(points, point))
    worst = Estimate(value, float(bounds.low), float(bounds.high))
    worst_sd = (worst.high - worst.low) / 2.0 / Z
    worst, mean = _feasible(worst, mean, worst_sd, mean_sd)
    # worst - mean = b_j + T(b_j) (1 / rho - 1) / n - (the layers below b_j) / n: two independent noises.
    gap = value - mean_value
    gap_sd = math.sqrt(
        float(tails_var[chosen]) * ((1.0 - rho) / mass) ** 2
        + float(tails_var[0] - tails_var[chosen]) / n**2
        + ((gap - point) * n_sd / n) ** 2
    )
    disparity = _clamped(gap / (1.0 - rho), Z * gap_sd / (1.0 - rho), Z * gap_sd / (1.0 - rho), 0.0, cap / (1.0 - rho))
    rows = Estimate(n, n - Z * n_sd, n + Z * n_sd)
    above_cap = _clamped(float(raw[2]), Z * float(sd[2]), Z * float(sd[2]), 0.0, n + Z * n_sd)
    share_sd = math.hypot(float(sd[2]) / mass, float(raw[2]) / mass * n_sd / n)
    # Not kept below 1: past it the worst group is all at the cap, and the bound it gives still holds.
    cap_share = _clamped(float(raw[2]) / mass, Z * share_sd, Z * share_sd, 0.0, math.inf)
    labels = raw[HEAD : HEAD + LABEL_SLOTS]
    prior = None if classes is None or classes > LABEL_SLOTS else class_prior_worst_risk(labels[:classes], rho)
    # Over the label counts' rows where they count every row (a noise of its own), else over the row count.
    counted = float(labels.sum()) if classes is not None and classes <= LABEL_SLOTS else n
    # At least one row: the evaluation holds rows (its count cleared its noise above), so the noise over one row
    # bounds the true one from above. Label counts the noise took to 0 or below (likely when the rows are few
    # against it) read as that finite, wide bound, not as infinity, which no JSON record (the round log) can hold.
    noise = float(tail_bounds.resolution_noise(points, layers_var, threshold, max(counted, 1.0), rho))
    return TailReport(rows, above_cap, cap_share, worst, mean, disparity, error, point, prior, noise)


def answer_release(
    epsilon: float, delta: float, beta: float, extra: tuple[float, float, int], *, layers: int = LAYERS
) -> distributed.Release:
    """The Skellam release of one noised answer at `epsilon`, with `extra` (L1, L2, coordinates) appended.

    Mu is the total the decoded sum carries from the honest parties; sensitivities in encoded
    units (the evaluation encoding's 2^20) after stochastic rounding at failure `beta`, which
    the caller counts in delta. `layers`: the query's (:class:`TailQuery`), which its length and L1 depend on.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"an evaluation answer's epsilon must be a positive number, got {epsilon}")
    query = TailQuery(1.0, layers)
    l1, l2 = query.sensitivity()
    l1, l2 = l1 + extra[0], math.hypot(l2, extra[1])
    scale = math.ldexp(1.0, sums.ENCODING.fractional_bits)
    dimension = query.length + extra[2]
    rounded = rounding.rounded_l2(l2 * scale, dimension, beta)
    shape = distributed.Release("skellam", 1.0, l1 * scale + dimension, rounded)
    mu = distributed.calibrate(epsilon, delta - beta, [shape])
    return distributed.Release("skellam", mu, shape.l1, shape.l2)


def expected_half_width(
    rows: float, rho: float, epsilon: float, delta: float, cap: float, *, beta: float = 1e-12, excess: float = 1.0
) -> float:
    """The 95% half-width the noise gives the reported worst-group interval over `rows` held-out rows at `epsilon`.

    The interval reaches 1.96 sd below and z_s sd above (its high end holds at every boundary at once:
    :func:`fedfair.fairness.tail_bounds.simultaneous_z`, 2.73 for 30 even layers), so half of both times the
    noise of F at c = 0 (:func:`noise_at_zero`: an upper bound for F's at the worst group's boundary b, (cap - b)
    / cap of its variance, and within sqrt(1 + 4 / K) of the low end's, which reads two neighbours' slopes too),
    with the decoded noise `excess` times the target's (:func:`fedfair.privacy.distributed.noise_excess`). The
    noise's part only: where the grid's bracket, reached 2.5 times each side, is wider (a floor of about 0.014 on
    Adult's losses past 20,000 rows), the interval is that. Used by ``fedfair data check`` and
    ``benchmarks/eval_error.py``.
    """
    release = answer_release(epsilon, delta, beta, (0.0, 0.0, 0))
    sigma = math.sqrt(2.0 * release.mu * excess) / math.ldexp(1.0, sums.ENCODING.fractional_bits)
    both_ends = (Z + tail_bounds.simultaneous_z(np.ones(LAYERS))) / 2.0
    return noise_at_zero(sigma, rows, rho, cap) / Z * both_ends


def noise_at_zero(noise_std: float, rows: float, rho: float, cap: float) -> float:
    """The 95% half-width (1.96 sd) the noise gives F(0) = T(0) / (rho rows) when each decoded coordinate's is `noise_std`.

    T(0) carries every layer's noise, so on the even grid this bounds F's noise at every boundary from above (at
    b it is (cap - b) / cap of its variance), the resolution noise at c-bar included.
    """
    # Each layer's real noise is noise_std * width * sqrt(K / share); K layers of width cap / K add up to this.
    return Z * noise_std * cap / math.sqrt(SHARES["layers"]) / (rho * rows)


def count_margin(noise_std: float, part: str) -> float:
    """The 95% margin, in rows, of the noised row count (`part` "rows") or of the label counts' sum ("labels").

    When each decoded coordinate's noise is `noise_std`. Over an evaluation whose rows lie within the labels' margin
    their sum may be near 0 or below, and the resolution noise, taken over it (at least one row), is then that of a
    handful of rows: no scale to size a fix from.
    """
    slots = LABEL_SLOTS if part == "labels" else 1
    return Z * noise_std * math.sqrt(slots / SHARES[part])


def rows_for(half_width: float, at_rows: float, target: float = RESOLVED) -> float:
    """The held-out rows that shrink `half_width` (measured at `at_rows`) to `target`: it falls as 1 / rows."""
    return at_rows * half_width / target


def epsilon_for(half_width: float, at_epsilon: float, target: float = RESOLVED) -> float:
    """The epsilon that shrinks `half_width` (measured at `at_epsilon`) to `target`: noise falls about as 1 / epsilon."""
    return at_epsilon * half_width / target
