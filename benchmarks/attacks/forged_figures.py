"""A forged evaluation figure (issue 79) against real collaborator processes: refused, never kept.

fedfair's aggregator runs in a thread (:class:`~attacks.pinned_federation.LoopAggregator`), evaluating every round, and
forges the evaluation of round FORGED on in one of two ways:

- sum: its secure-aggregation server moves one word of the evaluation's sum after UNMASK and claims that sum
  (its own check of the survivors' tags skipped, so it relays them all the same). Each site verifies the claimed
  sum: exit 2, ``aggregate-refused`` naming round FORGED and FORGED.
- report: it claims the true sum, which every site verifies, and states the worst-group risk as FORGED_RISK
  ("0.05 (0.05 to 0.05)", the issue's figure) in its record and so in the bundle's metrics. Each site makes the
  figures of every evaluation sum it verified itself: exit 2, ``bundle-refused`` naming round FORGED's
  worst_risk.

In both no site keeps a bundle, and none that a site keeps could carry the forged figure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attacks.federation import plan_sections
from attacks.target_site import THREE
from attacks.rewrites import rewritten
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from attacks.site_processes import run_sites
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.contract import EVALUATION, session_round
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.secagg.server import AggregateResult, Server

ROUNDS = 3
FORGED = 2
"""The first round whose evaluation is forged (each round is evaluated; round 1's is honest)."""
FORGED_RISK = 0.05
SITE_SECONDS = 240.0
"""Longest a site process may run on an idle machine: three rounds, each evaluated (stretched by load)."""


@contextmanager
def forged_sums() -> Iterator[None]:
    """While open, the server moves one word of the evaluation sums of round FORGED on and relays any tags."""
    finish, tags_add_up = Server.finish, Server.tags_add_up
    sessions = {session_round(number, EVALUATION) for number in range(FORGED, ROUNDS + 1)}

    def forged_finish(server: Server) -> AggregateResult:
        if server.config.round in sessions:
            server.running_sum[0] += server.running_sum.dtype.type(
                1 << 12
            )  # a few thousandths of a count: within every bound
        return finish(server)

    def relayed_anyway(server: Server) -> bool:
        return True if server.config.round in sessions else tags_add_up(server)

    with rewritten(Server, finish=forged_finish, tags_add_up=relayed_anyway):
        yield


def forged_report(loop: RoundLoop) -> None:
    """From round FORGED on, the loop's evaluation record states the worst-group risk as FORGED_RISK."""
    evaluate = loop.evaluate

    def forged(round_number: int) -> dict[str, Any]:
        result = evaluate(round_number)
        if round_number >= FORGED and result.get("status") == "done":
            result.update(worst_risk=FORGED_RISK, worst_risk_low=FORGED_RISK, worst_risk_high=FORGED_RISK)
        return result

    loop.evaluate = forged  # type: ignore[method-assign]


def evaluating(loop: RoundLoop, then: Callable[[RoundLoop], None]) -> None:
    """Evaluate every round the plan says (LoopAggregator evaluates none), then `then(loop)`."""
    loop.evaluation_due = lambda number: loop.plan.evaluation.due(number, loop.plan.training.rounds)  # type: ignore[method-assign]
    then(loop)


def forged_figures_rows(root: Path, book: RowBook) -> None:
    """One row per forgery: a federation of three site processes each."""
    with book.row(
        f"forged evaluation sum: from round {FORGED} on the aggregator moves one word of the evaluation's sum after "
        "UNMASK and claims it",
        f"every site (3 real processes) exits 2 with aggregate-refused naming round {FORGED} and FORGED, and keeps no "
        "bundle",
        PATCHED_AGGREGATOR,
    ) as row:
        with forged_sums():
            seen = run_federation(root / "sum", lambda loop: None)
        said = seen["said"]
        row.record(
            f"exit statuses {seen['statuses']}; refusals named {seen['refusals']}; bundles kept {seen['bundles']}; "
            f"{seen['seconds']:.1f} s",
            all(status == 2 for status in seen["statuses"].values())
            and all(f"aggregate-refused: round {FORGED}:" in text and "FORGED" in text for text in said.values())
            and not any(seen["bundles"].values()),
        )
    with book.row(
        f"forged evaluation figure: the aggregator claims every evaluation's true sum (each site verifies it) and "
        f"states the worst-group risk as {FORGED_RISK} from round {FORGED} on (issue 79)",
        f"every site (3 real processes) exits 2 with bundle-refused naming round {FORGED}'s worst_risk, and keeps no "
        "bundle",
        PATCHED_AGGREGATOR,
    ) as row:
        seen = run_federation(root / "report", forged_report)
        said = seen["said"]
        row.record(
            f"exit statuses {seen['statuses']}; refusals named {seen['refusals']}; bundles kept {seen['bundles']}; "
            f"evaluations stated {seen['stated']}; {seen['seconds']:.1f} s",
            all(status == 2 for status in seen["statuses"].values())
            and all(f"round {FORGED}'s worst_risk is {FORGED_RISK}" in text for text in said.values())
            and not any(seen["bundles"].values()),
        )


def run_federation(root: Path, forge: Callable[[RoundLoop], None]) -> dict[str, Any]:
    """The federation under `forge`: each site's exit status, what it said, the refusal named and bundle kept."""
    sections = plan_sections(secure=True, rounds=ROUNDS, quorum=3, timeout=15.0, evaluation_every=1)
    workspace = make_workspace(root, THREE, plan=sections)
    run = run_sites(workspace, lambda loop: evaluating(loop, forge), SITE_SECONDS)
    said = {name: "\n".join(lines) for name, lines in run.lines.items()}
    refusals = {name: _refusal(text) for name, text in said.items()}
    bundles = {name: any(workspace.configs[name].parent.glob("*model_bundle*")) for name in THREE}
    log = load_aggregator_plan(workspace.plan).aggregator.output / "rounds.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    stated = {
        record["round"]: record["evaluation"].get("worst_risk", record["evaluation"].get("status"))
        for record in records
        if "evaluation" in record
    }
    return {
        "statuses": run.statuses,
        "said": said,
        "refusals": refusals,
        "bundles": bundles,
        "stated": stated,
        "seconds": run.seconds,
    }


def _refusal(text: str) -> str | None:
    """The failure a site ended on (aggregate-refused or bundle-refused) and its reason, cut short; None without."""
    for line in reversed(text.splitlines()):
        for kind in ("aggregate-refused", "bundle-refused"):
            if kind in line:
                failure = line[line.index(kind) :]
                reason = failure[failure.index("(") + 1 :] if "(" in failure else failure
                return f"{kind}: {reason[:140]}"
    return None
