"""The runtime as it is deployed: an aggregator and collaborators as separate OS processes.

Real gRPC over loopback mutual TLS with secure aggregation. Each test checks the
federation's numbers against the in-process simulation running the same learning
code (`simulation.run_rounds`, or the log-driven `replay` when collaborators drop
out or restart), within the error the fixed-point encoding can introduce: every
round's decoded mean update is off by at most `mean_update_error_bound`
(the encoder's bound on each summed coordinate, times (1 + clip), over the total
weight; see `secagg.Decoded.mean_error_bound`), and over R rounds those add up.
The secure federation is processes throughout; where a test kills and restarts
some parties, the ones that only have to be there run as real `Collaborator`s in
threads of the test, which spares their start-ups (Python, torch, numba: most of
a federation's CPU).

Crash consistency: an aggregator killed (SIGKILL, at a `fedfair.runtime.faults`
point) in the middle of any stage of a round and resumed must end with the model of
an uninterrupted run: the very same bits with secure aggregation off, within the
encoding's bound with it on. There the aggregator is the process that dies; the
collaborators, which must live through its death, run as real `Collaborator`s in
threads of the test (over the same loopback mTLS) with a quick reconnection policy,
so that each restart costs an aggregator start-up rather than a back-off built for
real outages, and so that the test can count how often each one trained.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfair.core.evaluation import evaluate
from fedfair.core.update import Update
from fedfair.core.models import build_model
from fedfair.fairness import pooled
from fedfair.research.launch_baseline import simulation_options
from fedfair.runtime.local.processes import (
    Child,
    aggregator_command,
    child_environment,
)
from fedfair.runtime.local.workspace import Workspace
from fedfair.simulation.rounds import run_rounds
from fedfair.runtime.output_folder import FINAL_SUMMARY_NAME
from fedfair.runtime.faults import FREEZE
from fedfair.runtime.observe.status import federation_state
from fedfair.runtime.aggregator.checkpoint import load_checkpoint, read_round_log, state_digest
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.peer.retries import RetryPolicy
from fedfair.runtime.collaborator.trainer import RoundTrainer, round_trainer
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_aggregator_plan, plan_digest
from tests.federations import adult_by_race
from tests.runtime.harness import (
    Processes,
    adult_split,
    eventually,
    frozen,
    new_workspace,
    replay,
)

pytestmark = pytest.mark.slow
NAMES = ["site-a", "site-b", "site-c"]


def final_model(workspace: Workspace) -> dict:
    return torch.load(workspace.output / "final_model.pt", weights_only=True)


def accumulated_bound(log: list[dict]) -> float:
    """The encoding's worst-case effect on theta after the logged rounds (see the module doc)."""
    return sum(record.get("mean_update_error_bound", 0.0) for record in log)


def trajectory_bounds(log: list[dict], plan: AggregatorPlan) -> tuple[float, float]:
    """How far theta and c may end from the replay's under heavy-ball momentum and float32 training.

    Momentum beta: an error e in round r's mean update enters the velocity and stays in it, times beta per
    round, so it moves the model after round R by e (1 - beta^(R - r + 1)) / (1 - beta), not e (up to 10x at
    beta = 0.9; `accumulated_bound` is the beta = 0 case). And the sites train from float32(theta) and
    float32(c) (the built-in model's parameters), the replay from float32 of its own state: where the two
    differ at all (by the encoding's error) they can round to neighbouring float32 values, one ulp apart, and
    each of the tau local float32 steps then rounds on its own, so a site's update of c may differ by
    (tau + 1) ulps of c (c in [0, B]: ulp32(B) bounds them all; 9.5e-7 at B = 10, against an encoding error
    near 1e-7 a round). Theta's coordinates are small (|theta| < 2, ulps below 2.4e-7 and rarely straddled):
    its bound keeps the encoding's error only. Not covered: a sample's loss within one ulp of c (its indicator
    flips; none seen).
    """
    beta, rounds = plan.training.server_momentum, len(log)
    ulp = float(np.spacing(np.float32(plan.objective.bound)))
    steps = plan.training.local.local_steps
    carried = [(1.0 - beta ** (rounds - index)) / (1.0 - beta) for index in range(rounds)]
    errors = [record.get("mean_update_error_bound", 0.0) for record in log]
    theta = sum(error * factor for error, factor in zip(errors, carried, strict=True))
    return theta, theta + sum((steps + 1) * ulp * factor for factor in carried)


