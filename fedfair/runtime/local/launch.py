"""``fedfair launch``: a whole federation on this machine, as a rehearsal of a real deployment.

Why: docs/design.md, "The local federation".
"""

from __future__ import annotations

import argparse
import os
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from fedfair.core.errors import ConfigError, FedfairError
from fedfair.pki.store import ca_paths
from fedfair.runtime.local.processes import (
    Child,
    start_aggregator,
    start_collaborator,
    supervise,
)
from fedfair.runtime.local.console import closing_lines, describe_privacy
from fedfair.runtime.observe.progress import Progress
from fedfair.runtime.output_folder import COMPARISON_NAME, FINAL_SUMMARY_NAME

if TYPE_CHECKING:
    from fedfair.runtime.local.workspace import Workspace
    from fedfair.runtime.plan.aggregator_plan import AggregatorPlan

DEFAULT_ROUNDS = 300
"""About 30 s on two slow cores (a round is a few milliseconds of training and some dozen
loopback round trips, about 0.06 s), enough for FedSRCVaR to pull the worst group's risk well
below FedAvg's on Adult."""

EVALUATIONS = 10
"""Federated evaluations a launch runs by default, the last after the final round: what `fedfair init`'s
plan runs (50 rounds, every 5), so the risk chart has as many points and the answers spend the same."""

COMPOSITION = ("race", "sex")
"""The columns Adult's worst-off group is described by (the composition `fedfair init`'s plan suggests)."""


@dataclass(frozen=True)
class LaunchSplit:
    """How `fedfair launch` splits a dataset into institutions: the partition scheme and how many sites it makes."""

    partition: str
    most: int
    reason: str
    """Why `most` is the limit, for the refusal of more."""


