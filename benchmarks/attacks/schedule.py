"""Only the plan's evaluations, refusals that do not flood the log, a grace that bounds a round (issue 51, 2, 6, 9).

Each row runs against real processes on loopback mutual TLS:

- evaluation schedule: three ``fedfair collaborator start`` processes under a pinned manifest, ``[privacy]
  report_epsilon = 1`` and ``[evaluation] every = 0`` (one evaluation, after the last of ROUNDS rounds);
  fedfair's aggregator, its round loop patched, asks an evaluation after every round and, at the last, again
  on the evaluated model one ulp away (the stage gate rewound). Each site must answer, and charge its
  ledger for, the plan's one evaluation only; the control is that evaluation, decoded. Before, a site
  answered every round's (the issue's attacker got 56 answers per site from a plan promising one);
- refusal flood: the aggregator's gRPC service alone publishes N TRAIN tasks past a 3-round plan (20,000;
  2,000 with ``--quick``), then FINISHED, to a ``fedfair collaborator start`` process: its log file may grow
  by at most FLOOD_LINES lines, and its refusal lines with the count it logs of those it skipped must
  account for every task. Before, one line per task (20,002 lines, 4.2 MB);
- a site just under the grace: the real ``fedfair aggregator start`` with ``[quorum] grace_factor = 2`` and
  three collaborators in threads, site-c answering every stage 1.5 s late (each stage's grace ends at the 2 s
  floor): in every round the waits past the stages' median answers must add up to at most one grace (the
  floor) plus what closing a stage takes, and site-c is dropped once its round's grace is spent. The same
  federation with an honest site-c gives the round times without a laggard. Before, each stage waited 1.5 s
  for it: rounds of 8.0 s instead of 0.04 s.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from attacks.federation import plan_sections, wire_ulp_up
from attacks.own_ledgers import federation_ledgers
from attacks.plan_limits import PLAN_ROUNDS, flooded, refusals
from attacks.target_site import TARGET, process_federation_plan
from attacks.repeat_model import against_processes, rewind
from attacks.rows import PATCHED_AGGREGATOR, PATCHED_COLLABORATOR, RowBook
from attacks.waits import GRACE, NAMES, late_federation
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.aggregator.stages import GRACE_FLOOR_SECONDS
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

ROUNDS = 3
"""The evaluation row's plan: 3 rounds, evaluated once (after the last)."""
PRIVACY = {"report_epsilon": 1.0, "budget": 10.0, "delta": 1e-5}
"""One answer spends epsilon 1, within a budget of 10: a budget the asks could spend ten times over."""
FLOOD_LINES = 20
"""The most lines a flood of refused tasks may add to a collaborator's log (issue 51's acceptance)."""
JUST_UNDER = 1.5
"""How late the laggard answers every stage: under the 2 s floor of each stage's grace."""
CLOSING_SECONDS = 0.25
"""What closing a round's stages may take beyond their last answers (the board wakes, the next stage opens)."""


def schedule_rows(where: Path, book: RowBook, *, quick: bool) -> None:
    """Every row of this module (see its notes). `quick` (the test suite's run, about 40 s on 2 cores) floods
    2,000 tasks and leaves out the late site (about a minute of two federations), which tests/runtime holds
    (test_laggard.py)."""
    evaluation_row(where / "evaluation", book)
    flood_lines_row(where / "flood", book, 2_000 if quick else 20_000)
    if not quick:
        late_site_row(where / "late", book)


# ---------------------------------------------------------------- only the plan's evaluations


