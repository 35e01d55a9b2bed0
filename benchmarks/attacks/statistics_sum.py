"""The statistics sum (round 0): no small count decoded, and no re-run without a site.

A row of the consent scenario (:mod:`attacks.consent`), over its pinned federation (:mod:`attacks.pinned_federation`):
a ``[schema]`` federation of four CSV tables, one holding a country (a learnt column, read through the public bucket
hash and a dictionary) and another a listed sector in exactly 1 row. The decoded statistics sum (round 0) must hold
no categorical count from 1 to ``min_category_count`` - 1, the rare cells 0; the control counts the same tables
without suppression (pandas) and finds both at 1. Then, the collaborators restarted, the aggregator re-runs round 0
(its stage gate rewound, as a fresh process's would be) with every site (the control: the same sum) and without one
site: nobody may sign that. Its tables (:func:`institution_table`, :func:`census_schema`) serve other scenarios too.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attacks.cheating import collaborator_log
from attacks.federation import HonestCollaborators, plan_sections
from attacks.pinned_federation import (
    FOUR,
    TIMEOUT,
    RUN_SECONDS,
    LoopAggregator,
    StageTap,
    restart_collaborators,
    run_errors,
    lines_of,
    fixed,
    short,
)
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.datasets.schema import Column, Schema
from fedfair.datasets.statistics import statistics_slices, statistics_vector
from fedfair.datasets.values import category_bucket
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.core.errors import StatisticsError
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.trainer import LocalTable, check_schema_table
from fedfair.runtime.local.workspace import Workspace, make_workspace, write_pinned_manifest
from fedfair.runtime.plan.aggregator_plan import (
    AggregatorPlan,
    load_aggregator_plan,
    load_shared_settings,
    shared_settings,
)
from fedfair.runtime.preprocessing import STATISTICS_KIND, STATISTICS_ROUND
from fedfair.runtime.transport import StageGate


SECTORS = ("private", "public", "self-employed")
COUNTRIES = ("United-States", "Mexico", "Philippines")
RARE_SECTOR, RARE_COUNTRY = "military", "Tuvalu"
"""Each in exactly 1 (training) row of one site: a listed category and a value of a learnt column."""
CANDIDATES = (*COUNTRIES, RARE_COUNTRY, "Canada", "Germany", "India", "Jamaica")
"""The attacker's dictionary of countries, read off the decoded sum through the public bucket hash."""
MIN_COUNT = 10
SITE_ROWS = 150


def institution_table(rows: int, seed: int = 0) -> pd.DataFrame:
    generator = np.random.default_rng(seed)
    age = generator.integers(18, 90, rows)
    hours = generator.normal(40, 12, rows).round(1)
    sector = generator.choice(["private", "public", "self-employed"], rows)
    score = (age - 50) / 15 + (hours - 40) / 12 + (sector == "public") + generator.normal(0, 0.5, rows)
    label = np.where(score > 0, ">50K", "<=50K")
    return pd.DataFrame({"age": age, "hours": hours, "sector": sector, "income": label})


def census_schema() -> Schema:
    """age and hours (numeric), sector (listed, the rare category among them) and country (learnt)."""
    return Schema(
        label="income",
        classes=("<=50K", ">50K"),
        columns=(
            # Public ranges: under [privacy] the statistics clip each value into them (the noise scenario).
            Column("age", "numeric", None, (0.0, 120.0)),
            Column("hours", "numeric", None, (0.0, 100.0)),
            Column("sector", "categorical", (*SECTORS, RARE_SECTOR)),
            Column("country", "categorical", None),
        ),
        min_category_count=MIN_COUNT,
    )


