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
- lost record: the real ``fedfair aggregator start`` past round 1, two sites in threads and the target
  as a real ``fedfair collaborator start`` process; once the target trained two rounds it is stopped,
  its ``NAME.FED.bindings.json`` deleted and it is started again: exit status 2 with
  ``local-state-lost``; with ``--reset-state`` it joins and trains (the control);
- lost ledger: the same with ``[privacy]`` on, the privacy accountant deleted and the record kept: exit
  status 2 naming the accountant (:meth:`~fedfair.runtime.collaborator.input_record.InputRecord.check_accountant`);
  with the accountant restored from its backup it trains again (the control);
- 2 GiB announced: the target a real process beside two sites in threads; round 1 runs honestly (the
  control), then round 2's ADVERTISE_KEYS tasks and the FINISHED task announce a 2 GiB input that Fetch
  would stream in 1 MiB chunks: the process's peak RSS (VmHWM) may grow by at most its plan-derived cap
  (:func:`~fedfair.runtime.collaborator.uplink.input_limit`) + 100 MiB, and nothing is fetched;
- TRAIN flood: the aggregator's gRPC service alone (no round loop), publishing N TRAIN tasks (20,000;
  2,000 with ``--quick``) for rounds 1..N of a 3-round plan, each round a distinct model, to the target
  as a real process: it may train at most 3 times. Each task's model download is counted too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
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
from attacks.federation import HonestCollaborators, kept_state, plan_sections
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.runtime.local.processes import Child, child_environment, collaborator_command, start_aggregator
from fedfair.runtime.aggregator import board as board_module
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.aggregator.network import Network, serve
from fedfair.runtime.aggregator.servicer import Servicer
from fedfair.runtime.aggregator.start import prepare
from fedfair.privacy.accounting import privacy_state_path
from fedfair.runtime.collaborator.charges import data_identity
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.trainer import TrainerFactory
from fedfair.runtime.collaborator.uplink import input_limit
from fedfair.runtime.contract import TRAINING
from fedfair.runtime.local.workspace import Workspace, declared_sizes, make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest
from fedfair.runtime.transport import make_binding, model_parts, pb, read_model

FEDERATION_ID = "fedfair-launch"  # what make_workspace writes
TARGET = FOUR[-1]
THREE = FOUR[:3]
RUN_SECONDS = 90.0
PROCESS_SECONDS = 120.0
ANNOUNCED = 2 << 30
"""The input size the hostile aggregator announces (2 GiB)."""
MIB = 1 << 20
PLAN_ROUNDS = 3
"""The TRAIN flood's plan: 3 rounds."""


def record_rows(where: Path, book: RowBook, *, quick: bool) -> None:
    """Every row of this module (see its notes); `quick` (the test suite's run, about 25 s on 2 cores) sends
    2,000 TRAIN tasks instead of 20,000 and leaves out the lost ledger."""
    control = rerun_row(where / "rerun", book)
    ulp_row(where / "ulp", book, control)
    lost_record_row(where / "lost", book)
    if not quick:  # about 25 s of DP collaborator processes; its refusal has tests in tests/runtime too
        lost_ledger_row(where / "ledger", book)
    announcement_row(where / "announced", book)
    flood_row(where / "flood", book, 2_000 if quick else 20_000)


def real(name: str) -> TrainerFactory | None:
    """Each site's real learner on its Adult part."""
    return None


def bindings_path(workspace: Workspace, name: str) -> Path:
    return workspace.configs[name].parent / f"{name}.{FEDERATION_ID}.bindings.json"


def kept_path(workspace: Workspace, name: str) -> Path:
    return workspace.configs[name].parent / f"{name}.{FEDERATION_ID}.train.kept.npz"


def trainings(workspace: Workspace, name: str) -> int | None:
    """The training rounds `name`'s record counts (None: no readable record)."""
    try:
        return int(json.loads(bindings_path(workspace, name).read_text())["trainings"])
    except (OSError, ValueError, KeyError):
        return None


def sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@contextmanager
def trained_lines() -> Iterator[list[str]]:
    """The collaborators' "trained ... local steps" lines (INFO) while the block runs, one per training."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "local steps on batches" in message:
                lines.append(message)

    logger = logging.getLogger("fedfair.collaborator")
    handler, level = Collect(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


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


# ---------------------------------------------------------------- a lost record


def process_federation_plan(rounds: int, quorum: int, *, secure: bool = False) -> dict[str, dict[str, Any]]:
    """The plan of the rows with a collaborator process: `rounds` rounds of `quorum` sites or more."""
    return plan_sections(secure=secure, rounds=rounds, quorum=quorum, timeout=15.0)


@dataclass
class TargetFederation:
    """The real aggregator process (1,000 rounds: it stays past round 1 throughout), two sites in threads, and
    `TARGET` as real collaborator processes started by :meth:`start`, one after another."""

    workspace: Workspace
    children: list[Child] = field(default_factory=list)
    log: io.StringIO = field(default_factory=io.StringIO)

    def start(self, *extra: str) -> Child:
        """A `fedfair collaborator start` process of TARGET, with `extra` arguments."""
        command = [*collaborator_command(self.workspace, TARGET), *extra]
        self.children.append(Child(TARGET, command, env=child_environment(None), sink=self.log))
        return self.children[-1]

    def trained(self, rounds: int) -> bool:
        """Whether TARGET's record counts at least `rounds` trainings within PROCESS_SECONDS."""
        return wait_until(lambda: (trainings(self.workspace, TARGET) or 0) >= rounds, PROCESS_SECONDS)

    def refused(self, child: Child, word: str) -> tuple[int, str, bool]:
        """`child` run to its end: its exit status, its line holding `word`, whether it printed no traceback."""
        status = child.wait(PROCESS_SECONDS)
        said = next((line for line in child.lines if word in line), "")
        return status, said, not any("Traceback" in line for line in child.lines)


@contextmanager
def target_federation(root: Path, *, privacy: bool) -> Iterator[TargetFederation]:
    names = (*THREE[:2], TARGET)
    plan = process_federation_plan(1000, 2)
    if privacy:  # a DP collaborator joins only a plan that declares every institution's size
        sources = {name: {"dataset": "adult", "partition": "race", "index": index} for index, name in enumerate(names)}
        plan["influence"] = {"weights": "declared", "sizes": declared_sizes(sources, 0) or {}}
    workspace = make_workspace(root, names, plan=plan)
    if privacy:
        config = workspace.configs[TARGET]
        config.write_text(config.read_text() + "\n[privacy]\nenabled = true\n")
    federation = TargetFederation(workspace)
    aggregator = start_aggregator(workspace, sink=federation.log)
    group = HonestCollaborators.start(workspace, names[:2], real)
    try:
        yield federation
    finally:
        for child in federation.children:
            child.kill()
        group.stop()
        aggregator.kill()


def lost_record_row(root: Path, book: RowBook) -> None:
    with book.row(
        f"lost record: {TARGET} contributed two rounds, its {TARGET}.{FEDERATION_ID}.bindings.json is deleted and it "
        "restarts (a real `fedfair collaborator start`) while the aggregator process is past round 1",
        "exit status 2 with local-state-lost, no traceback; started with --reset-state it joins and trains (the control)",
        "real aggregator and collaborator processes",
    ) as row:
        with target_federation(root, privacy=False) as federation:
            first = federation.start()
            contributed = federation.trained(2)
            first.kill()
            bindings_path(federation.workspace, TARGET).unlink(missing_ok=True)
            status, said, clean = federation.refused(federation.start(), "local-state-lost")
            reset = federation.start("--reset-state")
            rejoined = federation.trained(1)
            running = reset.process.poll() is None
        row.record(
            f"{TARGET} trained two rounds: {contributed}; restarted without its record: exit status {status}, "
            f"{said[:240] or 'no local-state-lost line'!r}; with --reset-state: trained again {rejoined}, still "
            f"running {running}",
            contributed and status == 2 and bool(said) and clean and rejoined and running,
            exit_status=status,
        )


