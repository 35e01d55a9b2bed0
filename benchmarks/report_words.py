"""The benchmark page's section on word sizes: dp_utility's worst-group risk in 16- and 32-bit words against 64.

Each function turns one result file's JSON into a `Section`; a row states only what the JSON holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from report_tables import Section, fixed, percent, ratio, table


def dp_utility_bits(name: str, document: Mapping[str, Any]) -> Section:
    """Each federation's worst-group risk in narrower words against the 64-bit run, with and without DP."""
    rows = [
        (
            pair["dataset"],
            "no DP" if pair["mode"] == "none" else f"distributed, epsilon {pair['epsilon']:g}",
            str(pair["bits"]),
            str(pair["fractional_bits"]),
            str(pair.get("repeats", document["repeats"])),  # files before per-row runs: one count for all
            fixed(pair["worst_group_risk_64"], 4),
            fixed(pair["worst_group_risk"], 4),
            f"{percent(pair['relative_difference'], 2)} ± {percent(pair['relative_difference_se'], 2)}",
            ratio(pair["noise_std_ratio"], 3),
        )
        for pair in document["comparisons"]
    ]
    return Section(
        "Secure sums in narrower words: the worst-group risk against 64-bit words",
        f"dp_utility's federations (logistic regression, FedSRCVaR, {document['rounds']} rounds) with every site's "
        "batch agreed as its weight, without DP and with distributed DP at epsilon 1: the held-out worst-group risk "
        "in K-bit words beside the 64-bit run's, each the mean of as many runs with fresh noise as the table says, "
        "the relative difference ± its standard error, the fractional bits the words leave, and the decoded noise's standard "
        "deviation against the 64-bit run's.",
        table(
            (
                "dataset",
                "training",
                "bits",
                "fractional bits",
                "runs",
                "64-bit risk",
                "K-bit risk",
                "difference",
                "noise",
            ),
            rows,
        ),
    )
