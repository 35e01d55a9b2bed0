"""Each method's held-out worst-group gap to FedSRCVaR, paired on the same test rows, with its standard error.

The seeds of a study vary the training (initialisation, batches), never the rows: their spread says nothing of
how far a gap between two models would move on other rows drawn alike. Two models judged on the same rows
differ by the mean of `objective.cvar_terms` differences, row by row, so the standard error of that paired
gap is their spread over the square root of the rows (averaged over the seeds first: the rows are shared).
A gap within two standard errors of zero is one the test rows cannot tell from a tie. Why: docs/paper.md,
"Against the federated fairness baselines".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.core.objective import cvar, cvar_terms
from fedfair.research.runs import row_losses

REFERENCE = "fedsrcvar"
"""The method every gap is measured from."""


def paired_gap(reference: Sequence[np.ndarray], other: Sequence[np.ndarray], rho: float) -> tuple[float, float]:
    """`other`'s worst-`rho` risk minus `reference`'s, mean over seeds, and its standard error over the rows.

    Each sequence holds one loss vector per seed, every vector over the same held-out rows in the same order.

    Raises:
        ConfigError: no seeds, or vectors of different lengths.
    """
    vectors = [*reference, *other]
    if not reference or not other or len({vector.size for vector in vectors}) != 1:
        raise ConfigError("a paired gap needs each model's losses on the same rows, at least one seed each")
    gap = float(np.mean([cvar(v, rho) for v in other]) - np.mean([cvar(v, rho) for v in reference]))
    difference = np.mean([cvar_terms(v, rho) for v in other], axis=0) - np.mean(
        [cvar_terms(v, rho) for v in reference], axis=0
    )
    return gap, float(difference.std(ddof=1) / math.sqrt(difference.size))


def paired_rows(
    chosen: Mapping[tuple[str, float], Sequence[Mapping[str, Any]]], labels: Mapping[str, str]
) -> list[dict[str, Any]]:
    """A row per (rho, method other than FedSRCVaR): the paired test gap to FedSRCVaR, its error and their ratio.

    `chosen` maps (method, rho) to the test results of its chosen point, one per seed, each keeping its rows'
    losses; a seed that diverged is left out of both sides' means, and a method with none left gets NaN.
    """
    rows = []
    for (method, rho), results in chosen.items():
        if method == REFERENCE or (REFERENCE, rho) not in chosen:
            continue
        mine = [row_losses(result) for result in chosen[(REFERENCE, rho)] if "diverged" not in result]
        theirs = [row_losses(result) for result in results if "diverged" not in result]
        gap, error = paired_gap(mine, theirs, rho) if mine and theirs else (math.nan, math.nan)
        rows.append(
            {
                "rho": rho,
                "method": labels[method],
                "seeds": len(theirs),
                "gap_to_fedsrcvar": gap,
                "gap_standard_error": error,
                "gap_in_errors": gap / error if error > 0 else math.nan,
            }
        )
    return sorted(rows, key=lambda row: (row["rho"], row["method"]))
