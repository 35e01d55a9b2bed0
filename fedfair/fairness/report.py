"""The group-risk report at rho, one type for both forms: pooled values or secure sums.

A report from secure sums also carries a `SecureSumCertificate`: how many samples
the sums covered and how far each reported risk may lie from the exact one. A pooled
report has none, because its numbers are exact.

Disparity is the paper's: the worst rho-fraction's risk minus the risk of the
*remaining* 1 - rho of the samples. The remainder's mean is (mean - rho * worst) /
(1 - rho), so disparity = (worst - mean) / (1 - rho), computable from the two
figures both forms report (0 at rho = 1, where nothing remains). The worst-minus-best
gap is `worst_minus_best` (None where noised sums leave the best group unmeasured); the
same two exist for the 0-1 error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


def disparity(worst: float, mean: float, rho: float) -> float:
    """The worst rho-fraction's mean minus the mean of the other 1 - rho (the paper's disparity).

    0 at rho = 1, where the worst group is everyone.
    """
    if rho >= 1.0:
        return 0.0
    return (worst - mean) / (1.0 - rho)


@dataclass(frozen=True)
class SecureSumCertificate:
    """What the secure sums certify about a federated report.

    Exact sums (``noise_std`` 0, ``confidence`` 1): `worst_risk` is within `worst_risk_gap`
    above the exact CVaR_rho of all held-out losses and `best_risk` within `best_risk_gap`
    below the exact best-group risk; `mean_risk` is within `mean_error_bound` of the exact
    mean. The error-based fields come from an integer count and are exact
    (`error_rate_bound` 0). Losses above `loss_cap` (the grid's top) count as the cap.

    Noised sums (``noise_std`` > 0, the standard deviation of the noise on each decoded
    coordinate): every figure is of the losses clipped at `loss_cap`, and, all at once with
    probability at least `confidence`, `worst_risk` and `mean_risk` are within their bound
    (either side) of the exact figure, the mean 0-1 error within `error_rate_bound` and the
    worst and best groups' error within `error_rate_bound / rho`; `samples` is the noised
    count, rounded. The answers do not query the best group's risk: `best_risk_gap` is None
    (all that is known is that it lies between 0 and the mean).

    `disparity_bound` bounds the error of the disparity (the worst group against the rest),
    (worst_risk_gap + mean_error_bound) / (1 - rho) (0 at rho = 1), on the same event.
    """

    samples: int
    worst_risk_gap: float
    best_risk_gap: float | None
    mean_error_bound: float
    error_rate_bound: float
    disparity_bound: float
    noise_std: float
    confidence: float
    loss_cap: float
    worst_risk_low: float | None = None
    """The noised report's 95% interval of the worst-group risk, [low, high] (None for exact sums)."""
    worst_risk_high: float | None = None
    prior_worst_risk: float | None = None
    """The class-prior classifier's worst-group risk, from the noised label counts (None when not counted)."""
    above_cap: float | None = None
    """The noised count of held-out losses above `loss_cap`, +/- `above_cap_bound` (95%; None for exact sums)."""
    above_cap_bound: float | None = None
    cap_share_high: float | None = None
    """At most this share of the worst rho-fraction lies above `loss_cap` (one-sided 97.5%; None for exact sums):
    the losses' own worst-group risk is at least `worst_risk_low` and at most `worst_risk_high` plus it times
    (the largest loss - `loss_cap`) (:meth:`fedfair.fairness.tail.TailReport.unclipped_high`)."""
    worst_risk_noise: float | None = None
    """The noise's 95% half-width of the worst-group risk, its whole interval but for a range clamp (None for exact
    sums)."""
    group_error_bound: float | None = None
    """The noised report's 95% bound on the worst and the best group's 0-1 error and on their difference
    (None for exact sums, whose errors are exact). Each is a function of the mean error e alone (the errors fill
    the worst group first: min(e, rho) / rho and max(e - (1 - rho), 0) / rho), with slope at most 1 / rho, so
    `error_rate_bound / rho` bounds all three."""
    error_disparity_bound: float | None = None
    """The same for `error_disparity`, whose slope in e is at most max(1 / rho, 1 / (1 - rho)) (0 at rho = 1)."""


@dataclass(frozen=True)
class GroupRiskReport:
    """Risk (cross-entropy) and 0-1 error of a model on held-out data, overall and by group at rho.

    Losses and errors each rank the samples by their own value, so the worst group
    for the error is the rho-fraction of samples with the most errors, which need
    not be the samples with the highest loss. `certificate` is set exactly when the
    report comes from secure sums. `best_risk` and `worst_minus_best` are None when the
    best group's risk was not measured (a noised report's answers do not query it).
    """

    rho: float
    mean_risk: float
    worst_risk: float
    best_risk: float | None
    disparity: float
    worst_minus_best: float | None
    accuracy: float
    mean_error: float
    worst_error: float
    best_error: float
    error_disparity: float
    error_worst_minus_best: float
    certificate: SecureSumCertificate | None = None

    @classmethod
    def from_risks(
        cls,
        *,
        rho: float,
        mean_risk: float,
        worst_risk: float,
        best_risk: float | None,
        mean_error: float,
        worst_error: float,
        best_error: float,
        certificate: SecureSumCertificate | None = None,
    ) -> GroupRiskReport:
        """The report with its derived fields (disparities, accuracy) computed one way for both forms."""
        return cls(
            rho=rho,
            mean_risk=mean_risk,
            worst_risk=worst_risk,
            best_risk=best_risk,
            disparity=disparity(worst_risk, mean_risk, rho),
            worst_minus_best=None if best_risk is None else worst_risk - best_risk,
            accuracy=1.0 - mean_error,
            mean_error=mean_error,
            worst_error=worst_error,
            best_error=best_error,
            error_disparity=disparity(worst_error, mean_error, rho),
            error_worst_minus_best=worst_error - best_error,
            certificate=certificate,
        )

    def to_dict(self) -> dict[str, float]:
        """The report as flat JSON-ready numbers, with the certificate's fields when there is one.

        A figure that was not measured (None) is left out, so a reader never takes a stand-in for a measurement.
        """
        risks = {
            field.name: getattr(self, field.name)
            for field in fields(self)
            if field.name != "certificate" and getattr(self, field.name) is not None
        }
        if self.certificate is None:
            return risks
        rho = risks.pop("rho")
        # The noised report's interval and baseline are absent (None) from exact ones, the best group's
        # bound from noised ones: each is left out.
        extras = {key: value for key, value in asdict(self.certificate).items() if value is not None}
        samples = extras.pop("samples")
        # Reports from sums have always put the sample count right after rho and the bounds last.
        return {"rho": rho, "samples": samples, **risks, **extras}
