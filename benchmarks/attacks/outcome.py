"""The collaborator verifies the federation's outcome (issue 51, item 1).

At FINISHED the aggregator offers its model bundle to every collaborator. fedfair's own aggregator
runs in a thread (:class:`~attacks.pinned_federation.LoopAggregator`, its final evaluation left on) with its
board's ``finish`` rewritten; the target is a real ``fedfair collaborator start`` process beside two
sites in threads, under a secure-aggregation plan of three rounds:

- forged bundle: the aggregator drops the target's masked update unseen in every training round (so no sum
  holds it, and the target signs no survivor set) and offers it the federation's own model under
  federation id ``fed``, its provenance saying every site contributed to every round (the attack that was
  stored and logged "3 of 3", exit 0). It catches up on each round its update was dropped from (issue 98: it
  checks that round's sum from the kept inputs and steps its chain), so it checks every model, takes part in
  every round (each update dropped again), and must refuse the bundle by its federation (``bundle-refused``),
  keep nothing, and count 0 of 3 from its own record;
- tampered bundle: the target takes part in every round and is offered this federation's bundle with
  one weight moved one ulp: refused, naming the weights that differ and by how much, nothing kept;
- substituted output model: the aggregator serves, for the final evaluation and in its bundle alike, the
  last iterate (theta, c after the final step) in place of the average theta-bar: the target's model chain
  refuses it when it is sent to evaluate (not the average of the models made of the sums it verified, exit
  2, aggregate-refused), nothing kept;
- honest bundle (the control): the bundle as the aggregator wrote it is kept byte for byte, the closing
  line counts 3 of 3 from the target's own record, exit 0.
"""

from __future__ import annotations

import dataclasses
import io
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attacks.pinned_federation import LoopAggregator, StageTap
from attacks.federation import HonestCollaborators, plan_sections
from attacks.target_site import TARGET, THREE, real
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.bundle import Bundle, load_bundle, write_bundle
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.aggregator.network import Network
from fedfair.runtime.local.processes import Child, child_environment, collaborator_command
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.transport import pb

ROUNDS = 3
FORGED_FEDERATION = "fed"
PROCESS_SECONDS = 180.0
NAMES = (*THREE[:2], TARGET)


def outcome_rows(where: Path, book: RowBook) -> None:
    """Every row of this module (see its notes): four federations of about 15 s each on 2 cores."""
    for case in REFUSED:
        refused_row(where / case.folder, book, case)
    honest_row(where / "honest", book)


