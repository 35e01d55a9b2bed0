"""Limits from the pinned plan: a 2 GiB input announced, and a flood of TRAIN tasks past the plan's rounds.

Rows of the record scenario (:mod:`attacks.record`), with a control where the honest path works:

- 2 GiB announced: the target a real process beside two sites in threads; round 1 runs honestly (the
  control), then round 2's ADVERTISE_KEYS tasks and the FINISHED task announce a 2 GiB input that Fetch
  would stream in 1 MiB chunks: the process's peak RSS (VmHWM) may grow by at most its plan-derived cap
  (:func:`~fedfair.runtime.peer.uplink.input_limit`) + 100 MiB, and nothing is fetched;
- TRAIN flood: the aggregator's gRPC service alone (no round loop), publishing N TRAIN tasks (20,000;
  2,000 with ``--quick``) for rounds 1..N of a 3-round plan, each round a distinct model, to the target
  as a real process: it may train at most 3 times. Each task's model download is counted too.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attacks.hostile_client import named_stage, stage_name, stage_of
from attacks.pinned_federation import LoopAggregator, StageTap, wait_until
from attacks.federation import HonestCollaborators
from attacks.target_site import TARGET, THREE, RUN_SECONDS, real, trainings, process_federation_plan
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.runtime.local.processes import Child, child_environment, collaborator_command
from fedfair.runtime.aggregator import board as board_module
from fedfair.runtime.aggregator.network import Network, serve
from fedfair.runtime.aggregator.servicer import Servicer
from fedfair.runtime.aggregator.start import prepare
from fedfair.runtime.peer.uplink import input_limit
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest
from fedfair.runtime.contract import EVALUATION, TRAINING, Aggregations
from fedfair.runtime.transport import TRAIN, make_binding, model_parts, pb

ANNOUNCED = 2 << 30
"""The input size the hostile aggregator announces (2 GiB)."""
MIB = 1 << 20
PLAN_ROUNDS = 3
"""The TRAIN flood's plan: 3 rounds."""


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
            if not finished and (binding.round, stage_of(binding)) != (2, named_stage("STAGE_ADVERTISE_KEYS")):
                return original_task(task, payload)
            what = "FINISHED" if finished else stage_name(stage_of(binding))
            self.limits[what] = input_limit(task, Aggregations(TRAINING, EVALUATION), collaborators, parameters, 0)
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
        binding = make_binding(plan.federation_id, round_number, TRAIN)
        network.board.publish([TARGET], binding, pb.ACTION_RUN, deadline_seconds=60.0)
    network.board.finish(make_binding(plan.federation_id, first + tasks - 1, EVALUATION.sum_end))
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
