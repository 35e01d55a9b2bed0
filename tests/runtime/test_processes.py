"""The runtime as it is deployed: an aggregator and collaborators as separate OS processes.

Real gRPC over loopback mutual TLS with secure aggregation. Each test checks the
federation's numbers against the in-process simulation running the same learning
code (`simulation.run_rounds`, or the log-driven `replay` when collaborators drop
out or restart), within the error the fixed-point encoding can introduce: every
round's decoded mean update is off by at most `mean_update_error_bound`
(the encoder's bound on each summed coordinate, times (1 + clip), over the total
weight; see `secagg.Decoded.mean_error_bound`), and over R rounds those add up.
"""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfair.cli import main as cli_main
from fedfair.core.evaluation import evaluate
from fedfair.core.models import build_model
from fedfair.fairness import pooled
from fedfair.research.launch import training_config
from fedfair.research.processes import (
    Child,
    aggregator_command,
    child_environment,
    start_aggregator,
    start_collaborator,
)
from fedfair.research.simulation import run_rounds
from fedfair.research.workspace import Workspace
from fedfair.runtime.aggregator.checkpoint import (
    load_checkpoint,
    read_round_log,
    state_digest,
)
from fedfair.runtime.faults import VARIABLE as FAULT
from fedfair.runtime.plan import load_aggregator_plan, plan_digest
from tests.federations import adult_by_race
from tests.runtime.harness import (
    adult_split,
    new_workspace,
    replay,
)

pytestmark = pytest.mark.slow
NAMES = ["site-a", "site-b", "site-c"]


class Processes:
    """Children of one test, all killed at the end; their logs are shown if the test fails."""

    def __init__(self) -> None:
        self.log = io.StringIO()
        self.children: list[Child] = []

    def aggregator(self, workspace: Workspace, *extra: str, fault: str | None = None) -> Child:
        child = start_aggregator(workspace, *extra, env={FAULT: fault} if fault else None, sink=self.log)
        self.children.append(child)
        return child

    def collaborator(self, workspace: Workspace, name: str, *, fault: str | None = None) -> Child:
        child = start_collaborator(workspace, name, env={FAULT: fault} if fault else None, sink=self.log)
        self.children.append(child)
        return child

    def finish(self, aggregator: Child, timeout: float = 240.0) -> None:
        """Wait for the aggregator to finish and every collaborator still running to exit cleanly."""
        assert aggregator.wait(timeout) == 0, self.log.getvalue()[-4000:]
        for child in self.children:
            if child is not aggregator and child.process.returncode is None:
                assert child.wait(60) == 0, self.log.getvalue()[-4000:]


@pytest.fixture()
def processes(request: pytest.FixtureRequest) -> Iterator[Processes]:
    group = Processes()
    yield group
    for child in group.children:
        child.kill()


def final_model(workspace: Workspace) -> dict:
    return torch.load(workspace.output / "final_model.pt", weights_only=True)


def accumulated_bound(log: list[dict]) -> float:
    """The encoding's worst-case effect on theta after the logged rounds (see the module doc)."""
    return sum(record.get("mean_update_error_bound", 0.0) for record in log)


def test_a_secure_federation_of_processes_equals_the_simulation(tmp_path: Path, processes: Processes) -> None:
    workspace = new_workspace(
        tmp_path, NAMES, training={"rounds": 20}, evaluation={"every": 10}, quorum={"min_collaborators": 3}
    )
    plan = load_aggregator_plan(workspace.plan)
    aggregator = processes.aggregator(workspace)
    for name in NAMES:
        processes.collaborator(workspace, name)
    processes.finish(aggregator)

    log = read_round_log(workspace.output)
    assert [record["round"] for record in log] == list(range(1, 21))
    assert all(record["status"] == "applied" and record["contributors"] == NAMES for record in log)
    assert all(record["secure_aggregation"] for record in log)

    federation = adult_by_race()
    expected = run_rounds(federation, training_config(plan), plan.objective).state
    final = final_model(workspace)
    bound = accumulated_bound(log)
    assert 0 < bound < 1e-4
    assert (final["theta"] - expected.theta).abs().max().item() <= bound
    assert (final["theta_average"] - expected.theta_average).abs().max().item() <= bound
    assert abs(final["c"] - expected.c) <= bound and abs(final["c_average"] - expected.c_average) <= bound

    # The aggregator's evaluation, from secure sums only, against the exact report on the pooled test data.
    for record in (log[9], log[19]):
        assert record["evaluation"]["status"] == "done"
    report = log[19]["evaluation"]
    model = build_model("logreg", federation.num_features, federation.num_classes)
    test = evaluate(model, final["theta_average"], federation.pooled("test"))
    exact = pooled.group_risk_report(test.losses, test.correct, plan.objective.rho)
    rounding = 1e-9
    assert abs(report["worst_risk"] - exact.worst_risk) <= report["worst_risk_gap"] + rounding
    assert abs(report["best_risk"] - exact.best_risk) <= report["best_risk_gap"] + rounding
    assert abs(report["mean_risk"] - exact.mean_risk) <= report["mean_error_bound"] + rounding
    for key in ("accuracy", "worst_error", "best_error", "mean_error"):
        assert report[key] == pytest.approx(getattr(exact, key), abs=1e-12)
    assert report["samples"] == federation.pooled("test").size


