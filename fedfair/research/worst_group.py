"""The paper's worst-group composition table: who is in FedSRCVaR's worst rho-fraction of test rows.

For every (group, label) cell, its share of the worst group at each rho (mean and standard
deviation over the seeds' models) beside its share of all test rows. A cell whose worst share
is near its overall share is not singled out; the paper's point is that the worst-off are
not one race group but spread across them, mostly along the label.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

COMPOSITION_RHOS = (0.1, 0.3)
"""The rhos of the paper's composition table."""
COMPOSITION_COLUMN = "race"
"""The group column of the paper's composition table (with the label)."""


def composition_rows(results_by_rho: Mapping[float, Sequence[Mapping[str, Any]]], column: str) -> list[dict[str, Any]]:
    """One row per (rho, cell).

    The cell's share of the worst group (mean and std over the runs) and of all test rows, from runs that
    described their worst group by `column` and the label.

    A cell absent from a run's test rows (so from its worst group too) counts as a share of 0; a
    run that diverged has no worst group to describe and is left out.
    """
    rows: list[dict[str, Any]] = []
    for rho, results in sorted(results_by_rho.items()):
        described = [result["composition"][f"{rho:g}"] for result in results if "diverged" not in result]
        tables = [{(cell[column], cell["label"]): cell for cell in cells} for cells in described]
        cells = sorted(set().union(*tables))
        for cell in cells:
            shares = np.array([table[cell]["worst_share"] if cell in table else 0.0 for table in tables])
            overall = next(table[cell]["overall_share"] for table in tables if cell in table)
            rows.append(
                {
                    "rho": rho,
                    column: cell[0],
                    "label": cell[1],
                    "worst_share_mean": float(shares.mean()),
                    "worst_share_std": float(shares.std()),
                    "overall_share": overall,
                }
            )
    return rows


def composition_markdown(rows: Sequence[Mapping[str, str]], column: str) -> str:
    """The table as the paper lays it out, in Markdown.

    A row per rho and one for everyone, a column per (group, label) cell, shares in percent (`rows` as read back
    from the CSV).
    """
    cells = list(dict.fromkeys((row[column], row["label"]) for row in rows))
    rhos = list(dict.fromkeys(row["rho"] for row in rows))
    share = {(row["rho"], row[column], row["label"]): row for row in rows}
    header = "| | " + " | ".join(f"{group} {label}" for group, label in cells) + " |"
    lines = [header, "|---" * (len(cells) + 1) + "|"]
    for rho in rhos:
        values = [
            f"{100 * float(share[(rho, *cell)]['worst_share_mean']):.1f}" if (rho, *cell) in share else "0.0"
            for cell in cells
        ]
        lines.append(f"| worst {100 * float(rho):g}% | " + " | ".join(values) + " |")
    overall = {cell: share[(rho, *cell)]["overall_share"] for rho in rhos for cell in cells if (rho, *cell) in share}
    lines.append("| everyone | " + " | ".join(f"{100 * float(overall[cell]):.1f}" for cell in cells) + " |")
    return "\n".join(lines)