def lost_ledger_row(root: Path, book: RowBook) -> None:
    with book.row(
        f"lost ledger: {TARGET} ([privacy] on) trained two rounds, its privacy accountant "
        f"({TARGET}.DATA.privacy.json) is deleted, its record kept, and it restarts (a real process)",
        "exit status 2 naming the accountant that charged fewer rounds than the record counts, no traceback; with "
        "the accountant restored from its backup it joins and trains again (the control)",
        "real aggregator and collaborator processes",
    ) as row:
        with target_federation(root, privacy=True) as federation:
            config = load_collaborator_config(federation.workspace.configs[TARGET])
            accountant = privacy_state_path(config.source.parent, TARGET, data_identity(config.data))
            first = federation.start()
            contributed = federation.trained(2)
            first.kill()
            backup = accountant.read_bytes() if accountant.exists() else None
            accountant.unlink(missing_ok=True)
            status, said, clean = federation.refused(federation.start(), "privacy accountant")
            count = trainings(federation.workspace, TARGET) or 0
            if backup is not None:
                accountant.write_bytes(backup)
            restored = federation.start()
            rejoined = federation.trained(count + 1)
            running = restored.process.poll() is None
        row.record(
            f"{TARGET} trained two private rounds: {contributed} (accountant backed up: {backup is not None}); "
            f"restarted without its accountant: exit status {status}, {said[:300] or 'no line naming it'!r}; "
            f"accountant restored: trained again {rejoined}, still running {running}",
            contributed and backup is not None and status == 2 and bool(said) and clean and rejoined and running,
            exit_status=status,
        )


# ---------------------------------------------------------------- 2 GiB announced


def high_water_mark(pid: int) -> int | None:
    """VmHWM (peak resident memory, bytes) of process `pid`, or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class Announcement:
    """Every round-2 ADVERTISE_KEYS task and the FINISHED task announce ANNOUNCED bytes (nothing inline), and
    Fetch of either streams 1 MiB chunks up to it; the target's VmHWM is read as the first is made."""

    pid: int
    limits: dict[str, int] = field(default_factory=dict)
    """The target's cap (input_limit) for each hostile announcement, by its stage (or FINISHED)."""
    before: int | None = None
    fetches: list[str] = field(default_factory=list)
    hostile: list[pb.Binding] = field(default_factory=list)

    @contextmanager
    def installed(self, collaborators: int, parameters: int) -> Iterator[None]:
        original_task: Callable[[pb.Task, bytes], pb.Task] = getattr(board_module, "task_with_input")
        original_fetch = Servicer.serve_input

        def announce(task: pb.Task, payload: bytes) -> pb.Task:
            binding = task.binding
            finished = task.action == pb.ACTION_FINISHED
            if not finished and (binding.round, binding.stage) != (2, pb.STAGE_ADVERTISE_KEYS):
                return original_task(task, payload)
            what = "FINISHED" if finished else pb.Stage.Name(binding.stage)
            self.limits[what] = input_limit(task, collaborators, parameters, 0)
            if self.before is None:
                self.before = high_water_mark(self.pid)
            self.hostile.append(binding)
            task.input_size = ANNOUNCED
            return task

        def fetch(servicer: Servicer, peer: str, request: pb.FetchRequest, caller: Any) -> Iterator[pb.Part]:
            if request.binding not in self.hostile:
                yield from original_fetch(servicer, peer, request, caller)
                return
            self.fetches.append(peer)
            chunk = bytes(MIB)
            count = ANNOUNCED // MIB
            for index in range(count):
                yield pb.Part(
                    binding=request.binding, chunk=pb.Chunk(index=index, count=count, total_size=ANNOUNCED, data=chunk)
                )

        setattr(board_module, "task_with_input", announce)  # the board's own name for it, as it publishes
        Servicer.serve_input = fetch  # type: ignore[assignment, method-assign]
        try:
            yield
        finally:
            setattr(board_module, "task_with_input", original_task)
            Servicer.serve_input = original_fetch  # type: ignore[method-assign]


