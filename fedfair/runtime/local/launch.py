"""``fedfair launch``: a whole federation on this machine, as a rehearsal of a real deployment.

Why: docs/design.md, "The local federation".
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from fedfair.core.errors import ConfigError, FedfairError
from fedfair.pki.store import ca_paths
from fedfair.runtime.process_facts import process_started
from fedfair.runtime.local.processes import (
    Child,
    start_aggregator,
    start_auditor,
    start_collaborator,
    stop_all,
    supervise,
)
from fedfair.runtime.local.builtin import SPLITS, builtin_workspace, check_sites, rehearsal_ledgers
from fedfair.runtime.local.console import closing_lines, describe_privacy
from fedfair.runtime.observe.progress import Progress
from fedfair.runtime.output_folder import COMPARISON_NAME, FINAL_SUMMARY_NAME
from fedfair.runtime.stops import stop_on_signals

if TYPE_CHECKING:
    from fedfair.runtime.local.workspace import Workspace
    from fedfair.runtime.plan.aggregator_plan import AggregatorPlan


@dataclass(frozen=True)
class Comparison:
    """What a finished launch is compared with, measured alike: each model's exact report on the same held-out rows.

    `reports` maps the launched workspace and its plan to {model name: report}, the federation's own model first,
    each report with the keys of :data:`fedfair.runtime.output_folder.COMPARISON_COLUMNS` and "rows"; `fedfair launch`
    passes research's (:mod:`fedfair.research.launch_baseline`), which layers above this one.
    """

    reports: Callable[[Workspace, AggregatorPlan], Mapping[str, Mapping[str, float]]]


@contextmanager
def launch_folder(workdir: str | None, keep: bool | None) -> Iterator[Path]:
    """The workspace folder: `workdir` (kept), or a new temporary one.

    The temporary one is kept when `keep` is True, removed on leaving when it is False, and when None (the
    default: kept once the run finishes) removed only if the run does not finish. Removal is in a `finally`,
    so errors and Ctrl-C (and SIGTERM, which `stop_on_signals` turns into an exception) leave nothing behind
    unless asked.
    """
    if workdir is not None:
        yield Path(workdir)
        return
    root = Path(tempfile.mkdtemp(prefix="fedfair-launch-"))
    finished = False
    try:
        yield root
        finished = True
    finally:
        if keep is False or (keep is None and not finished):
            shutil.rmtree(root, ignore_errors=True)


def remove_ca_key(certs: Path) -> None:
    """Delete the CA's private key: every certificate of the rehearsal is issued, and nothing in a run signs."""
    _, key = ca_paths(certs)
    key.unlink(missing_ok=True)


def rounds_done(workspace: Workspace) -> tuple[int, str]:
    """The last round the aggregator has logged (0 before the first) and the progress bar's note.

    Both are read from the round log; the note is the latest evaluation's worst-group and mean risk
    ("" before the first).
    """
    from fedfair.runtime.aggregator.checkpoint import read_round_log

    try:
        records = read_round_log(workspace.output)
    except (OSError, ValueError):  # a line being appended right now; the next tick reads it whole
        return 0, ""
    done = max((int(record.get("round", 0)) for record in records), default=0)
    evaluations = [
        record["evaluation"] for record in records if (record.get("evaluation") or {}).get("status") == "done"
    ]
    if not evaluations:
        return done, ""
    from fedfair.runtime.report import verdicts

    return done, verdicts.progress_note(evaluations[-1])


LOG_TAIL_LINES = 15
"""How many of a failed process's last log lines launch prints."""


def print_failures(children: list[Child], logs: Path) -> None:
    """The end of the log of each process that failed (the logs are files: the console stays quiet)."""
    for child in children:
        code = child.process.poll()
        if code not in (None, 0):
            print(f"fedfair launch: {child.label} exited with status {code}; its last lines:", file=sys.stderr)
            for line in child.lines[-LOG_TAIL_LINES:]:
                print(f"  {line}", file=sys.stderr)
    print(f"fedfair launch: every process's log is in {logs}", file=sys.stderr)


def run_launch(args: argparse.Namespace, comparison: Comparison | None = None) -> int:
    """Check the split, then `federate` in `--workdir` or a temporary folder, kept when the run finishes unless `--no-keep`."""
    # What the operator waits for starts with the command, imports included: "Finished in" counts it all.
    started = process_started()
    if args.csv and args.label is None:
        raise ConfigError("--csv needs --label COLUMN, the label column every table holds")
    if args.label is not None and not args.csv:
        raise ConfigError("--label names the label column of --csv tables; add --csv TABLE TABLE ...")
    if args.input_bound and args.csv:
        raise ConfigError(
            "--input-bound rehearses the built-in datasets only: drop --csv to see the mode on them, or drop "
            "--input-bound to rehearse your tables; to run the bound on your own tables, `fedfair init DIR --sites "
            "A,B,C --csv SAMPLE --label COLUMN --auditor NAME` writes the federation and the README of its steps"
        )
    if args.input_bound and args.no_secure_aggregation:
        raise ConfigError("--input-bound proves masked inputs within their bounds; drop --no-secure-aggregation")
    if not args.csv:
        check_sites(args.dataset, args.collaborators)
    if args.workdir is not None and (Path(args.workdir) / "certs" / "ca.crt").exists():
        raise ConfigError(f"{args.workdir} already holds a launched federation; pass another --workdir")
    with stop_on_signals(), launch_folder(args.workdir, args.keep) as root:
        if not args.csv:
            rehearsal_ledgers(root)
        kept = args.workdir is not None or args.keep is not False
        return federate(args, root, kept=kept, comparison=comparison, started=started)


