"""The chain's doors (issue 79) against real collaborator processes: each refused or sat out at its first round.

fedfair's aggregator runs in a thread (:class:`~attacks.pinned_federation.LoopAggregator`) with its public round seam,
``RoundLoop.train``, wrapped: the wrapper changes ``loop.checkpoint``'s model before a round is run, or runs no
round at all. Three real ``fedfair collaborator start`` processes follow it:

- initial: round 1 is sent the plan's initial model with BACKDOOR on its first BACKDOORED weights. Each site
  builds the initial model itself from the plan's seed: exit 2, ``aggregate-refused`` naming round 1 and
  INITIAL_MODEL, no round counted.
- skipped: round SKIPPED is never run (no sum verified), then round SKIPPED + 1 is sent a backdoored model. No
  site can check it, so none trains on it: each sits every later round out and exits 2 with ``model-unchecked``
  naming round SKIPPED + 1, its record counting the SKIPPED - 1 honest rounds.
- restarted: every site is killed (SIGKILL) once it verified round FORGED's sum and started again; then round
  FORGED + 1 is sent a backdoored model. Each restarted site takes its chain up from the anchor it kept on disk:
  exit 2, ``aggregate-refused`` naming round FORGED + 1 and NEXT_MODEL, FORGED rounds counted.

In every row no site keeps a bundle (the loop evaluates nothing, and a site keeps none it could not check).
"""

from __future__ import annotations

import io
import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attacks.pinned_federation import LoopAggregator, wait_until
from attacks.patience import patient
from attacks.federation import plan_sections
from attacks.target_site import THREE
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.collaborator.chain_record import CHAIN_SUFFIX, read_verdict
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.local.processes import Child, child_environment, collaborator_command
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

ROUNDS = 4
SKIPPED = 2
"""The round the aggregator never runs (skipped): round SKIPPED + 1 is sent the forged model."""
FORGED = 2
"""The last honest round of the restart row: every site restarts after verifying its sum."""
BACKDOOR = 1.0
BACKDOORED = 1
"""The backdoor moves the first BACKDOORED weights of theta by BACKDOOR (issue 79's +1.0 on one weight)."""
PROCESS_SECONDS = 240.0
RESTART_SECONDS = 120.0


@dataclass
class Federation:
    """Three site processes on one workspace; `sites` holds each one's latest process."""

    workspace: Workspace
    sink: io.StringIO = field(default_factory=io.StringIO)
    sites: dict[str, Child] = field(default_factory=dict)
    replacing: threading.Event = field(default_factory=threading.Event)
    """Set while the sites are killed and started again: an exit then is not the site's last."""

    def start(self, name: str) -> None:
        command = collaborator_command(self.workspace, name)
        self.sites[name] = Child(name, command, env=child_environment(None), sink=self.sink)

    def anchored(self, name: str, round_number: int) -> bool:
        """Whether site `name` keeps on disk the anchor of a verified sum of round `round_number`."""
        folder = self.workspace.configs[name].parent
        found = list(folder.glob(f"{name}.*.{CHAIN_SUFFIX}"))
        try:
            return bool(found) and read_verdict(found[0]).round >= round_number
        except (OSError, ValueError):
            return False  # being replaced at this instant


def backdoor(loop: RoundLoop) -> None:
    """Move the first BACKDOORED weights of the model the loop sends next by BACKDOOR."""
    theta = getattr(loop.checkpoint.state, "theta")  # a small model's state is held in memory
    theta[:BACKDOORED] += BACKDOOR


def initial(federation: Federation) -> Callable[[RoundLoop], None]:
    """Round 1 sent a backdoored initial model."""

    def adjust(loop: RoundLoop) -> None:
        train = loop.train

        def backdoored(round_number: int, **options: Any) -> dict[str, Any]:
            if round_number == 1:
                backdoor(loop)
            return train(round_number, **options)

        loop.train = backdoored  # type: ignore[method-assign]

    return adjust


def skipped(federation: Federation) -> Callable[[RoundLoop], None]:
    """Round SKIPPED not run at all (no sum verified); round SKIPPED + 1 sent a backdoored model."""

    def adjust(loop: RoundLoop) -> None:
        train = loop.train

        def skipping(round_number: int, **options: Any) -> dict[str, Any]:
            if round_number == SKIPPED:
                backdoor(loop)
                return {"round": round_number, "status": "aborted", "reason": "skipped", "participants": []}
            return train(round_number, **options)

        loop.train = skipping  # type: ignore[method-assign]

    return adjust


def restarted(federation: Federation) -> Callable[[RoundLoop], None]:
    """Every site killed and started again once it verified round FORGED's sum; round FORGED + 1 backdoored."""

    def adjust(loop: RoundLoop) -> None:
        train = loop.train

        def restarting(round_number: int, **options: Any) -> dict[str, Any]:
            if round_number == FORGED + 1:
                board, names = loop.network.board, list(THREE)
                if not wait_until(lambda: all(federation.anchored(name, FORGED) for name in names), 60.0):
                    raise RuntimeError(f"not every site kept round {FORGED}'s anchor")
                federation.replacing.set()
                for name in names:
                    federation.sites[name].process.kill()  # SIGKILL: nothing in memory survives
                    federation.sites[name].wait(30)
                wait_until(lambda: not board.connected() & set(names), 30.0)
                for name in names:
                    federation.start(name)
                federation.replacing.clear()
                board.wait_for_connected(len(names), patient(RESTART_SECONDS))
                backdoor(loop)
            return train(round_number, **options)

        loop.train = restarting  # type: ignore[method-assign]

    return adjust


