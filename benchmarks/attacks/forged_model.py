"""A forged next model against real collaborator processes (issue 65): refused at its first round, never trained on.

fedfair's aggregator runs in a thread (:class:`~attacks.pinned_federation.LoopAggregator`) with its server step
rewritten from round FORGED on: it claims each round's true sum, which every site verifies, and then makes of it
another model than the plan's server step does (the attacks of issue 65 that verified sums alone let through):

- backdoor: theta moved by BACKDOOR on its first coordinates (a trigger's weights implanted);
- flip: theta negated (the flipped model).

Three real ``fedfair collaborator start`` processes must each exit 2 with ``aggregate-refused`` naming round
FORGED + 1 and NEXT_MODEL, keep no bundle, and train on no forged model: each outcome record counts the FORGED
honest rounds only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from attacks.federation import plan_sections
from attacks.target_site import THREE
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from attacks.site_processes import run_sites
from fedfair.core import server
from fedfair.core.algorithm import FedSRCVaR
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

ROUNDS = 4
FORGED = 2
"""The first round whose verified sum is made into a forged model; round FORGED + 1 is sent it."""
BACKDOOR = 5.0
BACKDOORED = 8
"""The backdoor moves the first BACKDOORED coordinates of theta by BACKDOOR."""


def backdoor(theta: torch.Tensor) -> None:
    theta[:BACKDOORED] += BACKDOOR


def flip(theta: torch.Tensor) -> None:
    theta.neg_()


ATTACKS: dict[str, Callable[[torch.Tensor], None]] = {"backdoor": backdoor, "flip": flip}


class ForgingStep:
    """The plan's server step, with `forge` applied to theta from round FORGED's step on."""

    def __init__(self, algorithm: FedSRCVaR, forge: Callable[[torch.Tensor], None]) -> None:
        self.algorithm, self.forge, self.forged = algorithm, forge, 0

    def __getattr__(self, name: str) -> object:
        # Everything but the step is the plan's algorithm's: the loop also reads its settings (how many tensors
        # a state holds, to place it). Without this the aggregator thread failed before it listened, and both
        # rows waited out the sites' 180 s timeout (issue 79).
        return getattr(self.algorithm, name)

    def server_apply(
        self, state: server.ServerState, aggregate: server.Aggregate, *, average_from: int = 0, consume: bool = False
    ) -> server.ServerState:
        moved = self.algorithm.server_apply(state, aggregate, average_from=average_from, consume=consume)
        if moved.round >= FORGED:  # every round before it applied: the sites' honest rounds
            self.forge(moved.theta)
            self.forged += 1
        return moved


def forged_model_rows(root: Path, book: RowBook) -> None:
    """One row per attack: a federation of three site processes, about 20 s each on 2 cores."""
    for name, forge in ATTACKS.items():
        with book.row(
            f"forged next model ({name}): the aggregator claims every round's true sum (each site verifies it) and "
            f"sends, from round {FORGED + 1} on, a model that is not the plan's server step of it",
            f"every site (3 real processes) exits 2 with aggregate-refused naming round {FORGED + 1} and NEXT_MODEL, "
            f"keeps no bundle, and trains on no forged model (its record counts {FORGED} rounds)",
            PATCHED_AGGREGATOR,
        ) as row:
            statuses, refusals, counts, bundles, seconds, applied = run_federation(root / name, forge)
            row.record(
                f"exit statuses {statuses}; refusals {refusals}; rounds each site's record counts {counts}; bundles "
                f"kept {bundles}; rounds the aggregator applied {applied}; {seconds:.1f} s",
                all(status == 2 for status in statuses.values())
                and all(refusal == (FORGED + 1, "NEXT_MODEL") for refusal in refusals.values())
                and all(count == FORGED for count in counts.values())
                and not any(bundles.values()),
                forged_rounds_applied_at_sites=sum(count > FORGED for count in counts.values()),
            )


def run_federation(
    root: Path, forge: Callable[[torch.Tensor], None]
) -> tuple[dict[str, int | None], dict[str, tuple[int, str] | None], dict[str, int], dict[str, bool], float, list[int]]:
    """The federation under `forge`: each site's exit status, refusal, rounds counted and bundle kept."""
    workspace = make_workspace(root, THREE, plan=plan_sections(secure=True, rounds=ROUNDS, quorum=3, timeout=15.0))

    def adjust(loop: RoundLoop) -> None:
        loop.algorithm = ForgingStep(loop.algorithm, forge)  # type: ignore[assignment]

    run = run_sites(workspace, adjust)
    refusals: dict[str, tuple[int, str] | None] = {}
    counts: dict[str, int] = {}
    bundles: dict[str, bool] = {}
    for name in THREE:
        folder = workspace.configs[name].parent
        record = OutcomeRecord(next(folder.glob(f"{name}.*.{OUTCOME_SUFFIX}")), 0)
        refusals[name] = None if record.refusal is None else (record.refusal.round, record.refusal.reason)
        counts[name] = record.contributed
        bundles[name] = any(folder.glob("*model_bundle*"))
    log = load_aggregator_plan(workspace.plan).aggregator.output / "rounds.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    applied = [record["round"] for record in records if record["status"] == "applied"]
    return run.statuses, refusals, counts, bundles, run.seconds, applied