@dataclass
class EveryRound:
    """The loop asks an evaluation after every round; after the last, a second one on the model one ulp away
    (theta-bar[0] up; the board and gate back at the round, as a restarted aggregator's would be). Every
    evaluation's outcome is kept with its round."""

    outcomes: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def adjust(self, loop: RoundLoop) -> None:
        evaluate = loop.evaluate

        def asking(round_number: int) -> dict[str, Any]:
            self.outcomes.append((round_number, evaluate(round_number)))
            if round_number == ROUNDS:
                rewind(loop, round_number)
                state = loop.checkpoint.state
                theta = state.theta_average.clone()
                theta[0] = wire_ulp_up(theta[0].item())
                loop.checkpoint = dataclasses.replace(
                    loop.checkpoint, state=dataclasses.replace(state, theta_average=theta)
                )
                self.outcomes.append((round_number, evaluate(round_number)))
            return self.outcomes[-1][1]

        loop.evaluation_due = lambda round_number: True  # type: ignore[method-assign]
        loop.evaluate = asking  # type: ignore[method-assign]


def bindings(workspace: Workspace, name: str, federation: str) -> dict[str, Any]:
    """`name`'s record of the federation (empty if it has none)."""
    path = workspace.configs[name].parent / f"{name}.{federation}.bindings.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def evaluation_row(root: Path, book: RowBook) -> None:
    with book.row(
        f"evaluation schedule: a plan with [evaluation] every = 0 over {ROUNDS} rounds (one evaluation), report_epsilon "
        f"= 1; the aggregator asks an evaluation after every round and again after the last on the model one ulp "
        f"away ({ROUNDS + 1} asks), to three collaborator processes under a pinned manifest",
        "each site answers and charges only the plan's evaluation (after the last round); every other ask is "
        "refused before any download, logged once; the control, that evaluation, is decoded",
        PATCHED_AGGREGATOR,
    ) as row:
        names = NAMES
        sections = plan_sections(secure=True, rounds=ROUNDS, quorum=3, timeout=30.0, privacy=PRIVACY)
        workspace = make_workspace(root, names, plan=sections, manifest=True)
        plan = load_aggregator_plan(workspace.plan)
        cheat = EveryRound()
        with federation_ledgers(workspace):  # its sites' ledgers hold this federation's charges alone
            exited, error, children = against_processes(workspace, plan, names, cheat.adjust)
            ledgers = {name: open_ledger(load_collaborator_config(workspace.configs[name])) for name in names}
        statuses = [f"{r}: {outcome.get('status')}" for r, outcome in cheat.outcomes]
        decoded = [r for r, outcome in cheat.outcomes if outcome.get("status") == "done"]
        answered: dict[str, list[int]] = {}
        charged: dict[str, list[int]] = {}
        refused: dict[str, int] = {}
        for name, child in zip(names, children, strict=True):
            record = bindings(workspace, name, plan.federation_id)
            answered[name] = sorted(
                int(entry["round"]) for key, entry in record.get("inputs", {}).items() if key.startswith("evaluate:")
            )
            charged[name] = [int(str(entry["round"])) for entry in ledgers[name].releases()]
            said = "\n".join(child.lines)
            # The one-ulp model is refused by the model chain (not the server step of the sums it verified) before
            # the site's one-answer-per-model rule would refuse it: either line counts.
            refused[name] = (
                said.count("not one the pinned plan evaluates")
                + said.count("answered for another model")
                + said.count("not the plan's server step applied to the sums")
            )
        row.record(
            f"{len(cheat.outcomes)} evaluations asked ({statuses}); decoded: rounds {decoded}; answered per site "
            f"(its record): {answered}; charged per site (its ledger): {charged}; refusal lines per site: {refused}; "
            f"processes exited: {exited}",
            len(cheat.outcomes) == ROUNDS + 1
            and decoded == [ROUNDS]
            and all(rounds == [ROUNDS] for rounds in answered.values())
            and all(rounds == [ROUNDS] for rounds in charged.values())
            and all(count == ROUNDS for count in refused.values()),
            asks=len(cheat.outcomes),
            answers_per_site={name: len(rounds) for name, rounds in answered.items()},
            charges_per_site={name: len(rounds) for name, rounds in charged.items()},
            errors={"aggregator": error} if error else {},
        )


# ---------------------------------------------------------------- a flood of refused tasks