def test_a_secure_federation_of_processes_equals_the_simulation(tmp_path: Path, processes: Processes) -> None:
    # Algorithm 1's server step: under the default momentum c overshoots its quantile, c's local gradient
    # reaches (1 - eps)(1 / rho - 1) per step and honest updates pass the default update_norm, which the
    # processes clip and the simulation does not (docs/paper.md, "Fitting as fast as FedAvg").
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": 20, "server_momentum": 0.0},
        evaluation={"every": 10},
        quorum={"min_collaborators": 3},
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
    expected = run_rounds(federation, plan.training, plan.objective, options=simulation_options(plan)).state
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
    # A quorum of 3: once site-c is gone too, a round waits (on a condition, bounded) for site-d's task stream.
    workspace = new_workspace(tmp_path, names, training={"rounds": 6}, quorum={"min_collaborators": 3})
    plan = load_aggregator_plan(workspace.plan)
    aggregator = processes.aggregator(workspace)
    # The sites that never fail are Collaborators in threads of the test (they only have to be there);
    # the ones that die (kill -9 at a fault point) and restart are processes.
    survivors = {name: Collaborator(load_collaborator_config(workspace.configs[name])) for name in NAMES[:2]}
    with ThreadPoolExecutor(max_workers=len(survivors), thread_name_prefix="test-collaborator") as pool:
        try:
            statuses = {name: pool.submit(collaborator.run) for name, collaborator in survivors.items()}
            children = {
                # Dies (kill -9) right after it tagged round 4's claimed sum, before its verdict; never comes back.
                # (One gone before it tags costs nothing where every site re-sums: tests/runtime/test_voided_rounds.py.)
                "site-c": processes.collaborator(workspace, "site-c", fault="after-upload:4:STAGE_VERIFY_CLAIM"),
                # Dies before it sends its masked input in round 2, then restarts.
                "site-d": processes.collaborator(workspace, "site-d", fault="before-upload:2:STAGE_MASKED_INPUT"),
            }
            assert children["site-d"].wait(120) == -9
            restarted = processes.collaborator(workspace, "site-d")
            assert children["site-c"].wait(120) == -9
            assert aggregator.wait(240) == 0, processes.tail()
            # It verified no sum of round 2 (applied without it): it catches up on that sum, checks the next model
            # and rejoins (issue 98); its own record counts the round it missed (aborted_rounds_allowed = 0).
            assert restarted.wait(60) == 3, processes.tail()
            assert any("round 2: caught up" in line for line in restarted.lines), restarted.lines[-10:]
            assert not any("model-unchecked" in line for line in restarted.lines), restarted.lines[-10:]
            processes.finish(aggregator)
            assert {name: status.result(timeout=60) for name, status in statuses.items()} == dict.fromkeys(NAMES[:2], 0)
        finally:
            for collaborator in survivors.values():
                collaborator.stop()

    log = read_round_log(workspace.output)
    by_round = {record["round"]: record for record in log}
    assert [record["status"] for record in log] == ["applied"] * 6
    # Round 2 completed from the survivors; site-d's pairwise masks were removed with its peers' shares.
    assert by_round[2]["participants"] == names and by_round[2]["contributors"] == NAMES
    assert by_round[2]["dropped"] == {"STAGE_MASKED_INPUT": ["site-d"]}
    # Round 4 still includes site-c's input, verified by the others with its tag; its verdict never came.
    assert "site-c" in by_round[4]["contributors"] and by_round[4]["dropped"]["STAGE_VERIFY_TAGS"] == ["site-c"]
    assert all("site-c" not in record["contributors"] for record in log[4:])
    # site-d, restarted, caught up on round 2's sum (and any it missed while it started) and is back by the last
    # round (issue 98); its own record agrees with the aggregator's.
    assert "site-d" in log[-1]["contributors"], [record["contributors"] for record in log]
    with_d = [record["round"] for record in log if "site-d" in record["contributors"]]
    record = OutcomeRecord(next(workspace.configs["site-d"].parent.glob(f"site-d.*.{OUTCOME_SUFFIX}")), 0)
    assert record.contributed == len(with_d), (record.contributed, with_d)

    # Number for number, what the simulation's code gives for the same contributors each round.
    # site-d's process restarted: it trains afresh (its sampler from its seed) from the first round it is back in.
    back = next(record["round"] for record in log[2:] if "site-d" in record["participants"])
    expected = replay(plan, adult_split(4), names, log, restarted={"site-d": back})
    final = final_model(workspace)
    theta_bound, c_bound = trajectory_bounds(log, plan)
    assert c_bound < 1e-3  # still far below one round's move of c (0.3 to 1 here) or one site's share of it
    assert (final["theta"] - expected.theta).abs().max().item() <= theta_bound
    assert abs(final["c"] - expected.c) <= c_bound


