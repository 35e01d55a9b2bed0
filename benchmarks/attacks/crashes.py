"""kill -9 of the aggregator in each stage of a round, then ``--resume``: the final model must not change.

For each mode, one uninterrupted run gives the reference final model. Then, for every
kill point, a fresh federation with the same plan runs with the aggregator told (through
``FEDFAIR_TEST_FAULT``, :mod:`fedfair.runtime.faults`) to send itself SIGKILL in that
stage of round 2 (or right after round 2's checkpoint); it is restarted with ``--resume``
and the collaborators, never restarted, reconnect by themselves. The final model
(theta, c and their averages) must equal the reference bit for bit.

Plain mode trains real learners on Adult, so a collaborator that trained round 2 before
the crash must send the very same update again rather than train twice. Secure mode uses
:class:`~attacks.federation.DriftTrainer` (exact, model-dependent updates), because the
fixed-point encoding rounds stochastically and two runs of real updates would differ in
their last bits even without a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attacks.federation import (
    HONEST,
    AggregatorProcess,
    DriftTrainer,
    HonestCollaborators,
    plan_sections,
    trainer_factory,
)
from attacks.rows import PROCESS_KILL, Row, RowBook
from fedfair.runtime.output_folder import FINAL_MODEL_NAME
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.trainer import TrainerFactory
from fedfair.runtime.local.workspace import Workspace, make_workspace

KILL_ROUND, ROUNDS = 2, 3
SIGKILL_STATUS = -9
RUN_SECONDS = 180.0


@dataclass(frozen=True)
class KillPoint:
    """Where the aggregator dies: a stage of a round (or just after a round's checkpoint)."""

    where: str
    fault: str


def kill_points(secure: bool, quick: bool) -> list[KillPoint]:
    """Every stage of round 2 (and its checkpoint), and the last round's evaluation stages."""
    if quick:
        return [KillPoint("STAGE_MASKED_INPUT", f"aggregator-stage:{KILL_ROUND}:STAGE_MASKED_INPUT")]
    training = ["STAGE_TRAIN", "STAGE_MASKED_INPUT"]
    evaluation = ["STAGE_EVALUATE", "STAGE_EVAL_MASKED_INPUT"]
    if secure:
        training = ["STAGE_TRAIN", "STAGE_ADVERTISE_KEYS", "STAGE_SHARE_KEYS", "STAGE_CHECK_SHARES",
                    "STAGE_MASKED_INPUT", "STAGE_CONSISTENCY", "STAGE_UNMASK"]  # fmt: skip
        evaluation = ["STAGE_EVALUATE", "STAGE_EVAL_UNMASK"]
    points = [KillPoint(stage, f"aggregator-stage:{KILL_ROUND}:{stage}") for stage in training]
    points.append(KillPoint(f"after round {KILL_ROUND}'s checkpoint", f"after-checkpoint:{KILL_ROUND}"))
    points += [KillPoint(f"{stage} (round {ROUNDS})", f"aggregator-stage:{ROUNDS}:{stage}") for stage in evaluation]
    return points


@dataclass
class Run:
    """One federation run: its workspace, final model (None if it did not finish) and what happened."""

    workspace: Workspace
    final: dict[str, Any] | None
    notes: list[str]


class CrashRuns:
    def __init__(self, root: Path, book: RowBook, *, quick: bool) -> None:
        self.root, self.book, self.quick = root, book, quick

    def run(self) -> None:
        for secure in (False,) if self.quick else (False, True):
            mode = "secure" if secure else "plain"
            reference = self._run(self.root / mode / "reference", secure, None)
            for point in kill_points(secure, self.quick):
                with self.book.row(
                    f"kill -9 of the aggregator ({mode}): {point.where}, then --resume",
                    "it dies there, resumes from its last checkpoint, the collaborators reconnect by themselves, "
                    "and the final model equals the uninterrupted run's bit for bit",
                    PROCESS_KILL,
                ) as row:
                    if reference.final is None:
                        row.record(f"not run: the uninterrupted reference run did not finish: {reference.notes}", False)
                        continue
                    folder = self.root / mode / point.fault.replace(":", "-")
                    self._compare(row, reference, self._run(folder, secure, point))

    def _run(self, root: Path, secure: bool, point: KillPoint | None) -> Run:
        sections = plan_sections(secure=secure, rounds=ROUNDS, quorum=len(HONEST), timeout=30.0)
        workspace = make_workspace(root, HONEST, plan=sections)
        trainers = (lambda name: trainer_factory(name, DriftTrainer)) if secure else _real_learners
        notes: list[str] = []
        aggregator = AggregatorProcess(workspace, fault=None if point is None else point.fault)
        group = HonestCollaborators.start(workspace, HONEST, trainers)
        try:
            status = aggregator.wait(RUN_SECONDS)
            if point is not None:
                if status != SIGKILL_STATUS:
                    notes.append(f"the kill point was never reached (the aggregator exited with {status})")
                else:
                    notes.append(f"killed (exit {status}) with {len(read_round_log(workspace.output))} rounds logged")
                    aggregator.stop()
                    aggregator = AggregatorProcess(workspace, resume=True)
                    status = aggregator.wait(RUN_SECONDS)
            stuck = group.join(60)
            if status != 0 or stuck or group.errors:
                notes.append(
                    f"the run did not end cleanly: exit {status}, still running {stuck}, errors {group.errors}"
                )
        finally:
            group.stop()
            aggregator.stop()
        path = workspace.output / FINAL_MODEL_NAME
        final = torch.load(path, map_location="cpu", weights_only=True) if path.exists() else None
        return Run(workspace, final, notes)

    @staticmethod
    def _compare(row: Row, reference: Run, run: Run) -> None:
        assert reference.final is not None  # checked by the caller
        log = read_round_log(run.workspace.output)
        statuses = [f"{record['round']}:{record['status']}" for record in log]
        if run.final is None:
            row.record(f"{'; '.join(run.notes)}; no final model", False, rounds=statuses)
            return
        differing = [
            key
            for key in ("theta", "theta_average", "c", "c_average", "rounds")
            if not _same(reference.final[key], run.final[key])
        ]
        killed = any(note.startswith("killed") for note in run.notes)
        clean = not any("did not end cleanly" in note for note in run.notes)
        row.record(
            "; ".join(run.notes)
            + (
                "; final model identical to the uninterrupted run's" if not differing else f"; final {differing} differ"
            ),
            killed and clean and not differing,
            rounds=statuses,
        )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return bool(torch.equal(a, b))
    return bool(a == b)


def _real_learners(name: str) -> TrainerFactory | None:
    """Each collaborator trains its real learner (no exact trainer)."""
    return None