def log_lines_after_join(path: Path) -> list[str]:
    """The lines of a collaborator's log file after it joined (what the aggregator's tasks made it write)."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    joined = next((index for index, line in enumerate(lines) if "joined federation" in line), len(lines))
    return lines[joined + 1 :]


def flood_lines_row(root: Path, book: RowBook, tasks: int) -> None:
    with book.row(
        f"refusal flood: {tasks} TRAIN tasks past a {PLAN_ROUNDS}-round plan (rounds {PLAN_ROUNDS + 1}.."
        f"{PLAN_ROUNDS + tasks}), then FINISHED, to {TARGET} (a real process)",
        f"every one refused, and its log file grows by at most {FLOOD_LINES} lines, the refusals it did not log "
        "counted on a line so that every one is accounted for",
        "the aggregator's gRPC service alone, publishing the tasks",
    ) as row:
        workspace = make_workspace(root, (TARGET,), plan=process_federation_plan(PLAN_ROUNDS, 1))
        _, exited, seconds = flooded(workspace, tasks, [], first=PLAN_ROUNDS + 1)
        log_file = workspace.configs[TARGET].parent / f"{TARGET}.log"
        added = log_lines_after_join(log_file)
        accounted = refusals(added, "past the plan's last round")
        size = sum(len(line) + 1 for line in added)
        row.record(
            f"{tasks} tasks in {seconds:.1f} s (process start included), exited: {exited}; its log file gained "
            f"{len(added)} lines ({size} bytes) after it joined, accounting for {accounted} refusals; the last: "
            f"{(added or ['none'])[-1][-140:]!r}",
            exited and len(added) <= FLOOD_LINES and accounted == tasks,
            tasks=tasks,
            log_lines=len(added),
            log_bytes=size,
            refusals_accounted=accounted,
            seconds=round(seconds, 1),
        )


# ---------------------------------------------------------------- a site just under the grace


def waits_past_medians(record: dict[str, Any]) -> float:
    """How long a round's stages ran past their median answers, summed: what its laggards cost it."""
    total = 0.0
    for stage, answers in record["answer_seconds"].items():
        times = sorted(seconds for seconds in answers.values() if seconds is not None)
        if stage in record.get("stage_seconds", {}) and times:
            total += record["stage_seconds"][stage] - times[min((len(answers) + 1) // 2, len(times)) - 1]
    return total


def late_site_row(root: Path, book: RowBook) -> None:
    rounds = 3
    with book.row(
        f"a site just under the grace: one of 3 answers every stage {JUST_UNDER:g} s late, each stage's grace "
        f"ending at the {GRACE_FLOOR_SECONDS:g} s floor ([quorum] grace_factor = {GRACE:g}); the real aggregator "
        "process",
        f"each round's waits past its stages' median answers add up to at most one grace (the {GRACE_FLOOR_SECONDS:g} "
        f"s floor) + {CLOSING_SECONDS:g} s, the site dropped once its round's grace is spent, the rounds applied "
        "without it; the control, an honest site-c, gives the round times without a laggard",
        PATCHED_COLLABORATOR,
    ) as row:
        log, _ = late_federation(root / "late", GRACE, rounds, JUST_UNDER)
        honest, _ = late_federation(root / "honest", GRACE, rounds, 0.0)
        waits = [round(waits_past_medians(record), 3) for record in log]
        seconds = [round(record["seconds"], 2) for record in log]
        baseline = [round(record["seconds"], 2) for record in honest]
        contributors = [record.get("contributors") for record in log]
        row.record(
            f"round seconds with site-c {JUST_UNDER:g} s late {seconds}, with it honest {baseline}; waits past the "
            f"stages' medians per round {waits} s; contributors {contributors}; site-c held rounds up "
            f"{[record.get('held_up_by', {}).get('site-c') for record in log]} s",
            len(log) == rounds
            and all(record["status"] == "applied" for record in log)
            and all(wait <= GRACE_FLOOR_SECONDS + CLOSING_SECONDS for wait in waits)
            and all(names == NAMES[:2] for names in contributors),
            round_seconds=seconds,
            round_seconds_honest=baseline,
            waits_past_medians=waits,
        )
