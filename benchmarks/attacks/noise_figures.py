"""The noise scenario's shared measurements (:mod:`attacks.noise`): errors in units of the stated noise, ledgers, refusals.

A row is handled only on evidence: an error of the order of the noise the aggregator states (within NOISE_BAND of
it, nothing exact), the releases each site's ledger charged (kept in a folder of its federation's own,
:mod:`attacks.own_ledgers`), and, where verified aggregation refuses the attack outright, the refusal each site's
outcome record keeps (``NAME.FEDERATION.outcome.npz``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from attacks.pinned_federation import FOUR, RUN_SECONDS, LoopAggregator
from attacks.federation import HonestCollaborators
from attacks.own_ledgers import federation_ledgers
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.collaborator.trainer import TrainerFactory

VICTIM = FOUR[-1]
REPORT_PRIVACY = {"report_epsilon": 1.0, "budget": 10.0, "delta": 1e-5}
"""The evaluation rows' [privacy]: one answer spends epsilon 1 at delta 1e-5, within a budget of 10."""
NOISE_BAND = (0.3, 3.0)
"""A row's error must be within these multiples of the noise scale the aggregator states: of its order."""
OPERATOR = "cheating aggregator (fedfair's aggregator, its round loop patched) against real collaborators"


def ledger(workspace: Workspace, names: tuple[str, ...], delta: float) -> dict[str, dict[str, Any]]:
    """Each site's ledger: its releases as (kind, round) and the epsilon they compose to at `delta`."""
    found: dict[str, dict[str, Any]] = {}
    for name in names:
        with federation_ledgers(workspace):
            site = open_ledger(load_collaborator_config(workspace.configs[name]))
        found[name] = {
            "releases": [(entry["kind"], int(entry["round"])) for entry in site.releases()],  # type: ignore[call-overload]
            "epsilon": round(site.spent(delta), 4),
        }
    return found


def within(ratio: float | None) -> bool:
    return ratio is not None and NOISE_BAND[0] <= ratio <= NOISE_BAND[1]


def gaussian_max(count: int) -> float:
    """About the largest |N(0, 1)| of `count` draws: what the max error over `count` noised values is, in stds."""
    return math.sqrt(2.0 * math.log(max(count, 2)))


def error_figures(error: np.ndarray, std: float) -> dict[str, Any]:
    """The error of a decoded vector against the truth, in units of the stated noise std: RMS (expected 1),
    max (expected about :func:`gaussian_max`) and the share of coordinates read exactly (rounded to counts)."""
    if std <= 0.0 or error.size == 0:
        return {"rms_in_std": None, "max_in_std": None, "max_over_expected": None, "exact_share": None}
    rms = float(np.sqrt(np.mean(error**2))) / std
    largest = float(np.abs(error).max()) / std
    return {
        "rms_in_std": round(rms, 3),
        "max_in_std": round(largest, 3),
        "max_over_expected": round(largest / gaussian_max(error.size), 3),
        "exact_share": round(float(np.mean(np.abs(error) < 0.5)), 4),
    }


def unexact(figures: Mapping[str, Any]) -> bool:
    """Whether under half of the coordinates were read exactly (a noised answer of few coordinates may have none)."""
    share = figures.get("exact_share")
    return share is not None and share < 0.5


def refusals(workspace: Workspace, names: tuple[str, ...]) -> dict[str, tuple[int, str] | None]:
    """Each site's refusal as its outcome record keeps it: (round, reason), None where it refused nothing."""
    found: dict[str, tuple[int, str] | None] = {}
    for name in names:
        paths = sorted(workspace.configs[name].parent.glob(f"{name}.*.{OUTCOME_SUFFIX}"))
        refusal = OutcomeRecord(paths[0], 0).refusal if paths else None
        found[name] = None if refusal is None else (refusal.round, refusal.reason)
    return found


def run_federation(
    workspace: Workspace,
    aggregator: LoopAggregator,
    trainers: Callable[[str], TrainerFactory | None],
    adjust: Callable[[str, Collaborator], None] | None = None,
) -> dict[str, str]:
    """The four honest sites of `workspace` against `aggregator` until they end (RUN_SECONDS at most), then both
    stopped: every error raised, the aggregator's under "aggregator"."""
    with federation_ledgers(workspace):
        group = HonestCollaborators.start(workspace, FOUR, trainers, adjust=adjust)
        try:
            group.join(RUN_SECONDS)
        finally:
            group.stop()
            aggregator.stop()
    return {**group.errors, **({"aggregator": aggregator.error} if aggregator.error else {})}