SPLITS: dict[str, LaunchSplit] = {
    "adult": LaunchSplit("race", 5, "Adult's race column makes at most 5 groups"),
    # Census-Income has no state of residence (its "previous_state" is "Not in universe" for the 92%
    # who did not move), so its sites are a uniformly random, near-equal split: 2,490 training rows
    # each at 80 sites. A site is a process of about 250 MB (PSS, benchmarks/federation_bench.py),
    # so 80 of them need about 20 GB.
    "census-income": LaunchSplit("iid", 80, "each is a process on this machine, about 250 MB each"),
}
"""The datasets `fedfair launch` runs, and how each is split into institutions."""


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


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into a KeyboardInterrupt while launch runs.

    So launch stops its children and cleans up instead of dying on the spot or going on. SIGINT is set
    outright because a process started in the background by a non-interactive shell inherits it ignored,
    and Python then never raises KeyboardInterrupt (only the main thread can set a handler).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {stop: signal.signal(stop, interrupt) for stop in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


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


def check_sites(dataset: str, collaborators: int) -> LaunchSplit:
    """The split of `dataset` into `collaborators` institutions; a ConfigError naming the fix if it has none."""
    if dataset not in SPLITS:
        raise ConfigError(f"--dataset {dataset}: launch runs {' or '.join(SPLITS)}; pick one of them")
    split = SPLITS[dataset]
    if not 2 <= collaborators <= split.most:
        larger = [name for name, other in SPLITS.items() if other.most > split.most]
        raise ConfigError(
            f"--collaborators {collaborators}: {dataset} runs 2 to {split.most} institutions ({split.reason}); "
            f"pass --collaborators 2 to {split.most}"
            + (f", or --dataset {larger[0]} for more" if collaborators > split.most and larger else "")
        )
    return split


def site_data(dataset: str, collaborators: int) -> dict[str, dict[str, Any]]:
    """Each institution's [data]: part i of `dataset` split as SPLITS says, by site name."""
    from fedfair.runtime.local.workspace import site_names

    split = check_sites(dataset, collaborators)
    return {
        name: {"dataset": dataset, "partition": split.partition, "index": index}
        for index, name in enumerate(site_names(collaborators))
    }


def declared_influence(training_rows: Mapping[str, int]) -> dict[str, Any]:
    """[influence] weighting each site by its declared training rows: Algorithm 1's weights w_k = b_k.

    So the averaged update is the mean over every sample of the federation, and FedSRCVaR minimises the
    RCVaR of the pooled rows. Under init's "equal" weights each site's rows would count as much as any
    other site's, and a small site's worst rows would stand for far more people than they are.
    """
    return {"weights": "declared", "sizes": dict(training_rows)}


def training_rows(table_rows: int, seed: int) -> int:
    """The rows a site of `table_rows` trains on once its collaborator holds out its default test fraction."""
    import numpy as np

    from fedfair.datasets.tabular import split_rows
    from fedfair.runtime.collaborator.config import DEFAULT_TEST_FRACTION

    train, _ = split_rows(np.zeros(table_rows, dtype=str), DEFAULT_TEST_FRACTION, seed)
    return len(train)


def init_settings(names: list[str]) -> dict[str, dict[str, Any]]:
    """What `fedfair init` writes for these sites that a launch takes as it is: [privacy] and the collusion bound.

    Read from the plan init renders, so the rehearsal follows init's defaults wherever they change.
    """
    from fedfair.core.tables import parse_toml
    from fedfair.runtime.new_federation import default_max_colluding
    from fedfair.runtime.plan.templates import Federation, render_plan

    federation = Federation("fedfair-launch", tuple(names), max_colluding=default_max_colluding(len(names)))
    plan = parse_toml(render_plan(federation), "fedfair init's plan")
    return {
        "privacy": dict(plan["privacy"]),
        "secure_aggregation": {"max_colluding": plan["secure_aggregation"]["max_colluding"]},
    }


def evaluation_every(rounds: int, every: int | None) -> int:
    """``--evaluate-every``, else :data:`EVALUATIONS` evaluations spread over `rounds`."""
    return every if every is not None else max(1, rounds // EVALUATIONS)


def adult_tables(folder: Path, names: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, int]]:
    """Each institution's own table of Adult (adult.data's rows of its race group, raw text), their [schema], sizes.

    The tables go to `folder`/<site>.csv; a site's [data] names its file. The schema is the one `fedfair data
    schema` drafts from all of them together (a rehearsal's operator sees every table; a real one drafts from
    a sample and widens the ranges): listed categories, public ranges, gaps imputed. The sizes are each table's
    rows, by site.
    """
    from fedfair.datasets import load_dataset, partition
    from fedfair.datasets.builtin import adult_table
    from fedfair.datasets.registry import dataset_info
    from fedfair.datasets.schema import draft_schema

    raw = adult_table(dataset_info("adult")).drop(columns=["fnlwgt"])
    # The built-in Adult's training rows are adult.data's, in order: its race split picks each site's rows.
    splits = partition(load_dataset("adult"), SPLITS["adult"].partition, len(names))
    folder.mkdir(parents=True, exist_ok=True)
    data, sizes = {}, {}
    for name, split in zip(names, splits, strict=True):
        path = folder / f"{name}.csv"
        raw.iloc[split.train_index].to_csv(path, index=False)
        data[name] = {"csv": str(path)}
        sizes[name] = len(split.train_index)
    schema = draft_schema(raw, "income", [column for column in raw.columns if column != "income"])
    return data, schema.to_mapping(), sizes


def round_timeout(collaborators: int) -> float:
    """How long a stage waits for every institution.

    2 minutes, plus 2 s per site past 5, since on a two-core machine every stage's work (training, masking, key
    agreement) queues behind every site's.
    """
    return 120.0 + 2.0 * max(collaborators - 5, 0)


def builtin_workspace(args: argparse.Namespace, root: Path) -> Workspace:
    """The workspace of a built-in dataset split into ``args.collaborators`` institutions, with launch's plan."""
    # Imported here, as workspace.declared_sizes does: the datasets (and pandas) are needed once a run starts.
    from fedfair.datasets import load_dataset
    from fedfair.runtime.local.workspace import make_workspace, site_names

    names = site_names(args.collaborators)
    secure = not args.no_secure_aggregation
    rounds = DEFAULT_ROUNDS if args.rounds is None else args.rounds
    training = {
        "rounds": rounds,
        "local_steps": args.local_steps,
        "batch_fraction": args.batch_fraction,
        "lr": args.lr,
        "threshold_lr": args.lr,
        "seed": args.seed,
        "average_from": 0.5,
    }
    if args.drift_correction != "none":  # a plan without the key is today's plan, digest included
        training["drift_correction"] = args.drift_correction
    # What `fedfair init` sets: noised evaluations (privacy needs secure sums, so a plain-sum rehearsal runs
    # without it) and its collusion bound.
    defaults = init_settings(names)
    evaluation: dict[str, Any] = {"every": evaluation_every(rounds, args.evaluate_every)}
    plan: dict[str, Any] = {
        "objective": {"epsilon": args.epsilon, "rho": args.rho},
        "training": training,
        "secure_aggregation": {"enabled": secure, **(defaults["secure_aggregation"] if secure else {})},
        # A rehearsal waits for every institution and gives up quickly if one hangs.
        "quorum": {"min_collaborators": len(names), "round_timeout_seconds": round_timeout(len(names))},
        "evaluation": evaluation,
    }
    if secure:
        plan["privacy"] = defaults["privacy"]
    if args.dataset == "adult":
        # Institutions' own tables under a [schema], as `fedfair init --csv` plans them: the encoder comes
        # from the (noised) statistics before round 1, and the report says who is in the worst-off group.
        data, plan["schema"], table_rows = adult_tables(root / "tables", names)
        evaluation["composition"] = list(COMPOSITION)
        sizes = {name: training_rows(rows, args.seed) for name, rows in table_rows.items()}
    else:
        from fedfair.datasets import partition

        data = site_data(args.dataset, len(names))
        dataset = load_dataset(args.dataset)
        plan["model"] = {"features": dataset.num_features}
        parts = partition(dataset, SPLITS[args.dataset].partition, len(names), seed=args.seed)
        sizes = {name: len(part.train_index) for name, part in zip(names, parts, strict=True)}
    # A rehearsal's operator knows every site's size, so the plan can weight as Algorithm 1 does.
    plan["influence"] = declared_influence(sizes)
    # Careful institutions pin the roster and the plan; a manifest promises secure aggregation. Each site trains
    # on a GPU where it has one, as a deployed collaborator's default config does.
    return make_workspace(root, names, plan=plan, data=data, manifest=secure, device="auto")


def rehearsal_ledgers(root: Path) -> None:
    """Charge a built-in dataset's rehearsal to ledgers in its own workspace, unless FEDFAIR_LEDGER_DIR names some.

    The sites of a built-in split are no institution's: their names and rows are the same in every launch, so in
    the user's ledger folder each `make demo` would add to the last one's spend until init's budget refused a
    demo. A rehearsal on the user's own tables (``--csv``) charges the user's ledgers, as those tables' sites
    would.
    """
    from fedfair.privacy.ledger_home import LEDGER_DIR_VARIABLE

    os.environ.setdefault(LEDGER_DIR_VARIABLE, str(root / "ledgers"))


def run_launch(args: argparse.Namespace, comparison: Comparison | None = None) -> int:
    """Check the split, then `federate` in `--workdir` or a temporary folder, kept when the run finishes unless `--no-keep`."""
    if args.csv and args.label is None:
        raise ConfigError("--csv needs --label COLUMN, the label column every table holds")
    if args.label is not None and not args.csv:
        raise ConfigError("--label names the label column of --csv tables; add --csv TABLE TABLE ...")
    if not args.csv:
        check_sites(args.dataset, args.collaborators)
    if args.workdir is not None and (Path(args.workdir) / "certs" / "ca.crt").exists():
        raise ConfigError(f"{args.workdir} already holds a launched federation; pass another --workdir")
    with stop_on_signals(), launch_folder(args.workdir, args.keep) as root:
        if not args.csv:
            rehearsal_ledgers(root)
        return federate(args, root, kept=args.workdir is not None or args.keep is not False, comparison=comparison)


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


def federate(args: argparse.Namespace, root: Path, *, kept: bool = True, comparison: Comparison | None = None) -> int:
    """Write the workspace under `root`, run the federation, print the closing console last.

    The console stays short: two lines about the federation, a progress bar (round, ETA, the latest
    worst-group and mean risk), then :func:`fedfair.runtime.local.console.closing_lines`: `comparison`'s exact
    reports (headline first), what the federation itself saw, and where the report is (when `kept`).
    Each process's log goes to a file in ``root/logs``; a process that fails has its last lines printed.
    With ``args.csv`` the institutions are those tables, set up as ``fedfair init`` and its README would
    (:mod:`fedfair.runtime.local.rehearsal`).
    """
    from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

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
        describe_privacy(plan.privacy, plan.schema is not None),
        f"an evaluation every {every} rounds"
        + (f", the last naming the worst-off group by {' and '.join(composition)}" if composition else ""),
    ):
        print(f"fedfair launch: {line}", flush=True)
    children: list[Child] = []
    started = time.perf_counter()
    ended = threading.Event()
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    with Progress(rounds, "federation") as shown, ExitStack() as files:

        def log_file(label: str) -> TextIO:
            return files.enter_context((logs / f"{label}.log").open("w", encoding="utf-8"))

        try:
            aggregator = start_aggregator(workspace, sink=log_file("aggregator"), ended=ended)
            children.append(aggregator)
            children.extend(start_collaborator(workspace, name, sink=log_file(name), ended=ended) for name in names)
            supervise(aggregator, children[1:], ended, tick=lambda: shown.update(*rounds_done(workspace)))
        except BaseException:
            # The children run in their own sessions (a Ctrl-C here does not reach them): stop them all.
            for child in children:
                child.kill()
            print_failures(children, logs)
            raise
        shown.update(*rounds_done(workspace))
    summary = json.loads((workspace.output / FINAL_SUMMARY_NAME).read_text())
    report = summary.get("evaluation") or {}
    if report.get("status") != "done":
        raise FedfairError("the federation finished without a final evaluation; see the aggregator's log")
    seconds = time.perf_counter() - started
    exact = None if comparison is None else comparison.reports(workspace, plan)
    # Kept beside the report, so the comparison can be read back as the console printed it.
    comparison_file = {"rho": plan.objective.rho, "exact": exact, "private": report}
    (workspace.output / COMPARISON_NAME).write_text(json.dumps(comparison_file, indent=1) + "\n")
    if plan.aggregator.report and exact is not None:
        from fedfair.runtime.report.page import refresh_report

        refresh_report(workspace.output)  # the aggregator drew it before the comparison existed
    print()
    lines = closing_lines(
        report,
        exact,
        rho=plan.objective.rho,
        secure=summary["secure_aggregation"],
        seconds=seconds,
        report=workspace.output / "report.html" if kept else None,
    )
    print("\n".join(lines))
    return 0
