"""The statistics aggregation before round 1 outlives collaborators that leave it.

Three institutions with their own small tables under one [schema], in threads of the test over
real mutual TLS on loopback. Two of them leave the statistics aggregation (round 0) before they
advertise keys, so only one party advertises and secure aggregation cannot meet its threshold.
The aggregator must log why, wait for its quorum again and run the statistics aggregation anew,
and the federation must finish once the institutions come back, whether they merely withdrew
(the same processes answer the re-run) or stopped (new processes take their place).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfair.datasets.schema import Column, Schema
from fedfair.runtime.aggregator import loop
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.start import run_aggregator
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.preprocessing import STATISTICS_ROUND
from fedfair.runtime.transport import pb, pb_grpc
from tests.runtime.aggregator.test_loop import Background, aggregator_lines, wait_for_line
from tests.runtime.harness import plan_sections
from fedfair.runtime.transport import WireStage
from tests.runtime.wire_stages import WIRE

NAMES = ["site-a", "site-b", "site-c"]
LEAVING = NAMES[1:]
SCHEMA = Schema(
    label="y",
    classes=("no", "yes"),
    columns=(Column("age", "numeric"), Column("colour", "categorical", ("red", "blue"))),
    missing="refuse",
)


def schema_workspace(root: Path) -> Workspace:
    """Three sites with 120-row tables of their own, a plan with SCHEMA, two rounds, quorum of three."""
    paths = {}
    for index, name in enumerate(NAMES):
        rows = np.arange(120) + 40 * index
        table = pd.DataFrame(
            {
                "age": 18.0 + rows % 60,
                "colour": np.where(rows % 3 == 0, "red", "blue"),
                "y": np.where((rows % 60) > 30, "yes", "no"),
            }
        )
        paths[name] = root / "tables" / f"{name}.csv"
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(paths[name], index=False)
    workspace = make_workspace(
        root / "federation",
        NAMES,
        plan=plan_sections(training={"rounds": 2}, quorum={"min_collaborators": 3, "round_timeout_seconds": 20.0}),
        data={name: {"csv": str(path)} for name, path in paths.items()},
    )
    workspace.plan.write_text(workspace.plan.read_text() + "\n" + SCHEMA.to_toml())
    return workspace


Leave = Callable[[Collaborator, pb_grpc.FederationStub, pb.Task], None]
"""How a collaborator leaves the statistics aggregation, in place of its ADVERTISE step."""


def withdraw(collaborator: Collaborator, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
    """An empty upload, as a collaborator that cannot contribute sends (its stream stays open)."""
    collaborator.submit(stub, task.binding, b"")


def stop(collaborator: Collaborator, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
    """The process goes away: its task stream ends, as a crashed or refusing collaborator's does."""
    collaborator.stop()


def leaving_once(collaborator: Collaborator, leave: Leave) -> Collaborator:
    """`collaborator`, made to `leave` instead of advertising keys in the first statistics aggregation."""
    step, left = collaborator.step, threading.Event()

    def leaving(stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        binding = task.binding
        if (
            binding.round == STATISTICS_ROUND
            and WireStage.of(binding) == WIRE["STAGE_EVAL_ADVERTISE_KEYS"]
            and not left.is_set()
        ):
            left.set()
            leave(collaborator, stub, task)
            return
        step(stub, task)

    collaborator.step = leaving  # type: ignore[method-assign]
    return collaborator


def run_federation(workspace: Workspace, leave: Leave) -> tuple[Background, list[Background]]:
    """The aggregator and the three collaborators in threads; LEAVING leave round 0 by `leave`."""
    aggregator = Background(lambda: run_aggregator(load_aggregator_plan(workspace.plan)))
    collaborators = []
    for name in NAMES:
        collaborator = Collaborator(load_collaborator_config(workspace.configs[name]))
        collaborators.append(Background((leaving_once(collaborator, leave) if name in LEAVING else collaborator).run))
    return aggregator, collaborators


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "STATISTICS_RETRY_SECONDS", 0.1)


def assert_finished_after_a_retry(
    workspace: Workspace, aggregator: Background, caplog: pytest.LogCaptureFixture
) -> None:
    aggregator.thread.join(180.0)
    assert not aggregator.thread.is_alive() and aggregator.error is None, aggregator.error
    lines = aggregator_lines(caplog)
    aborted = [line for line in lines if line.startswith("the statistics aggregation before round 1 aborted: ")]
    assert len(aborted) == 1, lines
    assert (
        "advertised keys" in aborted[0] and "serving afresh, it runs again once the quorum is connected" in aborted[0]
    )
    assert [line for line in lines if line.startswith("statistics aggregation: ") and "rows from" in line]
    assert [record["status"] for record in read_round_log(workspace.output)] == ["applied", "applied"]


def assert_all_finished(collaborators: list[Background]) -> None:
    for collaborator in collaborators:
        collaborator.thread.join(60.0)
        assert collaborator.error is None and collaborator.result == 0, collaborator.error


@pytest.mark.slow
def test_collaborators_that_withdraw_from_the_statistics_round_finish_it_on_the_rerun(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """They withdraw and keep their task streams: round 0 runs again with the same processes."""
    caplog.set_level(logging.INFO)
    workspace = schema_workspace(tmp_path)
    aggregator, collaborators = run_federation(workspace, withdraw)
    assert_finished_after_a_retry(workspace, aggregator, caplog)
    assert_all_finished(collaborators)


def test_collaborators_that_stop_in_the_statistics_round_and_start_again_finish_the_federation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """They stop; the aggregator waits for its quorum, which new processes of the same institutions
    make up, and runs round 0 anew."""
    caplog.set_level(logging.INFO)
    workspace = schema_workspace(tmp_path)
    aggregator, collaborators = run_federation(workspace, stop)
    wait_for_line(caplog, "the statistics aggregation before round 1 aborted: ", timeout=90.0)
    for index, name in enumerate(NAMES):
        if name in LEAVING:
            collaborators[index].thread.join(30.0)
            assert collaborators[index].result == 0, collaborators[index].error
            collaborators[index] = Background(Collaborator(load_collaborator_config(workspace.configs[name])).run)
    assert_finished_after_a_retry(workspace, aggregator, caplog)
    assert_all_finished(collaborators)
