"""One input per model, state that cannot silently reset, limits from the pinned plan (issue 46, items 1-4).

Each row runs against real collaborators over loopback mTLS, with a control where the honest path works:

- re-run on the same model: a pinned four-site federation under secure aggregation with
  ``dropouts = "none"`` and ``batch_fraction = 1`` (an update is a function of the model); the
  aggregator (fedfair's own, its round loop patched: :class:`Rerun`) runs round 2, restarts every
  collaborator, and runs round 2 again on the same model. The second decoded sum must equal the first
  within the encoding's rounding bound (the kept bits re-sent), and the target trains once;
- the 1-ulp push: the same re-run without the restart, where only the target is sent round 2's model
  with one coordinate moved by one ulp (the aggregator's DownloadModel patched for it): the target must
  refuse (that round was answered for another model), no second sum is decoded, and its kept update
  file is unchanged (SHA-256 before and after); the control is the re-run above;
- a lost record and a lost ledger (:mod:`attacks.lost_state`), 2 GiB announced and the TRAIN flood
  (:mod:`attacks.plan_limits`): rows of this scenario in modules of their own.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attacks.cheating import collaborator_log
from attacks.pinned_federation import (
    FOUR,
    LoopAggregator,
    StageTap,
    pinned_workspace,
    restart_collaborators,
    wait_until,
)
from attacks.federation import HonestCollaborators, kept_state
from attacks.target_site import TARGET, RUN_SECONDS, real, kept_path, trainings, sha256, trained_lines
from attacks.lost_state import lost_record_row, lost_ledger_row
from attacks.plan_limits import announcement_row, flood_row
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.aggregator.servicer import Servicer
from fedfair.runtime.contract import TRAINING
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.transport import model_parts, pb, read_model


def record_rows(where: Path, book: RowBook, *, quick: bool) -> None:
    """Every row of the scenario (see this module's notes); `quick` (the test suite's run, about 25 s on 2 cores) sends
    2,000 TRAIN tasks instead of 20,000 and leaves out the lost ledger."""
    control = rerun_row(where / "rerun", book)
    ulp_row(where / "ulp", book, control)
    lost_record_row(where / "lost", book)
    if not quick:  # about 25 s of DP collaborator processes; its refusal has tests in tests/runtime too
        lost_ledger_row(where / "ledger", book)
    announcement_row(where / "announced", book)
    flood_row(where / "flood", book, 2_000 if quick else 20_000)


# ---------------------------------------------------------------- round 2 again on the same model


@dataclass
class Rerun:
    """Round 1, then round 2 twice on the same model (the loop's model put back after the first run).
    Between the two runs the harness acts (`first_done`, then `proceed`): it restarts the collaborators,
    or, with `push`, only the target is sent the model one ulp away in the second run. Every training sum
    the aggregator decodes is kept, in order, with its error bound."""

    push: bool
    first_done: threading.Event = field(default_factory=threading.Event)
    proceed: threading.Event = field(default_factory=threading.Event)
    sums: list[tuple[int, np.ndarray, float]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)
    pushing: bool = False

    def adjust(self, loop: RoundLoop) -> None:
        train, run = loop.train, loop.driver.run

        def twice(round_number: int, **options: Any) -> dict[str, Any]:
            if round_number != 2:
                return train(round_number, **options)
            before = kept_state(loop.checkpoint.state)
            self.records.append(train(2, **options))
            loop.checkpoint = dataclasses.replace(loop.checkpoint, state=before)
            # As a restarted aggregator process would: its board and gate at the round before, so the
            # collaborators' new streams take part in round 2 and its stages open again.
            loop.network.board.new_round(1)
            loop.network.gate.restart_at(1)
            self.first_done.set()
            self.proceed.wait(RUN_SECONDS)
            self.pushing = self.push
            self.records.append(train(2, **options))
            return self.records[-1]

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if stages is TRAINING:
                self.sums.append((round_number, outcome.weighted_sum.copy(), outcome.error_bound))
            return outcome

        loop.train = twice  # type: ignore[method-assign]
        loop.driver.run = recording  # type: ignore[method-assign]

    @contextmanager
    def pushed_model(self) -> Iterator[None]:
        """DownloadModel, for the target in the second run of round 2: the model with theta[0] one ulp up."""
        original = Servicer.serve_model

        def model(servicer: Servicer, peer: str, request: pb.FetchRequest, caller: Any) -> Iterator[pb.ModelPart]:
            binding = request.binding
            parts = servicer.board.offers.model(binding)
            if not (self.pushing and peer == TARGET and binding.round == 2 and parts):
                yield from original(servicer, peer, request, caller)
                return
            values, c = read_model(parts, binding, max_values=1 << 24)
            values = values.copy()
            values[0] = np.nextafter(values[0], np.inf)
            self.pushed.append(peer)
            yield from model_parts(binding, values, c)

        Servicer.serve_model = model  # type: ignore[assignment, method-assign]
        try:
            yield
        finally:
            Servicer.serve_model = original  # type: ignore[method-assign]


@dataclass
class RerunRun:
    cheat: Rerun
    tap: StageTap
    said: list[str]
    trained: list[str]
    restarted: bool
    kept_before: str | None
    kept_after: str | None
    trainings: int | None
    errors: dict[str, str]


def rerun_run(root: Path, *, push: bool) -> RerunRun:
    workspace = pinned_workspace(
        root, quorum=4, rounds=2, training={"batch_fraction": 1.0}, secure_aggregation={"dropouts": "none"}
    )
    plan = load_aggregator_plan(workspace.plan)
    cheat, tap = Rerun(push), StageTap()
    restarted, kept_before = False, None
    with cheat.pushed_model(), collaborator_log() as said, trained_lines() as trained:
        aggregator = LoopAggregator(plan, tap.install, cheat.adjust)
        groups = [HonestCollaborators.start(workspace, FOUR, real)]
        try:
            if aggregator.network is not None and cheat.first_done.wait(RUN_SECONDS):
                kept_before = sha256(kept_path(workspace, TARGET))
                if not push:
                    restarted, _ = restart_collaborators(workspace, aggregator.network.board, groups, real)
            cheat.proceed.set()
            wait_until(lambda: len(cheat.records) >= 2, RUN_SECONDS)
        finally:
            for group in groups:
                group.stop()
            aggregator.stop()
    errors = {
        f"{name} (run {index + 1})": error for index, group in enumerate(groups) for name, error in group.errors.items()
    }
    if aggregator.error:
        errors["aggregator"] = aggregator.error
    return RerunRun(
        cheat,
        tap,
        said,
        trained,
        restarted,
        kept_before,
        sha256(kept_path(workspace, TARGET)),
        trainings(workspace, TARGET),
        errors,
    )


def rerun_row(root: Path, book: RowBook) -> RerunRun | None:
    """The re-run row; its run, the control of the 1-ulp push (None if the harness broke)."""
    result: RerunRun | None = None
    with book.row(
        f're-run: round 2 twice on the same model (secure aggregation, dropouts = "none", batch_fraction = 1), '
        f"every collaborator restarted in between: retrained, {TARGET}'s new update would be the difference of the sums",
        "the second decoded sum equals the first within the encoding's rounding bound (the kept bits re-sent) and "
        f"{TARGET} trains round 2 once (its record counts 2 trainings: rounds 1 and 2)",
        PATCHED_AGGREGATOR,
    ) as row:
        run = result = rerun_run(root, push=False)
        second = [(vector, bound) for round_number, vector, bound in run.cheat.sums if round_number == 2]
        statuses = [record.get("status") for record in run.cheat.records]
        difference = bound = None
        if len(second) == 2:
            (one, bound_one), (two, bound_two) = second
            difference, bound = float(np.abs(one - two).max()), bound_one + bound_two
        target_trained = [line for line in run.trained if line.startswith(f"{TARGET}: round 2:")]
        row.record(
            f"collaborators restarted: {run.restarted}; round 2 runs: {statuses}; sums decoded for round 2: "
            f"{len(second)}, largest difference {difference} against the rounding bound {bound}; {TARGET} trained "
            f"round 2 {len(target_trained)} time(s), its record counts {run.trainings} trainings",
            run.restarted
            and statuses == ["applied", "applied"]
            and difference is not None
            and bound is not None
            and difference <= bound
            and len(target_trained) == 1
            and run.trainings == 2,
            largest_difference=difference,
            rounding_bound=bound,
            target_round2_trainings=len(target_trained),
            record_trainings=run.trainings,
            errors=run.errors,
        )
    return result


def ulp_row(root: Path, book: RowBook, control: RerunRun | None) -> None:
    with book.row(
        f"1-ulp push: round 2 run again where only {TARGET} is sent the model with theta[0] one ulp up: retrained, "
        f"its update would be the difference of the sums",
        f"{TARGET} refuses (round 2 was answered for another model), no second round-2 sum is decoded, its kept "
        "update file is unchanged; the control is the re-run on the same model (the row above) decoding the same sum",
        PATCHED_AGGREGATOR,
    ) as row:
        run = rerun_run(root, push=True)
        # Since the model chain (collaborator/chain.py) the pushed model is refused as not the model round 2 ran on
        # before the one-answer-per-model rule would refuse it: either refusal counts.
        refusals = [
            line
            for line in run.said
            if line.startswith(f"{TARGET}:")
            and ("answered for another model" in line or "not the plan's server step applied to the sums" in line)
        ]
        second = [round_number for round_number, _, _ in run.cheat.sums if round_number == 2]
        statuses = [record.get("status") for record in run.cheat.records]
        control_ok = control is not None and [r.get("status") for r in control.cheat.records] == ["applied", "applied"]
        unchanged = run.kept_before is not None and run.kept_before == run.kept_after
        row.record(
            f"pushed downloads: {run.cheat.pushed}; round 2 runs: {statuses}; sums decoded for round 2: {len(second)}; "
            f"{TARGET} refused: {bool(refusals)}, e.g. {(refusals or ['nothing'])[0][:240]!r}; kept update file "
            f"{'unchanged' if unchanged else 'CHANGED or missing'} (sha256 {str(run.kept_before)[:12]} -> "
            f"{str(run.kept_after)[:12]}); its record counts {run.trainings} trainings; control applied twice: {control_ok}",
            bool(run.cheat.pushed)
            and bool(refusals)
            and len(second) == 1
            and statuses[:1] == ["applied"]
            and len(statuses) == 2
            and statuses[1] != "applied"
            and unchanged
            and run.trainings == 2
            and control_ok,
            reason=run.cheat.records[-1].get("reason") if run.cheat.records else None,
            errors=run.errors,
        )
