"""One answer per model at the final evaluation: asking for the same model again averages no noise away.

The row runs against real processes on loopback mutual TLS: three ``fedfair collaborator start`` processes
with their own CSV tables under a pinned manifest, a [schema], ``[evaluation] composition = [sector]``, noised
answers (report_epsilon 1, interim_report_epsilon 0.5) and a plan whose final model was evaluated before
(2 rounds, ``every = 1``, ``average_from = 0.5``: both evaluations are of theta^2). fedfair's aggregator, its
round loop patched, asks the final evaluation, then asks it again on the same model (the board and the stage
gate back at the round, as a restarted aggregator's would be), hoping for a second noise draw on the counts
and the risks to average. Each site must send the same words again: the two decoded records are equal, and
each ledger holds exactly two evaluation charges, the earlier answer and the counts alone. Before, the final
evaluation on an earlier-answered model sent nothing at all (it aborted), so no composition was reported.
"""

from __future__ import annotations

import io
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from attacks.statistics_sum import COUNTRIES, census_schema, institution_table
from attacks.pinned_federation import LoopAggregator, wait_until
from attacks.federation import plan_sections
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from attacks.waits import NAMES
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.processes import Child, child_environment, collaborator_command
from fedfair.runtime.local.workspace import Workspace, make_workspace, write_pinned_manifest
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_aggregator_plan

ROUNDS = 2
PRIVACY = {"report_epsilon": 1.0, "interim_report_epsilon": 0.5, "budget": 10.0, "delta": 1e-5}
TABLE_ROWS = 1500
PROCESS_SECONDS = 180.0


def rewind(loop: RoundLoop, round_number: int) -> None:
    """The board and the stage gate back at `round_number`'s start, as a restarted aggregator's would be."""
    loop.network.board.new_round(round_number)
    loop.network.gate.restart_at(round_number)


@dataclass
class AskedTwice:
    """The loop evaluates as the plan says; after the last round it asks the same evaluation once more."""

    outcomes: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def adjust(self, loop: RoundLoop) -> None:
        evaluate, due = loop.evaluate, loop.plan.evaluation.due

        def twice(round_number: int) -> dict[str, Any]:
            self.outcomes.append((round_number, evaluate(round_number)))
            if round_number == ROUNDS:
                rewind(loop, round_number)
                self.outcomes.append((round_number, evaluate(round_number)))
            return self.outcomes[-1][1]

        loop.evaluation_due = lambda round_number: due(round_number, ROUNDS)  # type: ignore[method-assign]
        loop.evaluate = twice  # type: ignore[method-assign]


def against_processes(
    workspace: Workspace, plan: AggregatorPlan, names: Sequence[str], adjust: Callable[[RoundLoop], None]
) -> tuple[bool, str | None, list[Child]]:
    """fedfair's aggregator in this process, its loop adjusted by `adjust`, and a collaborator process per name.

    Returns whether every process exited within PROCESS_SECONDS, the aggregator's error and the children.
    """
    aggregator = LoopAggregator(plan, adjust=adjust)
    log = io.StringIO()
    children = [Child(n, collaborator_command(workspace, n), env=child_environment(None), sink=log) for n in names]
    try:
        exited = wait_until(lambda: all(child.process.poll() is not None for child in children), PROCESS_SECONDS)
    finally:
        for child in children:
            child.kill()
        aggregator.stop()
    return exited, aggregator.error, children


def repeat_model_rows(where: Path, book: RowBook) -> None:
    """The row of this module (see its notes)."""
    with book.row(
        f"final evaluation asked twice: {ROUNDS} rounds, every = 1, average_from = 0.5 (the final model was "
        "evaluated at round 1), composition by sector, report_epsilon 1 (interim 0.5); the aggregator asks the "
        "final evaluation, then again on the same model, of three collaborator processes under a pinned manifest",
        "the final evaluation reports the composition; the second ask decodes exactly the first (no fresh noise "
        "to average); each ledger holds two evaluation charges: round 1's answer and the counts alone",
        PATCHED_AGGREGATOR,
    ) as row:
        folder = where / "tables"
        folder.mkdir(parents=True, exist_ok=True)
        data = {}
        for index, name in enumerate(NAMES):
            path = folder / f"{name}.csv"
            table = institution_table(TABLE_ROWS, seed=index)
            table["country"] = np.random.default_rng(100 + index).choice(COUNTRIES, TABLE_ROWS)
            table.to_csv(path, index=False)
            data[name] = {"csv": str(path)}
        sections = plan_sections(secure=True, rounds=ROUNDS, quorum=3, timeout=30.0, privacy=PRIVACY)
        sections["training"]["average_from"] = 0.5
        sections["evaluation"]["every"] = 1
        workspace = make_workspace(where / "federation", NAMES, plan=sections, data=data, manifest=True)
        # The composition and the [schema] it needs, added to the plan and pinned again.
        written = tomllib.loads(workspace.plan.read_text())
        written["evaluation"]["composition"] = ["sector"]
        workspace.plan.write_text(tomli_w.dumps(written) + "\n" + census_schema().to_toml())
        pinned = workspace.root / "manifest-with-schema.toml"
        write_pinned_manifest(pinned, workspace.plan, workspace.certs)
        pinned.replace(workspace.root / "manifest.toml")
        plan = load_aggregator_plan(workspace.plan)
        cheat = AskedTwice()
        exited, error, _ = against_processes(workspace, plan, NAMES, cheat.adjust)
        statuses = [f"{r}: {outcome.get('status')}" for r, outcome in cheat.outcomes]
        finals = [outcome for r, outcome in cheat.outcomes if r == ROUNDS and outcome.get("status") == "done"]
        same = len(finals) == 2 and finals[0] == finals[1]
        composed = bool(finals) and finals[0].get("composition", {}).get("rows") is not None
        charged = {
            name: [
                int(str(entry["round"]))
                for entry in open_ledger(load_collaborator_config(workspace.configs[name])).releases()
                if entry["kind"] == "evaluate"
            ]
            for name in NAMES
        }
        row.record(
            f"{len(cheat.outcomes)} evaluations asked ({statuses}); the two final decodes equal: {same}; "
            f"composition reported: {composed}; evaluation charges per site (rounds, its ledger): {charged}; "
            f"processes exited: {exited}",
            same and composed and all(rounds == [1, ROUNDS] for rounds in charged.values()),
            asks=len(cheat.outcomes),
            charges_per_site={name: len(rounds) for name, rounds in charged.items()},
            errors={"aggregator": error} if error else {},
        )