def training_rows(workspace: Workspace, plan: AggregatorPlan, name: str, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of `table` that `name`'s collaborator sums (its training split, as the collaborator makes it)."""
    config = load_collaborator_config(workspace.configs[name])
    shared = load_shared_settings(shared_settings(plan))
    return check_schema_table(config, shared, LocalTable(None, table.copy())).train


def census_federation(root: Path) -> tuple[Workspace, AggregatorPlan, dict[str, pd.DataFrame]]:
    """Four sites with their own CSV tables under a pinned plan with :func:`census_schema`; site-a holds
    RARE_COUNTRY and site-b RARE_SECTOR in one training row each. Returns each site's training rows."""
    folder = root / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.csv" for name in FOUR}
    tables = {}
    for index, name in enumerate(FOUR):
        table = institution_table(SITE_ROWS, seed=index)
        table["country"] = np.random.default_rng(100 + index).choice(COUNTRIES, SITE_ROWS, p=(0.8, 0.12, 0.08))
        table.to_csv(paths[name], index=False)
        tables[name] = table
    # min_round_size = quorum = 3, so a statistics round of three is legitimate: only the binding can refuse it.
    sections = plan_sections(secure=True, rounds=1, quorum=3, timeout=TIMEOUT)
    data = {name: {"csv": str(path)} for name, path in paths.items()}
    workspace = make_workspace(root, FOUR, plan=sections, data=data, manifest=True)
    workspace.plan.write_text(workspace.plan.read_text() + "\n" + census_schema().to_toml())
    # Pinned again, now with the [schema] (written beside the old manifest, which the plan still names, then moved).
    pinned = workspace.root / "manifest-with-schema.toml"
    write_pinned_manifest(pinned, workspace.plan, workspace.certs)
    pinned.replace(workspace.root / "manifest.toml")
    plan = load_aggregator_plan(workspace.plan)
    for name, column, value in ((FOUR[0], "country", RARE_COUNTRY), (FOUR[1], "sector", RARE_SECTOR)):
        first = training_rows(workspace, plan, name, tables[name]).index[0]
        tables[name].loc[first, column] = value
        tables[name].to_csv(paths[name], index=False)
    trained = {name: training_rows(workspace, plan, name, pd.read_csv(paths[name])) for name in FOUR}
    return workspace, plan, trained


def counted(schema: Schema, tables: Mapping[str, pd.DataFrame]) -> np.ndarray:
    """The sum of the sites' statistics vectors as it would be without suppression: every categorical cell
    counted with pandas (value_counts of each site's rows), the rest as the sites send it."""
    vector = np.sum([statistics_vector(schema, table) for table in tables.values()], axis=0)
    for column, where in statistics_slices(schema):
        if column.kind != "categorical":
            continue
        cells = np.zeros(where.stop - where.start)
        for table in tables.values():
            values = table[column.name]
            cells[-1] += int(values.isna().sum())
            for value, count in values.dropna().astype(str).value_counts().items():
                slot = (
                    column.categories.index(value)
                    if column.categories is not None
                    else category_bucket(column.name, value, schema.hash_buckets)
                )
                cells[slot] += count
        vector[where] = cells
    return vector


def small_cells(schema: Schema, vector: np.ndarray) -> list[tuple[str, int, int]]:
    """(column, cell, count) of every categorical count from 1 to min_category_count - 1 in `vector`."""
    found = []
    for column, where in statistics_slices(schema):
        if column.kind == "categorical":
            cells = vector[where]
            found += [(column.name, int(i), int(cells[i])) for i in np.flatnonzero((cells > 0) & (cells < MIN_COUNT))]
    return found


def cell(schema: Schema, vector: np.ndarray, column_name: str, value: str) -> int:
    """What `vector` holds for `value` of a categorical column (a learnt column's: its hash bucket)."""
    column, where = next((column, where) for column, where in statistics_slices(schema) if column.name == column_name)
    slot = (
        column.categories.index(value)
        if column.categories is not None
        else category_bucket(column.name, value, schema.hash_buckets)
    )
    return int(vector[where][slot])


def rewind(gate: StageGate, board: Any) -> None:
    """Let `gate` open round 0 again, as the fresh gate and board of a restarted aggregator process would (the
    cheat: a statistics checkpoint thrown away); the gate otherwise only moves forward. The board forgets round
    0's tasks too, so no collaborator answers a stage of the previous run into this one."""
    gate.restart_at(STATISTICS_ROUND)
    board.new_round(STATISTICS_ROUND)


@dataclass
class StatisticsRerun:
    """The statistics aggregation (round 0) three times: "first" with every site; then, once the harness
    has restarted the collaborators (`first_done`, then `proceed`), "again" with every site (the control) and
    "without" `leave_out`. Each decoded sum is kept, and each run's uploads (the tap's, swapped per run)."""

    leave_out: str
    tap: StageTap
    first_done: threading.Event = field(default_factory=threading.Event)
    proceed: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    uploads: dict[str, dict[tuple[int, str], list[str]]] = field(default_factory=dict)
    expected: dict[str, dict[tuple[int, str], list[str]]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def adjust(self, loop: RoundLoop) -> None:
        run, participants = loop.driver.run, loop.choose_participants
        current = ["first"]

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if options.get("kind") == STATISTICS_KIND:
                self.sums[current[0]] = outcome.weighted_sum.copy()
            return outcome

        def chosen(round_number: int, **options: Any) -> frozenset[str]:
            connected = participants(round_number, **options)
            return connected - {self.leave_out} if current[0] == "without" else connected

        def statistics(label: str) -> None:
            current[0] = label
            self.tap.uploads, self.tap.expected = {}, {}
            try:
                loop.federate_statistics()
            except StatisticsError as error:
                self.failures[label] = str(error)
            finally:
                self.uploads[label], self.expected[label] = self.tap.uploads, self.tap.expected

        def cheat() -> dict[str, Any]:
            try:
                statistics("first")
                # Forget the first run's tasks before the harness restarts the collaborators: the new
                # processes must not answer a stage of it, whose upload would carry the same binding as the
                # re-run's and land in it (a restarted aggregator's fresh board holds none either).
                loop.network.board.new_round(STATISTICS_ROUND)
                self.first_done.set()
                if self.proceed.wait(RUN_SECONDS):
                    for label in ("again", "without"):
                        rewind(loop.network.gate, loop.network.board)
                        statistics(label)
                return {}
            finally:
                self.first_done.set()
                self.done.set()

        loop.driver.run = recording  # type: ignore[method-assign]
        loop.choose_participants = chosen  # type: ignore[method-assign]
        loop.run = cheat  # type: ignore[method-assign]


@dataclass
class StatisticsRun:
    schema: Schema
    trained: dict[str, pd.DataFrame]
    cheat: StatisticsRerun
    said: list[str]
    restarted: bool
    bindings_kept: list[str]
    errors: dict[str, str]


def statistics_run(root: Path, leave_out: str) -> StatisticsRun:
    workspace, plan, trained = census_federation(root)
    assert plan.schema is not None
    tap = StageTap()
    cheat = StatisticsRerun(leave_out, tap)
    aggregator = LoopAggregator(plan, tap.install, cheat.adjust)
    board = aggregator.network.board if aggregator.network is not None else None
    restarted, kept = False, list[str]()
    with collaborator_log() as said:
        groups = [HonestCollaborators.start(workspace, FOUR, fixed)]
        try:
            if board is not None and cheat.first_done.wait(RUN_SECONDS) and "first" in cheat.sums:
                restarted, kept = restart_collaborators(workspace, board, groups, fixed)
            cheat.proceed.set()
            cheat.done.wait(RUN_SECONDS)
        finally:
            for group in groups:
                group.stop()
            aggregator.stop()
    errors = run_errors(groups, aggregator)
    return StatisticsRun(plan.schema, trained, cheat, said, restarted and len(groups) == 2, kept, errors)


def statistics_row(root: Path, book: RowBook) -> None:
    left_out = FOUR[0]
    with book.row(
        f"statistics: a [schema] federation under secure aggregation where {FOUR[0]} holds country = "
        f"{RARE_COUNTRY!r} (a learnt column) and {FOUR[1]} sector = {RARE_SECTOR!r} (a listed one) in 1 row each; "
        "the aggregator decodes the statistics sum (round 0) and reads every cell, countries through the public "
        f"bucket hash and a dictionary; then, the collaborators restarted, it re-runs round 0 without {left_out}: "
        f"the difference of the sums would be {left_out}'s vector",
        f"the decoded sum holds no categorical count from 1 to min_category_count - 1 = {MIN_COUNT - 1} and 0 for "
        "both rare values, whereas the same tables counted without suppression (pandas, offline) hold them at 1 "
        "(the control); the restarted collaborators sign round 0 again with every site (the same sum decoded, "
        f"the control) and none signs it without {left_out}: nothing decoded",
        PATCHED_AGGREGATOR,
    ) as row:
        attack = statistics_run(root, left_out)
        schema, cheat = attack.schema, attack.cheat
        decoded = cheat.sums.get("first")
        offline = np.sum([statistics_vector(schema, table) for table in attack.trained.values()], axis=0)
        unsuppressed = counted(schema, attack.trained)
        rare = (("country", RARE_COUNTRY), ("sector", RARE_SECTOR))
        # The premises: the decoded sum is these tables' (as the sites send them), and counted without
        # suppression the rare values are there, 1 row each, in cells of their own.
        others = {category_bucket("country", value, schema.hash_buckets) for value in COUNTRIES}
        premise = (
            decoded is not None
            and np.array_equal(decoded, offline)
            and all(cell(schema, unsuppressed, column, value) == 1 for column, value in rare)
            and category_bucket("country", RARE_COUNTRY, schema.hash_buckets) not in others
        )
        would_show = small_cells(schema, unsuppressed)
        shown = small_cells(schema, decoded) if decoded is not None else None
        read = {value: cell(schema, decoded, "country", value) for value in CANDIDATES} if decoded is not None else {}
        rare_read = (
            {value: cell(schema, decoded, column, value) for column, value in rare} if decoded is not None else {}
        )
        suppressed = premise and shown == [] and set(rare_read.values()) == {0} and bool(would_show)
        # Differencing: round 0 again with every site (the control), then without left_out.
        participants = cheat.expected.get("without", {}).get((STATISTICS_ROUND, "STAGE_EVAL_ADVERTISE_KEYS"), [])
        again = cheat.sums.get("again")
        control_ok = again is not None and decoded is not None and np.array_equal(again, decoded)
        refusals = {
            name: lines_of(attack.said, name, "already signed for with other survivors") for name in participants
        }
        refused = sorted(name for name, lines in refusals.items() if lines)
        without = cheat.uploads.get("without", {})
        signed = sorted(set(without.get((STATISTICS_ROUND, "STAGE_EVAL_CONSISTENCY"), [])))
        unmasked = sorted(set(without.get((STATISTICS_ROUND, "STAGE_EVAL_UNMASK"), [])))
        carried_out = attack.restarted and participants == sorted(set(FOUR) - {left_out})
        said = next((lines[0] for lines in refusals.values() if lines), None)
        row.record(
            f"decoded sum: {'equal to' if premise else 'NOT as expected against'} the sites' suppressed vectors "
            f"(computed offline); categorical counts from 1 to {MIN_COUNT - 1} in it: {shown}; the rare values' "
            f"cells: {rare_read}; the dictionary read: {read}; control: counted without suppression the same "
            f"tables hold {would_show} (column, cell, count). Collaborators restarted: {attack.restarted} (bindings "
            f"kept by {attack.bindings_kept}); round 0 again with every site: "
            f"{'decoded, the same sum' if control_ok else 'NOT decoded as before: ' + repr(short(cheat.failures.get('again'), 400)) + ', the sites said ' + repr([short(line, 200) for line in attack.said if 'round 0' in line][:6])}; "
            f"round 0 without {left_out}: "
            f"participants {participants}, consistency signatures {signed or 'none'}, unmasking responses "
            f"{unmasked or 'none'}, refused: {refused}, e.g. {short(said, 300)!r}; sums decoded: {sorted(cheat.sums)}",
            suppressed
            and carried_out
            and control_ok
            and not signed
            and not unmasked
            and refused == participants
            and "without" not in cheat.sums
            and "without" in cheat.failures,
            failure=short(cheat.failures.get("without"), 600),
            errors=attack.errors,
        )