ATTACKS: dict[str, tuple[Callable[[Federation], Callable[[RoundLoop], None]], str, str]] = {
    "a backdoored initial model": (
        initial,
        f"round 1 is sent the plan's initial model with {BACKDOOR:g} added to {BACKDOORED} weight",
        "every site (3 real processes) exits 2 with aggregate-refused naming round 1 and INITIAL_MODEL, counts no "
        "round and keeps no bundle",
    ),
    "a skipped round then a forged model": (
        skipped,
        f"round {SKIPPED} is never run (no sum verified), then round {SKIPPED + 1} is sent a backdoored model",
        f"every site sits round {SKIPPED + 1} and every later one out (trains on no unchecked model), exits 2 with "
        f"model-unchecked naming round {SKIPPED + 1}, counts {SKIPPED - 1} round and keeps no bundle",
    ),
    "every site restarted then a forged model": (
        restarted,
        f"every site is killed (SIGKILL) and started again after verifying round {FORGED}'s sum, then round "
        f"{FORGED + 1} is sent a backdoored model",
        f"every restarted site takes its chain up from its anchor on disk: exit 2 with aggregate-refused naming "
        f"round {FORGED + 1} and NEXT_MODEL, {FORGED} rounds counted, no bundle",
    ),
}


def broken_chain_rows(root: Path, book: RowBook) -> None:
    """One row per door: a federation of three site processes each (about 30-60 s on 2 loaded cores)."""
    for index, (name, (attack, done, expected)) in enumerate(ATTACKS.items()):
        with book.row(f"broken chain ({name}): {done}", expected, PATCHED_AGGREGATOR) as row:
            seen = run_federation(root / f"door-{index}", attack)
            wanted = {
                "a backdoored initial model": ("aggregate-refused: round 1:", (1, "INITIAL_MODEL"), 0, []),
                "a skipped round then a forged model": (
                    f"model-unchecked: from round {SKIPPED + 1} on",
                    None,
                    SKIPPED - 1,
                    list(range(SKIPPED + 1, ROUNDS + 1)),
                ),
                "every site restarted then a forged model": (
                    f"aggregate-refused: round {FORGED + 1}:",
                    (FORGED + 1, "NEXT_MODEL"),
                    FORGED,
                    [],
                ),
            }[name]
            said, refusal, count, sat_out = wanted
            row.record(
                f"exit statuses {seen['statuses']}; said {seen['said']}; refusals {seen['refusals']}; rounds each "
                f"record counts {seen['counts']}; rounds sat out {seen['sat_out']}; bundles kept {seen['bundles']}; "
                f"rounds the aggregator applied {seen['applied']}; {seen['seconds']:.1f} s",
                all(status == 2 for status in seen["statuses"].values())
                and all(said in line for line in seen["said"].values())
                and all(found == refusal for found in seen["refusals"].values())
                and all(found == count for found in seen["counts"].values())
                and all(found == sat_out for found in seen["sat_out"].values())
                and not any(seen["bundles"].values()),
                forged_rounds_trained_at_sites=sum(found > count for found in seen["counts"].values()),
            )


def run_federation(root: Path, attack: Callable[[Federation], Callable[[RoundLoop], None]]) -> dict[str, Any]:
    """The federation under `attack`: each site's exit status, closing words, refusal, counts, rounds sat out."""
    workspace = make_workspace(root, THREE, plan=plan_sections(secure=True, rounds=ROUNDS, quorum=3, timeout=15.0))
    plan = load_aggregator_plan(workspace.plan)
    federation = Federation(workspace)
    started = time.monotonic()
    aggregator = LoopAggregator(plan, None, attack(federation))
    for name in THREE:
        federation.start(name)
    statuses: dict[str, int | None] = {}
    try:
        deadline = time.monotonic() + patient(PROCESS_SECONDS)
        for name in THREE:
            # A restarted site replaces its entry: wait for the one that is there once the one before ended.
            while name not in statuses:
                site = federation.sites[name]
                try:
                    code: int | None = site.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    code = None  # still running at the end of its budget: reported, then killed
                wait_until(lambda: not federation.replacing.is_set(), patient(RESTART_SECONDS))
                if federation.sites[name] is site or code is None:
                    statuses[name] = code
    finally:
        for site in federation.sites.values():
            site.kill()
        aggregator.stop()
    seen: dict[str, Any] = {"statuses": statuses, "said": {}, "refusals": {}, "counts": {}, "sat_out": {}}
    seen["bundles"] = {}
    for name in THREE:
        folder = workspace.configs[name].parent
        record = OutcomeRecord(next(folder.glob(f"{name}.*.{OUTCOME_SUFFIX}")), 0)
        lines = federation.sites[name].lines
        seen["said"][name] = next((line for line in lines if "-refused:" in line or "-unchecked:" in line), "")[:160]
        seen["refusals"][name] = None if record.refusal is None else (record.refusal.round, record.refusal.reason)
        seen["counts"][name] = record.contributed
        seen["sat_out"][name] = sorted(record.sat_out)
        seen["bundles"][name] = any(folder.glob("*model_bundle*"))
    log = plan.aggregator.output / "rounds.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    seen["applied"] = [entry["round"] for entry in records if entry["status"] == "applied"]
    seen["seconds"] = time.monotonic() - started
    return seen