def announcement_row(root: Path, book: RowBook) -> None:
    with book.row(
        f"2 GiB announced: round 2's ADVERTISE_KEYS input and the final bundle each announced as {ANNOUNCED >> 20} "
        f"MiB, Fetch streaming 1 MiB chunks, to {TARGET} (a real process) beside two sites in threads, secure "
        "aggregation",
        f"{TARGET} refuses both before fetching and its peak RSS (VmHWM) grows by less than its plan-derived cap "
        "(input_limit, the larger of the two) + 100 MiB; round 1 (the control) applies with every site",
        PATCHED_AGGREGATOR,
    ) as row:
        names = (*THREE[:2], TARGET)
        workspace = make_workspace(root, names, plan=process_federation_plan(2, 3, secure=True))
        plan = load_aggregator_plan(workspace.plan)
        log = io.StringIO()
        tap = StageTap()
        aggregator = LoopAggregator(plan, tap.install)
        group = HonestCollaborators.start(workspace, names[:2], real)
        target = Child(TARGET, collaborator_command(workspace, TARGET), env=child_environment(None), sink=log)
        checkpoint = prepare(plan, resume=False)
        assert checkpoint is not None  # no [schema]: the initial model is known
        attack = Announcement(target.process.pid)
        marks: list[int] = []

        def sampled_until_exit() -> bool:
            # The process leaves once the federation is over, and its VmHWM with it: sampled until then.
            mark = high_water_mark(target.process.pid)
            marks.extend([] if mark is None else [mark])
            return target.process.poll() is not None

        try:
            with attack.installed(len(plan.collaborators), int(checkpoint.state.theta.numel())):
                exited = wait_until(sampled_until_exit, RUN_SECONDS)
        finally:
            target.kill()
            group.stop()
            aggregator.stop()
        peak = max(marks, default=None)
        first_run = tap.sent(1, "STAGE_MASKED_INPUT")
        refused = [line for line in target.lines if "above the" in line and "pinned plan allows" in line]
        growth = None if peak is None or attack.before is None else peak - attack.before
        limit = max(attack.limits.values(), default=0)
        row.record(
            f"round 1 masked inputs from {first_run}; {TARGET}'s VmHWM {_mib(attack.before)} MiB before the first "
            f"announcement, {_mib(peak)} MiB at its exit (exited: {exited}; growth {_mib(growth)} MiB; caps "
            f"{ {what: _mib(value) for what, value in attack.limits.items()} } MiB, + 100 MiB); Fetch calls of the "
            f"announced inputs: {attack.fetches or 'none'}; {len(refused)} refusals, e.g. "
            f"{(refused or ['no refusal line'])[0][-160:]!r}",
            sorted(first_run) == sorted(names)
            and len(attack.limits) == 2
            and growth is not None
            and growth < limit + 100 * MIB
            and len(refused) >= 2
            and not attack.fetches,
            vmhwm_before_bytes=attack.before,
            vmhwm_peak_bytes=peak,
            cap_bytes=attack.limits,
            fetches=len(attack.fetches),
        )


def refusals(lines: list[str], word: str) -> int:
    """The refusals a collaborator's log accounts for: its refusal lines holding `word`, and the refusals it
    counted instead of logging (the collaborator's line budget, :meth:`TaskStream._warn`)."""
    shown = sum(word in line for line in lines)
    counted = re.findall(r"(\d+) more refusals since the last such line were not logged", "\n".join(lines))
    return shown + sum(int(count) for count in counted)


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / MIB:.1f}"


