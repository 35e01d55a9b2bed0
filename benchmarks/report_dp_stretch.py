"""The benchmark page's section on the DP stretch under the tuning protocol (`dp_stretch.py --profile tuned`).

FedSRCVaR under distributed DP at epsilon 1, at the tuned study's non-private choice and at the point the
protocol chose under DP, beside the tuned study's best non-private baseline; a row states only what the JSON
holds (the relative gap is computed from its two means).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from report_tables import Section, fixed, percent, table

KINDS = {
    "non-private": ("non_private_point", "no DP, the tuned study's choice (re-run)"),
    "non-private, one local step": ("point", "no DP, that point at one local step"),
    "distributed": ("point", "distributed DP, epsilon 1: the non-private choice at one local step"),
    "distributed, chosen under DP": ("chosen_under_dp", "distributed DP, epsilon 1: chosen under DP"),
}
"""Each kind of run: the JSON key naming its point, and what the row says it is."""
DIGITS = 5
"""Decimals of a risk: RAND HIE's methods differ in the fifth (all near ln 2 = 0.69315)."""


def baseline_row(baseline: Mapping[str, Any]) -> list[str]:
    """The row of the tuned study's best non-private baseline, which every DP row is set against."""
    return [
        f"best non-private baseline, tuned alike: {baseline['method']}",
        baseline["chosen"],
        "the table's seeds",
        f"{fixed(baseline['worst_risk_mean'], DIGITS)} ± {fixed(baseline['worst_risk_std'], DIGITS)}",
        "",
        fixed(baseline["mean_risk_mean"], 3),
        "n/a",
    ]


def dp_stretch(name: str, document: Mapping[str, Any]) -> Section:
    """Each kind's held-out worst-decile risk (mean ± std over its runs, range) beside the best tuned baseline."""
    rows = []
    for kind, figures in document["summary"].items():
        key, label = KINDS[kind]
        rows.append(
            [
                label,
                document[key],
                str(figures["runs"]),
                f"{fixed(figures['worst_risk_mean'], DIGITS)} ± {fixed(figures['worst_risk_std'], DIGITS)}",
                f"{fixed(figures['worst_risk_min'], DIGITS)} to {fixed(figures['worst_risk_max'], DIGITS)}",
                fixed(figures["mean_risk_mean"], 3),
                fixed(figures["epsilon_spent_max"], 4),
            ]
        )
    baseline = document["baseline"]
    rows.append(baseline_row(baseline))
    header = ["FedSRCVaR", "point", "runs", "held-out worst-decile risk", "range", "mean risk", "epsilon spent"]
    lines = table(header, rows)
    best_dp = min(
        (figures for kind, figures in document["summary"].items() if kind.startswith("distributed")),
        key=lambda figures: figures["worst_risk_mean"],
    )
    gap = best_dp["worst_risk_mean"] - baseline["worst_risk_mean"]
    lines += [
        "",
        f"Under DP FedSRCVaR's lower mean is {fixed(abs(gap), DIGITS)} ({percent(abs(gap) / baseline['worst_risk_mean'], 2)}) "
        f"{'above' if gap > 0 else 'below'} {baseline['method']}'s non-private {fixed(baseline['worst_risk_mean'], DIGITS)}.",
    ]
    search = document.get("search")
    if search is not None:
        lines += [
            "",
            f"Chosen under DP by the tuning protocol over {', '.join(search['axes'])}, each point's validation value "
            f"the mean of {search['repeats']} DP runs: {len(document['validation'])} points of a budget of "
            f"{search['budget']} ({search['extension_runs']} extension runs); settled: {fixed(search['settled'])}. "
            f"Limits: {'; '.join(search['limits'])}.",
        ]
    return Section(
        f"The DP stretch on the tuning protocol: {document['dataset']} {document['split']}",
        "FedSRCVaR under distributed DP at epsilon 1 (secure sum, Skellam noise, one clipped local step a round) "
        f"at rho = {document['rho']:g}, started from the tuned study's choice ({document['table']}) and chosen "
        "again under DP by the same protocol, against the best non-private baseline of that table; ± is the "
        "population standard deviation over a kind's runs (the noise comes from the OS's CSPRNG: each DP run is "
        "one draw), the baseline's over its seeds.",
        lines,
    )


def dp_table_of(dataset: str) -> str:
    """The dp.csv that sets a baseline's DP runs beside FedSRCVaR's on `dataset` (Census-Income's folders say
    census, as docs/figures' other Census-Income folders do)."""
    return f"docs/figures/tuned_{dataset.replace('census-income', 'census').replace('-', '_')}_dp/dp.csv"


def dp_baseline(name: str, document: Mapping[str, Any]) -> Section:
    """A baseline trained under the same DP (`dp_stretch.py --as METHOD`): its runs beside the best non-private one."""
    method = str(document["method"])
    rows = [
        [
            kind,
            document["chosen_under_dp"],
            str(figures["runs"]),
            f"{fixed(figures['worst_risk_mean'], DIGITS)} ± {fixed(figures['worst_risk_std'], DIGITS)}",
            f"{fixed(figures['worst_risk_min'], DIGITS)} to {fixed(figures['worst_risk_max'], DIGITS)}",
            fixed(figures["mean_risk_mean"], 3),
            fixed(figures["epsilon_spent_max"], 4),
        ]
        for kind, figures in document["summary"].items()
    ]
    rows.append(baseline_row(document["baseline"]))
    header = ["run", "point", "runs", "held-out worst-decile risk", "range", "mean risk", "epsilon spent"]
    search = document["search"]
    lines = [
        *table(header, rows),
        "",
        f"Chosen under DP by the tuning protocol over {', '.join(search['axes'])}, each point's validation value the "
        f"mean of {search['repeats']} DP runs: {len(document['validation'])} points. Limits: "
        f"{'; '.join(search['limits'])}.",
    ]
    return Section(
        f"DP against DP: {method} under distributed DP on {document['dataset']} {document['split']}",
        f"{method} trained under the same distributed DP as FedSRCVaR (epsilon 1, secure sum, Skellam noise, one "
        f"clipped local step a round) at rho = {document['rho']:g}, its {' and '.join(search['axes'])} chosen "
        f"under DP by the protocol; {dp_table_of(str(document['dataset']))} sets it beside FedSRCVaR's runs.",
        lines,
    )