def test_dropouts_before_and_after_masking_and_a_restart(tmp_path: Path, processes: Processes) -> None:
    names = [*NAMES, "site-d"]
    # A quorum of 3: once site-c is gone too, round 5 waits (on a condition, bounded) for site-d to rejoin.
    workspace = new_workspace(tmp_path, names, training={"rounds": 10}, quorum={"min_collaborators": 3})
    plan = load_aggregator_plan(workspace.plan)
    aggregator = processes.aggregator(workspace)
    children = {
        "site-a": processes.collaborator(workspace, "site-a"),
        "site-b": processes.collaborator(workspace, "site-b"),
        # Dies (kill -9) after it sent its masked input in round 4, before unmasking; never comes back.
        "site-c": processes.collaborator(workspace, "site-c", fault="before-upload:4:STAGE_UNMASK"),
        # Dies before it sends its masked input in round 2, then restarts and rejoins.
        "site-d": processes.collaborator(workspace, "site-d", fault="before-upload:2:STAGE_MASKED_INPUT"),
    }
    assert children["site-d"].wait(120) == -9
    processes.collaborator(workspace, "site-d")
    assert children["site-c"].wait(120) == -9
    processes.finish(aggregator)

    log = read_round_log(workspace.output)
    by_round = {record["round"]: record for record in log}
    assert all(record["status"] == "applied" for record in log)
    # Round 2 completed from the survivors; site-d's pairwise masks were removed with its peers' shares.
    assert by_round[2]["participants"] == names and by_round[2]["contributors"] == NAMES
    assert by_round[2]["dropped"] == {"STAGE_MASKED_INPUT": ["site-d"]}
    # Round 4 still includes site-c's input: its self mask was rebuilt from the others' shares.
    assert "site-c" in by_round[4]["contributors"] and by_round[4]["dropped"] == {"STAGE_UNMASK": ["site-c"]}
    assert all("site-c" not in record["participants"] for record in log[4:])
    rejoined = min(record["round"] for record in log[2:] if "site-d" in record["participants"])
    assert rejoined == 5 and by_round[5]["contributors"] == ["site-a", "site-b", "site-d"]

    # Number for number, what the simulation's code gives for the same contributors each round.
    expected = replay(plan, adult_split(4), names, log, restarted={"site-d": rejoined})
    final = final_model(workspace)
    bound = accumulated_bound(log)
    assert (final["theta"] - expected.theta).abs().max().item() <= bound
    assert abs(final["c"] - expected.c) <= bound


def test_a_killed_aggregator_resumes_at_the_next_round_with_identical_state(
    tmp_path: Path, processes: Processes
) -> None:
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 6}, quorum={"min_collaborators": 3})
    plan = load_aggregator_plan(workspace.plan)
    first = processes.aggregator(workspace, fault="after-checkpoint:3")  # kill -9 right after round 3's checkpoint
    for name in NAMES:
        processes.collaborator(workspace, name)
    assert first.wait(120) == -9
    saved = load_checkpoint(workspace.output, plan_digest(plan))
    assert saved.round == 3 and len(read_round_log(workspace.output)) == 3

    # A fresh start over the same output is refused; --resume continues.
    refused = subprocess.run(
        aggregator_command(workspace),
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2 and "pass --resume" in refused.stderr
    resumed = processes.aggregator(workspace, "--resume")
    processes.finish(resumed)

    log = read_round_log(workspace.output)
    assert [record["round"] for record in log] == [1, 2, 3, 4, 5, 6]
    assert log[3]["model_sha256"] == state_digest(saved.state)  # round 4 started from the checkpoint, exactly
    assert "resuming at round 4 from the checkpoint of round 3" in processes.log.getvalue()
    expected = run_rounds(adult_by_race(), training_config(plan), plan.objective).state
    final = final_model(workspace)
    assert final["plan_digest"] == plan_digest(plan)
    assert (final["theta"] - expected.theta).abs().max().item() <= accumulated_bound(log)


def test_launch_runs_a_local_federation_and_reports_fairness(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["launch", "--rounds", "3", "--workdir", str(tmp_path / "run"), "--no-fedavg"]) == 0
    out = capsys.readouterr().out
    assert "Secure aggregation was ON" in out and "FedSRCVaR (federated, secure sums)" in out
    assert "[site-c]" in out and "[aggregator]" in out
    assert np.isfinite(float(out.split("FedSRCVaR (federated, secure sums)")[1].split()[0]))