# ---------------------------------------------------------------- a flood of TRAIN tasks


@contextmanager
def flood_service(workspace: Workspace, tasks: int, downloads: list[int], first: int = 1) -> Iterator[Network]:
    """The aggregator's gRPC service alone, its TRAIN downloads served for any round (a distinct model per
    round, each counted in `downloads`) and `tasks` TRAIN tasks for `TARGET` from round `first` on, then FINISHED
    (so the target leaves once it has handled them all, counting the refusals its log did not show)."""
    plan = load_aggregator_plan(workspace.plan)
    checkpoint = prepare(plan, resume=False)
    assert checkpoint is not None  # no [schema]: the initial model is known
    theta, c = checkpoint.state.theta.numpy(), float(checkpoint.state.c)
    original = Servicer.serve_model

    def model(servicer: Servicer, peer: str, request: pb.FetchRequest, caller: Any) -> Iterator[pb.ModelPart]:
        downloads.append(request.binding.round)
        yield from model_parts(request.binding, theta + 1e-3 * request.binding.round, c)

    network = serve(plan, plan_digest(plan))
    Servicer.serve_model = model  # type: ignore[assignment, method-assign]
    network.gate.check_read = network.gate.check_federation  # type: ignore[method-assign]
    for round_number in range(first, first + tasks):
        binding = make_binding(plan.federation_id, round_number, pb.STAGE_TRAIN)
        network.board.publish([TARGET], binding, pb.ACTION_RUN, deadline_seconds=60.0)
    network.board.finish(make_binding(plan.federation_id, first + tasks - 1, pb.STAGE_EVAL_UNMASK))
    try:
        yield network
    finally:
        Servicer.serve_model = original  # type: ignore[method-assign]
        network.stop()


def flooded(workspace: Workspace, tasks: int, downloads: list[int], first: int = 1) -> tuple[Child, bool, float]:
    """TARGET as a real process under :func:`flood_service`, run to its exit: the process, whether it exited
    (within 600 s), and the seconds it took (its start included)."""
    started = time.monotonic()
    with flood_service(workspace, tasks, downloads, first):
        target = Child(TARGET, collaborator_command(workspace, TARGET), env=child_environment(None), sink=io.StringIO())
        try:
            exited = wait_until(lambda: target.process.poll() is not None, 600.0)
        finally:
            target.kill()
    return target, exited, time.monotonic() - started


def flood_row(root: Path, book: RowBook, tasks: int) -> None:
    with book.row(
        f"TRAIN flood: {tasks} TRAIN tasks (rounds 1..{tasks}, a distinct model each) to {TARGET} (a real process) "
        f"under a {PLAN_ROUNDS}-round plan",
        f"it trains at most {PLAN_ROUNDS} times (its record and its log) and refuses every round past the plan's last",
        "the aggregator's gRPC service alone, publishing the tasks",
    ) as row:
        workspace = make_workspace(root, (TARGET,), plan=process_federation_plan(PLAN_ROUNDS, 1))
        downloads: list[int] = []
        target, done, seconds = flooded(workspace, tasks, downloads)
        refused = refusals(target.lines, "past the plan's last round")
        trained = [line for line in target.lines if "local steps on batches" in line]
        count = trainings(workspace, TARGET)
        row.record(
            f"{tasks} tasks in {seconds:.1f} s (process start included): it saw them all: {done}, refused "
            f"{refused} rounds past {PLAN_ROUNDS}, trained {len(trained)} times (its record: {count}); model "
            f"downloads: {len(downloads)} (the round cap is checked before the download)",
            done and len(trained) <= PLAN_ROUNDS and (count or 0) <= PLAN_ROUNDS and refused >= tasks - PLAN_ROUNDS,
            tasks=tasks,
            trained=len(trained),
            record_trainings=count,
            refused=refused,
            downloads=len(downloads),
            seconds=round(seconds, 1),
        )