def launch_workspace(args: argparse.Namespace, root: Path) -> tuple[Workspace, str]:
    """The workspace `launch` runs under `root` from its arguments, and what its institutions hold, in words.

    ``args.csv``'s tables set up as ``fedfair init`` and its README would
    (:mod:`fedfair.runtime.local.rehearsal`), else a built-in dataset split as :data:`SPLITS` says.
    """
    if args.csv:
        from fedfair.runtime.local.rehearsal import rehearsal_workspace

        workspace = rehearsal_workspace(root, args.csv, args.label, rounds=args.rounds)
        return workspace, "their own tables under init's plan"
    return builtin_workspace(args, root), f"{args.dataset} split by {SPLITS[args.dataset].partition}"


def bound_words(plan: AggregatorPlan) -> tuple[str, ...]:
    """The opening line under the two-verifier input bound, who verifies every update; none without it."""
    secure = plan.secure_aggregation
    if not secure.bounds_inputs:
        return ()
    return (f"input bound on: every site proves each update within its bound to the aggregator and {secure.auditor}",)


def federate(
    args: argparse.Namespace,
    root: Path,
    *,
    kept: bool = True,
    comparison: Comparison | None = None,
    started: float | None = None,
) -> int:
    """Write the workspace under `root`, run the federation, print the closing console last.

    The console stays short: two lines about the federation, a progress bar (round, ETA, the latest
    worst-group and mean risk), then :func:`fedfair.runtime.local.console.closing_lines`: `comparison`'s exact
    reports (headline first), what the federation itself saw, and where the report is (when `kept`).
    Each process's log goes to a file in ``root/logs``; a process that fails has its last lines printed.
    With ``args.csv`` the institutions are those tables, set up as ``fedfair init`` and its README would
    (:mod:`fedfair.runtime.local.rehearsal`). "Finished in" is the wall time since `started` (the command's
    start, on ``time.monotonic``'s clock; default: this call's): everything the operator waited for.
    """
    from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

    started = time.monotonic() if started is None else started
    workspace, holding = launch_workspace(args, root)
    names = list(workspace.configs)
    plan = load_aggregator_plan(workspace.plan)
    rounds, secure = plan.training.rounds, plan.secure_aggregation.enabled
    remove_ca_key(workspace.certs)
    composition = plan.evaluation.composition
    every = plan.evaluation.every or rounds
    for line in (
        f"workspace {root}",
        f"{len(names)} institutions holding {holding}, {rounds} rounds, secure aggregation {'on' if secure else 'OFF'}",
        *bound_words(plan),
        describe_privacy(plan.privacy, plan.schema is not None),
        f"an evaluation every {every} rounds"
        + (f", the last naming the worst-off group by {' and '.join(composition)}" if composition else ""),
    ):
        print(f"fedfair launch: {line}", flush=True)
    children: list[Child] = []
    ended = threading.Event()
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    with Progress(rounds, "federation") as shown, ExitStack() as files:

        def log_file(label: str) -> TextIO:
            return files.enter_context((logs / f"{label}.log").open("w", encoding="utf-8"))

        try:
            aggregator = start_aggregator(workspace, sink=log_file("aggregator"), ended=ended)
            children.append(aggregator)
            if workspace.auditor is not None:
                auditor = workspace.auditor.parent.name
                children.append(start_auditor(workspace, sink=log_file(auditor), ended=ended))
            children.extend(start_collaborator(workspace, name, sink=log_file(name), ended=ended) for name in names)
            supervise(aggregator, children[1:], ended, tick=lambda: shown.update(*rounds_done(workspace)))
        except BaseException:
            # The children run in their own sessions (a Ctrl-C here does not reach them): stop them all.
            stop_all(children)
            print_failures(children, logs)
            raise
        shown.update(*rounds_done(workspace))
    summary = json.loads((workspace.output / FINAL_SUMMARY_NAME).read_text())
    report = summary.get("evaluation") or {}
    if report.get("status") != "done":
        raise FedfairError("the federation finished without a final evaluation; see the aggregator's log")
    exact = None if comparison is None else comparison.reports(workspace, plan)
    # Kept beside the report, so the comparison can be read back as the console printed it.
    comparison_file = {"rho": plan.objective.rho, "exact": exact, "private": report}
    (workspace.output / COMPARISON_NAME).write_text(json.dumps(comparison_file, indent=1) + "\n")
    if plan.aggregator.report and exact is not None:
        from fedfair.runtime.report.page import refresh_report

        refresh_report(workspace.output)  # the aggregator drew it before the comparison existed
    # The wall time the operator waited: the workspace, the federation, the comparison and the report.
    seconds = time.monotonic() - started
    print()
    lines = closing_lines(
        report,
        exact,
        rho=plan.objective.rho,
        secure=summary["secure_aggregation"],
        seconds=seconds,
        report=workspace.output / "report.html" if kept else None,
        auditor=plan.secure_aggregation.auditor,
    )
    print("\n".join(lines))
    return 0