def rewrite(payload: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The bundle `payload` with `change` applied to its fields (state_dict, plan, provenance, ...)."""
    with tempfile.TemporaryDirectory(prefix="fedfair-bundle-") as folder:
        path = Path(folder) / "bundle.pt"
        path.write_bytes(payload)
        fields = dataclasses.asdict(load_bundle(path))
        change(fields)
        write_bundle(path, Bundle(**fields))
        return path.read_bytes()


def another_federation(fields: dict[str, Any]) -> None:
    """Federation id `fed`, and a provenance saying every site contributed to every round."""
    plan = dict(fields["plan"])
    plan["federation"] = {**plan["federation"], "id": FORGED_FEDERATION}
    fields["plan"] = plan
    fields["provenance"] = {**fields["provenance"], "contributions": dict.fromkeys(NAMES, ROUNDS)}


def one_ulp(fields: dict[str, Any]) -> None:
    """The first weight of the first tensor moved one ulp up."""
    state = dict(fields["state_dict"])
    name = next(iter(state))
    tensor = state[name].clone()
    flat = tensor.view(-1)
    flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf"), dtype=flat.dtype))
    state[name] = tensor
    fields["state_dict"] = state


@dataclass
class Offered:
    """The bundles the aggregator wrote and the ones its FINISHED task offered instead."""

    change: Callable[[dict[str, Any]], None] | None
    written: list[bytes] = dataclasses.field(default_factory=list)
    offered: list[bytes] = dataclasses.field(default_factory=list)

    def install(self, network: Network) -> None:
        board = network.board
        finish = board.finish

        def rewritten(binding: pb.Binding, payload: bytes = b"") -> None:
            self.written.append(payload)
            self.offered.append(payload if self.change is None else rewrite(payload, self.change))
            finish(binding, self.offered[-1])

        board.finish = rewritten  # type: ignore[method-assign]


@dataclass
class Run:
    """One federation's run: the target's exit status and log, and what it kept."""

    offered: Offered
    status: int | None
    log: str
    error_line: str
    kept: bytes | None
    others: dict[str, str]
    dropped: list[str]
    """The target's masked updates the aggregator dropped unseen, by round."""
    aggregator_error: str | None
    seconds: float


def run_federation(
    root: Path, change: Callable[[dict[str, Any]], None] | None, *, drop_target: bool, substitute: bool
) -> Run:
    """fedfair's aggregator (FINISHED's bundle rewritten by `change`; with `drop_target`, TARGET's masked update
    dropped unseen in every training round; with `substitute`, the last iterate served as the output model),
    two sites in threads, TARGET a process."""
    workspace = make_workspace(
        root, NAMES, plan=plan_sections(secure=True, rounds=ROUNDS, quorum=2, timeout=15.0, evaluation_every=0)
    )
    plan = load_aggregator_plan(workspace.plan)
    offered = Offered(change)
    tap = StageTap(discard=frozenset({TARGET} if drop_target else ()))

    def install(network: Network) -> None:
        tap.install(network)
        offered.install(network)

    def adjust(loop: RoundLoop) -> None:
        del loop.evaluation_due  # LoopAggregator skips the final evaluation; this attack needs it (the class's)
        if substitute:
            evaluate = loop.evaluate

            def last_iterate(round_number: int) -> dict[str, Any]:
                # The evaluation and then the checkpoint and bundle take the output model from this state.
                if round_number == ROUNDS:
                    state = loop.checkpoint.state
                    swapped = dataclasses.replace(state, theta_average=state.theta, c_average=state.c)
                    loop.checkpoint = dataclasses.replace(loop.checkpoint, state=swapped)
                return evaluate(round_number)

            loop.evaluate = last_iterate  # type: ignore[method-assign]

    started = time.monotonic()
    sink = io.StringIO()
    aggregator = LoopAggregator(plan, install, adjust)
    group = HonestCollaborators.start(workspace, NAMES[:2], real)
    target = Child(TARGET, collaborator_command(workspace, TARGET), env=child_environment(None), sink=sink)
    try:
        status = target.wait(PROCESS_SECONDS)
    finally:
        target.kill()
        group.join(30)
        group.stop()
        aggregator.stop()
    folder = workspace.configs[TARGET].parent
    kept = folder / f"{TARGET}.{plan.federation_id}.model_bundle.pt"
    log = folder / f"{TARGET}.log"
    return Run(
        offered,
        status,
        log.read_text() if log.exists() else "",
        next((line for line in target.lines if "error:" in line), ""),
        kept.read_bytes() if kept.exists() else None,
        dict(group.errors),
        list(tap.discarded),
        aggregator.error,
        time.monotonic() - started,
    )


def closing_count(run: Run) -> str:
    """The target's closing count, as its log says it ("K of N"), or "?"."""
    marker = "holds this institution's update in "
    start = run.log.rfind(marker)
    return "?" if start < 0 else run.log[start + len(marker) :].split(" rounds", 1)[0]


@dataclass(frozen=True)
class RefusedCase:
    """One row whose bundle the target must refuse with a line holding `named`, keeping nothing: the bundle
    rewritten by `change`, the target's masked updates dropped (`drop_target`), or the last iterate served as
    the output model (`substitute`)."""

    folder: str
    attack: str
    expected: str
    named: str
    change: Callable[[dict[str, Any]], None] | None = None
    drop_target: bool = False
    substitute: bool = False
    failure: str = "bundle-refused"
    """The failure class the target's error line names."""


REFUSED = (
    RefusedCase(
        "forged",
        f"forged bundle: {TARGET} (a real process) whose masked update the aggregator drops unseen in every training "
        f"round (no sum holds it) is offered at FINISHED this federation's model under federation id "
        f"'{FORGED_FEDERATION}', its provenance saying every site contributed to all {ROUNDS} rounds",
        f"exit status 2 with bundle-refused naming the federation (it caught up on every round its update was "
        f"dropped from, issue 98, so it checked every model), no bundle kept, and the closing line counting 0 of "
        f"{ROUNDS} rounds from {TARGET}'s own record",
        f"the bundle is a model of federation '{FORGED_FEDERATION}'",
        change=another_federation,
        drop_target=True,
    ),
    RefusedCase(
        "tampered",
        f"tampered bundle: {TARGET} (a real process) trains every round and is offered this federation's own bundle "
        "with one weight moved one ulp",
        f"exit status 2 with bundle-refused naming the model difference (1 weight, by one ulp), no bundle kept, and "
        f"the closing line counting {ROUNDS} of {ROUNDS} rounds from {TARGET}'s own record",
        "model: 1 of ",
        change=one_ulp,
    ),
    RefusedCase(
        "substituted",
        f"substituted output model: {TARGET} (a real process) trains every round; the aggregator serves the last "
        "iterate in place of the average theta-bar for the final evaluation and holds it in its bundle alike",
        f"exit status 2 with aggregate-refused (NEXT_MODEL) at the final evaluation, before any answer: the output "
        f"model sent to {TARGET} is not the average of the models the server step makes of the sums it verified "
        "(its model chain); no bundle kept",
        "is not the average of the",
        substitute=True,
        failure="aggregate-refused",
    ),
)


def refused_row(root: Path, book: RowBook, case: RefusedCase) -> None:
    with book.row(case.attack, case.expected, PATCHED_AGGREGATOR) as row:
        run = run_federation(root, case.change, drop_target=case.drop_target, substitute=case.substitute)
        counted = 0 if case.drop_target else ROUNDS
        row.record(
            f"exit status {run.status}; {reason_of(run)[:400]!r}; bundle kept: {run.kept is not None}; closing "
            f"count {closing_count(run)} (own record; the offered provenance claimed {ROUNDS} of {ROUNDS}); masked "
            f"updates dropped: {run.dropped or 'none'}; {len(run.offered.offered)} bundle offered in "
            f"{run.seconds:.1f} s",
            run.status == 2
            and case.failure in run.error_line
            and case.named in run.error_line
            and run.kept is None
            # A target whose update is dropped catches up on that round and takes part in the next (issue 98).
            and len(run.dropped) == (ROUNDS if case.drop_target else 0)
            # The chain refuses a substituted output model when it is sent to evaluate: no closing line follows.
            and (case.substitute or closing_count(run) == f"{counted} of {ROUNDS}")
            and len(run.offered.offered) == 1,
            **details(run),
        )


def reason_of(run: Run) -> str:
    """The target's error line from the refusal's reason on (its id and the reason), or the whole line."""
    start = run.error_line.find("output model (")
    return run.error_line if start < 0 else "bundle-refused: ... " + run.error_line[start + len("output model (") :]


def details(run: Run) -> dict[str, Any]:
    """A row's details of `run`."""
    return {"exit_status": run.status, "closing_count": closing_count(run), "aggregator_error": run.aggregator_error}


def honest_row(root: Path, book: RowBook) -> None:
    with book.row(
        f"honest bundle (the control): {TARGET} (a real process) trains every round and is offered the bundle as "
        "the aggregator wrote it",
        f"kept byte for byte, the closing line counting {ROUNDS} of {ROUNDS} rounds from its own record, exit status 0",
        PATCHED_AGGREGATOR,
    ) as row:
        run = run_federation(root, None, drop_target=False, substitute=False)
        same = run.kept is not None and run.offered.written[:1] == [run.kept]
        row.record(
            f"exit status {run.status}; bundle kept, equal to the aggregator's: {same}; closing count "
            f"{closing_count(run)}; the other sites: {run.others or 'no errors'}",
            run.status == 0 and same and closing_count(run) == f"{ROUNDS} of {ROUNDS}" and not run.others,
            **details(run),
        )