def test_a_killed_aggregator_resumes_at_the_next_round_with_identical_state(
    tmp_path: Path, processes: Processes
) -> None:
    """The aggregator is the process killed and resumed; the collaborators, which live through it, are
    Collaborators in threads of the test, as in the crash tests below."""
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 6}, quorum={"min_collaborators": 3})
    plan = load_aggregator_plan(workspace.plan)
    collaborators = {
        name: Collaborator(load_collaborator_config(path), retry=QUICK_RECONNECT)
        for name, path in workspace.configs.items()
    }
    with ThreadPoolExecutor(max_workers=len(collaborators), thread_name_prefix="test-collaborator") as pool:
        try:
            finished = {name: pool.submit(collaborator.run) for name, collaborator in collaborators.items()}
            # kill -9 right after round 3's checkpoint
            first = processes.aggregator(workspace, fault="after-checkpoint:3")
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
            assert {name: done.result(timeout=60) for name, done in finished.items()} == dict.fromkeys(NAMES, 0)
        finally:
            for collaborator in collaborators.values():
                collaborator.stop()

    log = read_round_log(workspace.output)
    assert [record["round"] for record in log] == [1, 2, 3, 4, 5, 6]
    assert all(record["contributors"] == NAMES for record in log)  # the last to reconnect is not left out
    assert log[3]["model_sha256"] == state_digest(saved.state)  # round 4 started from the checkpoint, exactly
    assert "resuming at round 4 from the checkpoint of round 3" in processes.log.getvalue()
    expected = run_rounds(adult_by_race(), plan.training, plan.objective, options=simulation_options(plan)).state
    final = final_model(workspace)
    assert final["plan_digest"] == plan_digest(plan)
    assert (final["theta"] - expected.theta).abs().max().item() <= accumulated_bound(log)


