"""Known groups held out: each model's risk on every group of a sensitive column no method trained with.

FedSRCVaR's claim is about groups nobody labelled: its worst-rho risk bounds the risk of every group of at least
rho of the rows. Its paper checks it against groups that *are* known (race, sex), where a method that knows them
(FedMinMax) is the reference. Here each stopped test run's kept per-row losses (`Run.row_losses`) are read by the
group columns of the same test rows, so the table costs no training beyond the runs already kept; h̄ and the base
rate get the same rows (issue 96).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedfair.core.errors import ConfigError


def group_risks(losses: np.ndarray, groups: np.ndarray) -> dict[str, tuple[int, float]]:
    """Each group's (row count, mean loss) over rows whose group is `groups`' entry, in the groups' sorted order.

    Raises:
        ConfigError: the two arrays do not have one entry per row.
    """
    losses, groups = np.asarray(losses, dtype=np.float64), np.asarray(groups)
    if losses.shape != groups.shape or losses.ndim != 1:
        raise ConfigError(f"one group per loss is needed, got {groups.shape} groups for {losses.shape} losses")
    return {
        str(group): (int((groups == group).sum()), float(losses[groups == group].mean())) for group in np.unique(groups)
    }


def known_group_rows(
    label: str, seed: int | str, losses: np.ndarray, columns: Mapping[str, np.ndarray]
) -> list[dict[str, Any]]:
    """``known_groups.csv``'s rows of one model: a row per (column, group), and its worst group's row marked."""
    rows: list[dict[str, Any]] = []
    for column, groups in columns.items():
        risks = group_risks(losses, groups)
        worst = max(risks, key=lambda group: risks[group][1])
        rows += [
            {
                "method": label,
                "seed": seed,
                "column": column,
                "group": group,
                "held_out_rows": count,
                "risk": risk,
                "worst": group == worst,
            }
            for group, (count, risk) in risks.items()
        ]
    return rows
