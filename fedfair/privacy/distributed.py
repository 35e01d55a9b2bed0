"""Accounting for distributed DP: the Skellam mechanism inside the secure sum, its rounding, its calibration.

Every party adds Skellam noise to its encoded (integer) vector before masking; the aggregator only ever
decodes the sum, whose noise is Skellam(mu) with mu the sum of the honest parties' shares. One record
moves that integer sum by a vector of L2 norm at most ``l2`` and L1 norm at most ``l1`` (in encoded
units, after scaling by 2^f and stochastic rounding). This module turns such releases into (epsilon,
delta):

Why: docs/design.md, "Inside the privacy library".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.privacy.ring import Ring
from fedfair.privacy.rounding import delta_addon, expected_rounding_rdp

ORDERS: tuple[int, ...] = (*range(2, 65), 72, 80, 96, 112, 128, 160, 192, 256)
"""Integer Renyi orders alpha the accountant evaluates (subsampling's bound needs integers)."""

MECHANISMS = ("skellam", "gaussian")
"""Mechanisms a :class:`Release` may name: "gaussian" is a site's own DP-SGD step (:func:`gaussian_release`)."""

AMPLIFICATIONS = ("steinke", "zhu_wang")
"""Bounds for Poisson subsampling (:func:`subsampled_rdp`)."""

ROUNDING_BETA = 2.0**-80
"""beta of each party's conditional rounding (its rounded vector's norm bound, :mod:`fedfair.secagg.noise`): a delta
add-on far below any delta in use (:func:`~fedfair.privacy.rounding.delta_addon`). Training charges the record's
rounded shift in expectation (:func:`~fedfair.privacy.rounding.expected_rounding_rdp`), free of beta."""

WRAP_FAILURE = 2.0**-40
"""The probability per noised sum the encoder accepts that it wraps or leaves its stated range."""

SENSITIVITY_UNITS = 2.0**12
"""Training encodes one record's contribution as between 2^11 and 2^12 units (the fractional bits
chosen to fit): the rounding inflation of the noise, about d / (8 Delta^2) relative, stays
below 1% for d up to 3 x 10^5, and 64-bit words keep 30 bits of room above it."""

MAX_PARTIES = 10**6
"""The delta add-on of training is counted for up to this many parties, so a collaborator can count
it without knowing how many there are."""


@dataclass(frozen=True)
class Release:
    """One kind of message a party contributes to, charged to its budget.

    mechanism: "skellam" (noise added inside the secure sum), or "gaussian" (a site's own DP-SGD: Gaussian noise of
        variance 2 mu on a query that one record moves by l2 in L2, l1 = 0; its RDP is Skellam's bound at l1 = 0,
        alpha l2^2 / (4 mu), exactly the Gaussian's).
    mu: the Skellam parameter of the noise in the decoded sum per coordinate (variance 2 mu), counting
        only the honest parties the plan guarantees (:func:`party_mu`); encoded units.
    l1, l2: how far one record moves the integer sum, in L1 and L2 norm (after rounding:
        :func:`~fedfair.privacy.rounding.rounded_l2`, :func:`~fedfair.privacy.rounding.rounded_l1`); encoded units.
        With ``rounding``, how far it moves the real vector before a stochastic rounding.
    sampling_rate: q, the Poisson sampling rate of the records (1 when every record takes part).
    steps: how many such releases (training steps, evaluation queries).
    amplification: how subsampling is accounted (:data:`AMPLIFICATIONS`, :func:`subsampled_rdp`).
    rounding: m, the coordinates stochastically rounded after the shift by l1, l2, whose RDP is then charged in
        expectation over the rounding (:func:`~fedfair.privacy.rounding.expected_rounding_rdp`); 0 when l1 and l2
        already bound the integer shift.
    """

    mechanism: str
    mu: float
    l1: float
    l2: float
    sampling_rate: float = 1.0
    steps: int = 1
    amplification: str = "steinke"
    rounding: int = 0

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ConfigError(f"unknown DP mechanism {self.mechanism!r}; use one of {', '.join(MECHANISMS)}")
        if not (math.isfinite(self.mu) and self.mu > 0):
            raise ConfigError(f"mu={self.mu!r} must be positive and finite; calibrate it with calibrate()")
        for name, value in (("l1", self.l1), ("l2", self.l2)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name}={value!r} must be a finite sensitivity >= 0")
        if not 0.0 < self.sampling_rate <= 1.0:
            raise ConfigError(f"sampling_rate={self.sampling_rate!r} must be in (0, 1]")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ConfigError(f"steps={self.steps!r} must be a count >= 0")
        if self.amplification not in AMPLIFICATIONS:
            raise ConfigError(f"unknown amplification {self.amplification!r}; use one of {', '.join(AMPLIFICATIONS)}")
        if isinstance(self.rounding, bool) or not isinstance(self.rounding, int) or self.rounding < 0:
            raise ConfigError(f"rounding={self.rounding!r} must be a count of coordinates >= 0")
        if self.mechanism == "gaussian" and (self.l1 != 0.0 or self.rounding):
            raise ConfigError("a gaussian release has no integer rounding: l1 and rounding must be 0")


def gaussian_release(noise_multiplier: float, sampling_rate: float, steps: int) -> Release:
    """`steps` DP-SGD steps of noise multiplier sigma > 0 on a Poisson sample of rate q, as a :class:`Release`.

    Clip 1 and noise std sigma: l2 = 1, variance 2 mu = sigma^2. At every integer order its subsampled RDP
    (:func:`subsampled_rdp`, Steinke's bound) is the sampled Gaussian's exactly (Mironov, Talwar and Zhang 2019).

    Raises:
        ConfigError: sigma is not positive: a step without noise has no finite epsilon.
    """
    if not noise_multiplier > 0.0:
        raise ConfigError(f"a DP-SGD step of noise multiplier {noise_multiplier!r} has no finite epsilon")
    return Release("gaussian", noise_multiplier * noise_multiplier / 2.0, 0.0, 1.0, sampling_rate, steps)


def skellam_rdp(alpha: float, mu: float, l1: float, l2: float) -> float:
    """RDP of order alpha > 1 of Skellam(mu) noise per coordinate on an integer query of sensitivities l1, l2.

    Agarwal, Kairouz and Liu 2021, Theorem 3.5 for Sk(mu, mu):

        alpha l2^2 / (4 mu) + min(((2 alpha - 1) l2^2 + 6 l1) / (16 mu^2), 3 l1 / (4 mu)).

    The first term is the Gaussian's of the same variance 2 mu; the second, the price of integrality,
    vanishes as mu grows.

    Raises:
        ConfigError: alpha <= 1.
    """
    if not alpha > 1:
        raise ConfigError(f"Renyi order alpha={alpha!r} must exceed 1")
    gaussian = alpha * l2 * l2 / (4.0 * mu)
    return gaussian + min(((2.0 * alpha - 1.0) * l2 * l2 + 6.0 * l1) / (16.0 * mu * mu), 3.0 * l1 / (4.0 * mu))


def skellam_log_pmf(values: np.ndarray, mu: float) -> np.ndarray:
    """Log P[Skellam(mu) = k] for the integers ``values``.

    Log(e^(-2 mu) I_|k|(2 mu)) with the scaled Bessel function (scipy's ``ive``); -inf where that underflows
    (below about e^-745).
    """
    from scipy import special

    with np.errstate(divide="ignore"):
        return np.asarray(np.log(special.ive(np.abs(values), 2.0 * mu)), dtype=np.float64)


def skellam_rdp_exact(alpha: float, mu: float, shift: int) -> float:
    """The exact Renyi divergence D_alpha(Sk(mu) + shift || Sk(mu)) of one coordinate.

    It sums p(k - shift)^alpha p(k)^(1 - alpha) in log space over every k where both masses are
    representable; the tilted terms it leaves out lie beyond 35 standard deviations, whose total is
    below e^-600 relative to the sum for the orders and shifts of the tests (alpha shift^2 / mu well
    below 100).

    Raises:
        ConfigError: alpha <= 1.
    """
    if not alpha > 1:
        raise ConfigError(f"Renyi order alpha={alpha!r} must exceed 1")
    spread = math.ceil(40.0 * math.sqrt(2.0 * mu) + 40.0)
    values = np.arange(-spread - abs(shift), spread + abs(shift) + 1)
    log_p = skellam_log_pmf(values - shift, mu)
    log_q = skellam_log_pmf(values, mu)
    usable = np.isfinite(log_p) & np.isfinite(log_q)
    terms = alpha * log_p[usable] + (1.0 - alpha) * log_q[usable]
    top = float(terms.max())
    return (top + math.log(float(np.exp(terms - top).sum()))) / (alpha - 1.0)


def subsampled_rdp(
    rdp: Callable[[int], float], sampling_rate: float, alpha: int, amplification: str = "steinke"
) -> float:
    """RDP of order ``alpha`` (an integer >= 2) of a mechanism with RDP curve ``rdp`` on a Poisson sample of rate q.

    Computed in log space as

        1/(alpha - 1) log[(1 - q)^(alpha - 1) (alpha q - q + 1) + C(alpha, 2) q^2 (1 - q)^(alpha - 2) e^rdp(2)
                          + w sum_{l=3..alpha} C(alpha, l) q^l (1 - q)^(alpha - l) e^((l - 1) rdp(l))],

    with w = 1 for "steinke" (Steinke 2022) and w = 3 for "zhu_wang" (Zhu and Wang 2019, Theorem 6);
    never more than the unsampled rdp(alpha); at q = 1 it is rdp(alpha).

    Raises:
        ConfigError: ``alpha`` is not an integer >= 2.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, int) or alpha < 2:
        raise ConfigError(f"subsampled RDP needs an integer order >= 2, got {alpha!r}")
    curve = np.array([rdp(order) for order in range(2, alpha + 1)], dtype=np.float64)
    return _subsampled(curve, sampling_rate, alpha, amplification)


_LOG_FACTORIALS = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, 4097, dtype=np.float64)))])
"""log k! for k = 0 .. 4096, the binomials of the subsampling bound."""


def _subsampled(curve: np.ndarray, sampling_rate: float, alpha: int, amplification: str) -> float:
    """:func:`subsampled_rdp` from ``curve[l - 2]`` = rdp(l) for l = 2 .. alpha, vectorised over l."""
    if not 0.0 < sampling_rate <= 1.0:
        raise ConfigError(f"sampling rate {sampling_rate!r} must be in (0, 1]")
    if amplification not in AMPLIFICATIONS:
        raise ConfigError(f"unknown amplification {amplification!r}; use one of {', '.join(AMPLIFICATIONS)}")
    if alpha >= _LOG_FACTORIALS.size:
        raise ConfigError(f"Renyi orders above {_LOG_FACTORIALS.size - 1} are not supported, got {alpha}")
    plain = float(curve[alpha - 2])
    if sampling_rate == 1.0:
        return plain
    q = sampling_rate
    orders = np.arange(2, alpha + 1)
    binomials = _LOG_FACTORIALS[alpha] - _LOG_FACTORIALS[orders] - _LOG_FACTORIALS[alpha - orders]
    logs = binomials + orders * math.log(q) + (alpha - orders) * math.log1p(-q) + (orders - 1) * curve[: alpha - 1]
    if amplification == "zhu_wang":
        logs[1:] += math.log(3.0)
    first = (alpha - 1) * math.log1p(-q) + math.log1p((alpha - 1) * q)
    bound = float(np.logaddexp.reduce(np.concatenate([[first], logs]))) / (alpha - 1)
    return min(plain, bound)


@functools.lru_cache(maxsize=4096)
def _step_curve(
    mu: float, l1: float, l2: float, sampling_rate: float, amplification: str, rounding: int = 0
) -> np.ndarray:
    """One step's subsampled Skellam RDP at every order of :data:`ORDERS`, read-only.

    Cached: a calibration or a ledger asks for the same shapes again and again.
    """
    orders = np.arange(2, ORDERS[-1] + 1, dtype=np.float64)
    if rounding:
        curve = expected_rounding_rdp(orders, mu, l1, l2, rounding)
    else:
        gaussian = orders * l2 * l2 / (4.0 * mu)
        integrality = np.minimum(((2.0 * orders - 1.0) * l2 * l2 + 6.0 * l1) / (16.0 * mu * mu), 3.0 * l1 / (4.0 * mu))
        curve = gaussian + integrality  # skellam_rdp at every integer order, vectorised
    values = np.array([_subsampled(curve, sampling_rate, alpha, amplification) for alpha in ORDERS])
    values.setflags(write=False)
    return values


def release_rdp(release: Release, alpha: int) -> float:
    """RDP of order ``alpha`` of all of ``release``'s steps: steps times the subsampled Skellam RDP."""
    if release.steps == 0:
        return 0.0

    def plain(order: int) -> float:
        if release.rounding:
            return float(
                expected_rounding_rdp(np.array([order]), release.mu, release.l1, release.l2, release.rounding)[0]
            )
        return skellam_rdp(order, release.mu, release.l1, release.l2)

    return release.steps * subsampled_rdp(plain, release.sampling_rate, alpha, release.amplification)


def rdp_curve(releases: Sequence[Release]) -> np.ndarray:
    """The composed RDP of ``releases`` at each order of :data:`ORDERS`: RDP adds up over releases."""
    total = np.zeros(len(ORDERS))
    for release in releases:
        if release.steps:
            shape = (release.mu, release.l1, release.l2, release.sampling_rate, release.amplification, release.rounding)
            total += release.steps * _step_curve(*shape)
    return total


def epsilon_from_rdp(curve: np.ndarray, delta: float, orders: Sequence[int] = ORDERS) -> float:
    """The smallest epsilon (>= 0) at ``delta`` the RDP ``curve`` (one value per order of ``orders``) gives.

    By the improved conversion (Canonne, Kamath and Steinke 2020, Proposition 12; Balle et al. 2020):

        epsilon = min over alpha of rdp(alpha) + log((alpha - 1) / alpha) - (log delta + log alpha) / (alpha - 1),

    floored at 0.

    Raises:
        ConfigError: ``delta`` is outside (0, 1).
    """
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta={delta!r} must be in (0, 1), well below 1/n, e.g. 1e-5")
    alphas = np.asarray(orders, dtype=np.float64)
    values = curve + np.log1p(-1.0 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1.0)
    return max(0.0, float(np.min(values)))


def epsilon(releases: Sequence[Release], delta: float) -> float:
    """The epsilon at ``delta`` of all of ``releases`` composed (0 for none).

    ``delta`` is what the RDP conversion may use: subtract :func:`~fedfair.privacy.rounding.delta_addon` from the delta you promise first.
    """
    if not releases:
        return 0.0
    return epsilon_from_rdp(rdp_curve(releases), delta)


def calibrate(
    target_epsilon: float,
    delta: float,
    releases: Sequence[Release],
    tolerance: float = 1e-3,
    beside: Sequence[Release] = (),
) -> float:
    """The smallest mu (to a relative ``tolerance``) with which ``releases`` compose to at most ``target_epsilon``.

    Each release's mu is replaced by that one mu, so the mu they carry is ignored; they give the
    shape (sensitivities, sampling, steps). The releases ``beside`` keep their own mu and are composed with
    them: the target is what all of them spend together. Bisection on log mu: epsilon falls as mu grows.

    Raises:
        ConfigError: the target is not a positive number, no release has steps, the releases beside spend the
            target alone, or no mu below 2^60 reaches the target.
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ConfigError(f"target epsilon {target_epsilon!r} must be a positive number, e.g. 3")
    if not releases or all(release.steps == 0 for release in releases):
        raise ConfigError("nothing to calibrate: give at least one release with steps > 0")
    if beside and epsilon(beside, delta) >= target_epsilon:
        raise ConfigError(
            f"the releases beside spend epsilon {epsilon(beside, delta):g} alone, not below the target "
            f"{target_epsilon:g}; give them more noise or raise the target"
        )

    def spent(mu: float) -> float:
        return epsilon([*(dataclasses.replace(release, mu=mu) for release in releases), *beside], delta)

    low, high = 1e-6, 1.0
    while spent(high) > target_epsilon:
        low, high = high, high * 16.0
        if high > 2.0**60:
            raise ConfigError(
                f"no noise reaches epsilon {target_epsilon:g} at delta {delta:g}; raise the target or lower the steps"
            )
    while high / low > 1.0 + tolerance:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if spent(middle) > target_epsilon else (low, middle)
    return high


def honest_parties(floor: int, colluders: int) -> int:
    """How many parties of a ``floor``-party survivor set carry the noise against any single reader.

    Every survivor reads the noised sum and knows its own share, so it can subtract that share; the aggregator
    with ``colluders`` sites subtracts theirs. The shares a reader knows are therefore max(colluders, 1) once
    ``floor`` >= 2, and ``floor - max(colluders, 1)`` shares remain unknown to every reader. A lone party
    (``floor`` 1) reads only the sum of itself: ``1 - colluders``. May be below 1 (:func:`party_mu` refuses it).
    """
    return floor - max(colluders, 1) if floor >= 2 else floor - colluders


def party_mu(total_mu: float, floor: int, colluders: int) -> float:
    """Each party's share of the noise: ``total_mu / honest_parties(floor, colluders)``.

    The shares any single reader knows (its own as a site; the aggregator's colluders') it can subtract, so the
    other parties of the smallest survivor set the plan allows (``floor`` parties, of which ``colluders`` may
    collude; floor = n under ``dropouts = "none"``) must carry it all (:func:`honest_parties`).

    Raises:
        ConfigError: no party is left to carry the noise (naming the fix), or ``total_mu`` is not positive.
    """
    honest = honest_parties(floor, colluders)
    if honest < 1:
        raise ConfigError(
            f"a survivor floor of {floor} with {colluders} colluders leaves no party whose noise share every "
            "other reader lacks (each site subtracts its own, the aggregator its colluders'); raise the floor "
            "([quorum] min_collaborators / min_round_size), lower max_colluding, or add sites"
        )
    if not (math.isfinite(total_mu) and total_mu > 0):
        raise ConfigError(f"total_mu={total_mu!r} must be positive and finite")
    return total_mu / honest


def noise_excess(parties: int, floor: int, colluders: int) -> float:
    """How many times the target noise the decoded sum carries when all ``parties`` survive.

    Parties / :func:`honest_parties` (n / (n - 1) at the floor n with no colluders: a site knows its own share).
    """
    return parties * party_mu(1.0, floor, colluders)


def padded_dimension(dimension: int) -> int:
    """M.

    The smallest power of two >= ``dimension`` (>= 1), the length of a vector after the secure sum's random
    rotation (`fedfair.secagg.rotation`), and so the dimension the rounding inflation counts.
    """
    if dimension < 1:
        raise ConfigError(f"a rotated vector needs at least one coordinate, got dimension={dimension}")
    return 1 << (dimension - 1).bit_length()


@dataclass(frozen=True)
class TrainingNoise:
    """The distributed noise of a run of DP-SGD rounds, from public plan values only (:func:`training_noise`).

    Every collaborator and the secure sum therefore compute the same.

    fractional_bits: f of the encoding (one record moves the weighted sum by at most 2^11 to 2^12 units).
    release: the Skellam release of one step (mu: the honest parties' total; l1, l2 in encoded units before the
        rounding of its ``rounding`` = m coordinates, charged in expectation; the sampling rate); ``steps`` holds
        the planned steps.
    addon: what rounding and wraps add to delta (:func:`~fedfair.privacy.rounding.delta_addon`); the RDP conversion uses delta - addon.
    sensitivity: how far one record moves the weighted sum in L2, real units, before rounding: the unit of the
        encoder's projection radius (:func:`~fedfair.privacy.rounding.batch_radius` of them).
    weight_per_record: the sites' largest weight per expected batch record w_k / b_k the sensitivity was
        scaled by (:func:`fedfair.privacy.calibration.record_sensitivity`); a party's unweighted update is
        bounded by the sensitivity over it.
    beside: the releases a party makes once a step besides its update, each with the planned steps (a loss it
        sends in the clear, `fedfair.research.fair_dp`), charged with it; none for plain DP-SGD.
    """

    fractional_bits: int
    release: Release
    addon: float
    sensitivity: float
    weight_per_record: float = 1.0
    beside: tuple[Release, ...] = ()

    def epsilon(self, steps: int, delta: float) -> float:
        """Epsilon at ``delta`` (the promised one, add-on included) after ``steps`` steps, the releases beside too."""
        releases = [dataclasses.replace(release, steps=steps) for release in (self.release, *self.beside)]
        return epsilon(releases, delta - self.addon)


def training_noise(
    target_epsilon: float,
    delta: float,
    sensitivity: float,
    sampling_rate: float,
    steps: int,
    dimension: int,
    ring: Ring | None = None,
    beside: Sequence[Release] = (),
) -> TrainingNoise:
    """The noise that makes ``steps`` DP-SGD steps spend ``target_epsilon`` at ``delta`` in a secure sum.

    Args:
        target_epsilon: the epsilon the run may spend.
        delta: the promised delta, the rounding and wrap add-on included.
        sensitivity: how far one record moves the weighted sum, in L2 and real units.
        sampling_rate: q, the Poisson rate of each step.
        steps: the planned steps.
        dimension: the encoded coordinates of the secure sum.
        ring: the words the sum travels in; None for words wide enough for any f (64 bits, the check left to
            the encoder).
        beside: releases each party makes once a step besides its update (their mu fixed, their steps the
            planned ones): the steps and these together spend ``target_epsilon`` (`TrainingNoise.beside`).

    Returns:
        f with 2^11 <= sensitivity 2^f <= 2^12 (or f = 0), lowered while a sum in ``ring`` could wrap with
        probability above WRAP_FAILURE; the sensitivities at that f, their rounding charged in expectation (so the
        accounting is the one of the bits chosen), the delta add-on (which counts WRAP_FAILURE per step) and the calibrated mu.

    Raises:
        ConfigError: a non-positive sensitivity, a delta outside (0, 1) or too small for the add-on, a target no
            noise reaches, or a ring no f fits.
    """
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ConfigError(
            f"the per-record sensitivity {sensitivity!r} must be positive; check the clip bounds and step sizes"
        )
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta={delta!r} must be in (0, 1), well below 1/n, e.g. 1e-5")
    addon = delta_addon(steps=steps, parties=MAX_PARTIES, beta=ROUNDING_BETA, epsilon=target_epsilon, wrap=WRAP_FAILURE)
    if addon >= delta / 2:
        raise ConfigError(f"delta={delta:g} is too small for {steps} steps' rounding and wrap failures; raise it")
    # Fewer fractional bits shrink signal and noise alike, in units, until rounding (d / 4 in the squared
    # sensitivity) dominates; the first f whose sum fits is the most precise one that does.
    for bits in range(max(0, math.floor(math.log2(SENSITIVITY_UNITS / sensitivity))), -1, -1):
        units = math.ldexp(sensitivity, bits)
        l1 = math.sqrt(dimension) * units  # a rotation may spread one record's move over every coordinate
        shape = Release("skellam", 1.0, l1, units, sampling_rate, steps, rounding=dimension)
        # Epsilon may move ten times as fast as mu (few sampled steps at a high target): bisect mu to 1e-4.
        mu = calibrate(target_epsilon, delta - addon, [shape], tolerance=1e-4, beside=beside)
        release = dataclasses.replace(shape, mu=mu)
        if ring is None or ring.wrap_probability(units, release.mu, dimension) <= WRAP_FAILURE:
            return TrainingNoise(bits, release, addon, sensitivity, beside=tuple(beside))
    assert ring is not None  # without a ring the first f is taken
    raise ConfigError(
        f"no fractional bits keep a noised sum of {ring.parties} parties (max_weight {ring.max_weight:g}) within "
        f"2^{ring.modulus_bits} words; lower max_weight to the largest expected batch, or raise modulus_bits"
    )