def test_a_second_aggregator_on_the_same_folder_or_port_fails_at_once_naming_the_first(
    tmp_path: Path, processes: Processes
) -> None:
    """The first waits for its collaborators (no deadline); a second `aggregator start`, fresh or --resume,
    on its folder is refused by the lock naming its PID; one on its port (another folder) cannot listen.

    Each refusal comes before any serving or writing; what the second process takes is its own
    start-up (Python and torch imports), which `tests/runtime/aggregator/test_loop.py` leaves out
    and bounds at 2 s."""
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 1})
    first = processes.aggregator(workspace)

    def second(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            aggregator_command(workspace, *extra),
            env=child_environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    for extra in ((), ("--resume",)):
        refused = second(*extra)
        assert refused.returncode == 2, refused.stderr
        assert (
            f"fedfair: error: another aggregator (PID {first.process.pid}) is running on {workspace.output} "
            f"(lock {workspace.output / 'aggregator.lock'}); stop it first, or give this one another output "
            "folder (--output)"
        ) in refused.stderr
    taken = second("--output", str(tmp_path / "elsewhere"))
    assert taken.returncode == 2 and "cannot listen on 127.0.0.1:" in taken.stderr
    assert "the port is in use" in taken.stderr
    assert first.process.poll() is None  # the first never noticed
    assert not (tmp_path / "elsewhere" / "events.jsonl").exists()


# ---------------------------------------------------------------- crash consistency

CRASH_PLAN = {"training": {"rounds": 3}, "evaluation": {"every": 2}, "quorum": {"min_collaborators": 3}}
"""Three short rounds; round 2, the one the aggregator is killed in, also runs an evaluation."""

PLAIN = {"secure_aggregation": {"enabled": False}}

QUICK_RECONNECT = RetryPolicy(attempts=400, base_seconds=0.05, cap_seconds=0.5)
"""Collaborators that retry at least every half second for at least 90 s: a restart of the aggregator
costs its start-up, not a back-off built for real outages (the default waits up to 15 s between
attempts), and a loaded machine has time to restart it (the default gives up after eight attempts)."""


class CountingTrainer:
    """The collaborator's own round trainer, counting how often each round's model was trained on."""

    def __init__(self, trainer: RoundTrainer) -> None:
        self.trainer = trainer
        self.calls = 0

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        self.calls += 1
        return self.trainer.train_round(theta, c)


@dataclass
class Outcome:
    """What a federation left behind: its round log, final model and summary, and its collaborators."""

    log: list[dict]
    final: dict
    summary: dict
    collaborators: dict[str, Collaborator]


def stopped_by_sigterm(processes: Processes, aggregator: Child, workspace: Workspace) -> None:
    """Stop the aggregator, frozen at a `freeze:` fault point, with SIGTERM (then SIGCONT, so it acts on it): it must
    say so in its closing line, exit 143, and leave a `stop` event that `fedfair status` shows."""
    assert eventually(lambda: frozen(aggregator.process.pid) or aggregator.process.poll() is not None, 120)
    aggregator.process.send_signal(signal.SIGTERM)
    aggregator.process.send_signal(signal.SIGCONT)
    try:
        status = aggregator.wait(120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the aggregator did not stop within 120 s of SIGTERM\n{processes.tail()}")
    assert status == 128 + signal.SIGTERM, processes.tail()
    closing = "stopped by SIGTERM; the last checkpoint is in"
    assert closing in aggregator.lines[-1], aggregator.lines[-3:]  # its closing line comes last
    state = federation_state(workspace.output)
    assert not state.running and state.exit_status == 143 and closing in (state.stopped or ""), state


def run_federation(processes: Processes, workspace: Workspace, kills: tuple[str, ...] = ()) -> Outcome:
    """Run `workspace`'s federation to its end: the aggregator a process killed (SIGKILL) at each of
    `kills` in turn (or, at a `freeze:` point, frozen there and stopped with SIGTERM) and resumed from its
    checkpoint after each; the collaborators real `Collaborator`s over loopback mTLS in threads of this process,
    which live through it all and are inspected after."""
    collaborators = {
        name: Collaborator(load_collaborator_config(path), retry=QUICK_RECONNECT)
        for name, path in workspace.configs.items()
    }
    for collaborator in collaborators.values():
        collaborator.trainer_factory = lambda *args: CountingTrainer(round_trainer(*args))
    pool = ThreadPoolExecutor(max_workers=len(collaborators), thread_name_prefix="test-collaborator")
    try:
        finished = {name: pool.submit(collaborator.run) for name, collaborator in collaborators.items()}
        aggregator = processes.aggregator(workspace, fault=kills[0] if kills else None)
        for index, kill in enumerate(kills):
            if kill.startswith(FREEZE):
                stopped_by_sigterm(processes, aggregator, workspace)
            else:
                assert aggregator.wait(120) == -9, f"the aggregator did not die at {kill}\n{processes.tail()}"
            resumed = kills[index + 1] if index + 1 < len(kills) else None
            aggregator = processes.aggregator(workspace, "--resume", fault=resumed)
        assert aggregator.wait(120) == 0, processes.tail()
        for name, done in finished.items():
            assert done.result(timeout=60) == 0, name
            # Re-runs and restarts included, each site checked and kept the aggregator's final bundle.
            kept = collaborators[name].bundle_path()
            assert kept.read_bytes() == (workspace.output / "model_bundle.pt").read_bytes(), name
    finally:
        for collaborator in collaborators.values():
            collaborator.stop()
        pool.shutdown(wait=True)
    return Outcome(
        read_round_log(workspace.output),
        final_model(workspace),
        json.loads((workspace.output / FINAL_SUMMARY_NAME).read_text()),
        collaborators,
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    """The plain crash plan run once without a fault: the bits every crashed run must reproduce."""
    group = Processes()
    workspace = new_workspace(tmp_path_factory.mktemp("uninterrupted"), NAMES, **CRASH_PLAN, **PLAIN)
    try:
        yield run_federation(group, workspace)
    finally:
        for child in group.children:
            child.kill()


PLAIN_ROUND_KILLS = {
    # Killed after the model went out, before any upload was taken: in training, then in the re-run's evaluation.
    "TRAIN-then-EVALUATE": ("STAGE_TRAIN", "STAGE_EVALUATE"),
    # Killed once the first upload was taken, before its sender heard back: in masking, then in the evaluation.
    "MASKED_INPUT-then-EVAL_MASKED_INPUT": ("STAGE_MASKED_INPUT", "STAGE_EVAL_MASKED_INPUT"),
}
"""Every stage of a plain round that runs an evaluation, two per federation: round 2 is killed, and its
re-run is killed again, so one aggregator start-up serves two stages and re-runs are re-run."""


@pytest.mark.parametrize("stages", PLAIN_ROUND_KILLS.values(), ids=PLAIN_ROUND_KILLS.keys())
def test_a_plain_round_killed_in_any_stage_is_rerun_to_the_same_bits(
    tmp_path: Path, processes: Processes, uninterrupted: Outcome, stages: tuple[str, str]
) -> None:
    """SIGKILL in the middle of a stage of round 2 (see `fedfair.runtime.faults`), --resume, SIGKILL in
    another stage of its re-run, --resume: round 2 runs again from round 1's checkpoint each time,
    every collaborator takes part again with the update it trained once, and the model, the
    evaluation and the round log are those of the uninterrupted run, bit for bit."""
    workspace = new_workspace(tmp_path, NAMES, **CRASH_PLAN, **PLAIN)
    crashed = run_federation(processes, workspace, tuple(f"aggregator-stage:2:{stage}" for stage in stages))

    assert [record["round"] for record in crashed.log] == [1, 2, 3]  # round 2 logged once, for its re-run
    for record, expected in zip(crashed.log, uninterrupted.log, strict=True):
        assert record["status"] == expected["status"] == "applied"
        assert record["contributors"] == expected["contributors"] == NAMES
        assert record["model_sha256"] == expected["model_sha256"], f"round {record['round']} started elsewhere"
    for key in ("theta", "theta_average"):
        assert torch.equal(crashed.final[key], uninterrupted.final[key]), key
    assert (crashed.final["c"], crashed.final["c_average"]) == (
        uninterrupted.final["c"],
        uninterrupted.final["c_average"],
    )
    assert crashed.summary["evaluation"] == uninterrupted.summary["evaluation"]
    assert crashed.summary["evaluation"]["status"] == "done"
    for name, collaborator in crashed.collaborators.items():
        assert collaborator.trainer.calls == 3, name  # one local training per round: the sampler moved as often
        assert collaborator.contributed_rounds == [1, 2, 3], name


def test_an_aggregator_stopped_by_sigterm_mid_round_resumes_to_the_bits_of_an_uninterrupted_run(
    tmp_path: Path, processes: Processes, uninterrupted: Outcome
) -> None:
    """SIGTERM (what systemd, Docker and `fedfair stop` send) once round 2's first update is in: the aggregator
    stops as at Ctrl-C (closing line, exit 143, its checkpoint of round 1 kept), and --resume runs round 2 again to
    the very model, evaluation and round log of the uninterrupted plain run."""
    workspace = new_workspace(tmp_path, NAMES, **CRASH_PLAN, **PLAIN)
    stopped = run_federation(processes, workspace, (f"{FREEZE}aggregator-stage:2:STAGE_MASKED_INPUT",))

    assert [record["round"] for record in stopped.log] == [1, 2, 3]
    for record, expected in zip(stopped.log, uninterrupted.log, strict=True):
        assert record["status"] == expected["status"] == "applied"
        assert record["model_sha256"] == expected["model_sha256"], f"round {record['round']} started elsewhere"
    for key in ("theta", "theta_average"):
        assert torch.equal(stopped.final[key], uninterrupted.final[key]), key
    assert stopped.final["c"] == uninterrupted.final["c"]
    assert stopped.summary["evaluation"] == uninterrupted.summary["evaluation"]
    for name, collaborator in stopped.collaborators.items():
        assert collaborator.trainer.calls == 3, name  # round 2's update was re-sent, not trained again


def test_a_secure_round_killed_mid_masking_is_rerun(tmp_path: Path, processes: Processes) -> None:
    """Secure aggregation on, SIGKILL once round 2's first masked input is in, then --resume: the re-run
    masks the same updates under fresh keys, so the model matches the simulation within the
    encoding's bound, as an uninterrupted secure run does, and nobody trains a round twice."""
    workspace = new_workspace(tmp_path, NAMES, **CRASH_PLAN)
    plan = load_aggregator_plan(workspace.plan)
    crashed = run_federation(processes, workspace, ("aggregator-stage:2:STAGE_MASKED_INPUT",))

    assert [record["round"] for record in crashed.log] == [1, 2, 3]
    assert all(record["status"] == "applied" and record["contributors"] == NAMES for record in crashed.log)
    expected = run_rounds(adult_by_race(), plan.training, plan.objective, options=simulation_options(plan)).state
    bound = accumulated_bound(crashed.log)
    assert 0 < bound < 1e-4
    assert (crashed.final["theta"] - expected.theta).abs().max().item() <= bound
    assert abs(crashed.final["c"] - expected.c) <= bound
    for name, collaborator in crashed.collaborators.items():
        assert collaborator.trainer.calls == 3, name
