"""One party leaving a secure federation mid-round (issue 79): it costs nothing where every site re-sums.

A pinned three-site secure federation of 6 rounds, quorum 2, over loopback mutual TLS (``fedfair aggregator
start``, ``fedfair collaborator start``), with and without ``[privacy] mode = "distributed"``. site-c dies
(kill -9) in round 2 once its input is masked and the sum unmasked, right before it sends its tag of the claimed
sum, and never comes back. Every site re-sums the sum itself (the model is small: ``SecAggConfig.resummed``), so
its tag plays no part in the sum's value: the aggregator relays the tags it has, and round 2 applies with
site-c's input in it. Before, nobody could verify that sum, so round 2 was void and, without noise, every later
round with it (the sites' inputs on the model were bound to round 2's survivors). Rows:

- a site killed before its VERIFY upload, under distributed noise and without: every round applies, the later
  ones without it, and the sites that stayed exit 0 with a bundle (they checked every model).
- the same site restarted (quorum 3, so round 3 waits for it): it catches up on round 2 (issue 98) and every
  process exits 0 with the same bundle.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from attacks.federation import plan_sections
from attacks.ledger import PROCESSES, Quiet
from attacks.patience import patient
from attacks.rows import RowBook
from attacks.site_processes import wait_while_sites_run
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.faults import VARIABLE as FAULT
from fedfair.runtime.local.processes import Child, start_aggregator, start_collaborator
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

THREE = ("site-a", "site-b", "site-c")
LOST = "site-c"
ROUNDS, LOST_ROUND = 6, 2
PROCESS_SECONDS = 180.0
ONE_STEP = {"local_steps": 1}
KILLED = {FAULT: f"before-upload:{LOST_ROUND}:STAGE_VERIFY_CLAIM"}


def leaving_rows(where: Path, book: RowBook) -> None:
    """The rows of this module (see the module's notes): with distributed noise, then without."""
    for noised in (True, False):
        leaving_row(where / ("noised" if noised else "plain"), book, noised=noised)
    returning_row(where / "returning", book)


def leaving_row(where: Path, book: RowBook, *, noised: bool) -> None:
    """site-c killed before its round-2 tag in a federation with (`noised`) or without distributed noise."""
    privacy = '[privacy] mode = "distributed"' if noised else "no training noise"
    with book.row(
        f"a site killed before its VERIFY upload: {LOST} dies (kill -9) in round {LOST_ROUND} right before it tags "
        f"the unmasked sum, and never returns ({privacy}, 3 sites, quorum 2)",
        "every round applies (its input is in the sum every other site re-sums), the later ones without it; "
        "the other sites exit 0 with a bundle",
        PROCESSES,
    ) as row:
        sections = plan_sections(secure=True, rounds=ROUNDS, quorum=2, timeout=30.0, training=ONE_STEP)
        if noised:
            sections["privacy"] = {"mode": "distributed", "epsilon": 3.0, "report_epsilon": 1.0}
            del sections["influence"]  # declared sizes (the workspace's), which distributed noise needs
        workspace, status, records, _ = ran_with_lost_site(where, sections, restarted=False)
        applied = [record["round"] for record in records if record["status"] == "applied"]
        aborted = [record["round"] for record in records if record["status"] != "applied"]
        without = [record["round"] for record in records if LOST not in record.get("contributors", [])]
        bundles = [name for name in THREE if list(workspace.configs[name].parent.glob(f"{name}.*.model_bundle.pt"))]
        stayed = [name for name in THREE if name != LOST]
        row.record(
            f"rounds applied {applied}, aborted {aborted}, without {LOST} {without}; exit statuses {status}; "
            f"bundles kept by {bundles}",
            aborted == []
            and applied == list(range(1, ROUNDS + 1))
            and without == list(range(LOST_ROUND + 1, ROUNDS + 1))
            and status["aggregator"] == 0
            and all(status[name] == 0 for name in stayed)
            and set(stayed) <= set(bundles),
            applied=len(applied),
            aborted=len(aborted),
        )


def returning_row(where: Path, book: RowBook) -> None:
    """site-c killed before its round-2 tag and started again: it catches up on round 2 and ends with the others."""
    with book.row(
        f"a site killed for one round and restarted: {LOST} dies (kill -9) in round {LOST_ROUND} right before it tags "
        "the unmasked sum and is started again (no training noise, 3 sites, quorum 3)",
        f"every round applies; {LOST} catches up on round {LOST_ROUND} (it checks the sum the aggregator kept as a "
        "survivor would), contributes to every later round, and every process exits 0 with the same bundle",
        PROCESSES,
    ) as row:
        sections = plan_sections(secure=True, rounds=ROUNDS, quorum=3, timeout=60.0, training=ONE_STEP)
        workspace, status, records, children = ran_with_lost_site(where, sections, restarted=True)
        applied = [record["round"] for record in records if record["status"] == "applied"]
        with_it = [record["round"] for record in records if LOST in record.get("contributors", [])]
        bundles = {
            hashlib.sha256(bundle.read_bytes()).hexdigest()[:12]
            for name in THREE
            for bundle in workspace.configs[name].parent.glob(f"{name}.*.model_bundle.pt")
        }
        caught_up = any(f"round {LOST_ROUND}: caught up" in line for line in children[LOST].lines)
        row.record(
            f"rounds applied {applied}, with {LOST} {with_it}; {LOST} caught up: {caught_up}; exit statuses "
            f"{status}; bundles {sorted(bundles)}",
            status["killed"] == -9
            and applied == list(range(1, ROUNDS + 1))
            and with_it == applied
            and caught_up
            and all(status[name] == 0 for name in ("aggregator", *THREE))
            and len(bundles) == 1
            and all(list(workspace.configs[name].parent.glob(f"{name}.*.model_bundle.pt")) for name in THREE),
            applied=len(applied),
        )


def ran_with_lost_site(
    where: Path, sections: dict[str, dict[str, Any]], *, restarted: bool
) -> tuple[Workspace, dict[str, int], list[dict[str, Any]], dict[str, Child]]:
    """The three sites' federation under `sections` run to its end, LOST killed as KILLED says (`restarted`: then
    started again).

    Returns the workspace, each process's exit status (``killed``: LOST's first, where restarted), the round log and
    the site processes (their lines).
    """
    workspace = make_workspace(where, THREE, plan=sections)
    output = load_aggregator_plan(workspace.plan).aggregator.output
    aggregator = start_aggregator(workspace, sink=Quiet())
    children = {name: start_collaborator(workspace, name, env=KILLED if name == LOST else None, sink=Quiet())
                for name in THREE}  # fmt: skip
    status: dict[str, int] = {}
    try:
        if restarted:
            status["killed"] = children[LOST].wait(patient(120.0))
            children[LOST] = start_collaborator(workspace, LOST, sink=Quiet())
        status["aggregator"] = wait_while_sites_run(aggregator, children, PROCESS_SECONDS)
        status.update({name: children[name].wait(patient(60.0)) for name in THREE})
    finally:
        for child in (aggregator, *children.values()):
            child.kill()
    return workspace, status, read_round_log(output), children
