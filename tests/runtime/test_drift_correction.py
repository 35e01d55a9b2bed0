"""Drift-corrected FedSRCVaR (`[training] drift_correction = "scaffold"`) in the real processes.

Real gRPC over loopback mutual TLS with secure aggregation: the server's control
variate sigma goes down with (theta, c) at every TRAIN stage, each collaborator's
sigma_k+ comes back inside the same masked vector (2 (d + 1) coordinates), and the
federation ends where the in-process simulation (`simulation.run_rounds`, the same
learning code) ends: theta, c and sigma, within the error the fixed-point encoding can
introduce (the logged per-round bounds, summed as `tests/runtime/test_processes.py`
sums them). A collaborator whose trainer does not follow the plan's drift correction
withdraws with a message that says so, and a checkpoint carries sigma across a resume.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedfair.core import server
from fedfair.core.config import LocalConfig
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner
from fedfair.core.update import Update
from fedfair.privacy.learner import PrivateLearner
from fedfair.research.launch_baseline import simulation_options
from fedfair.runtime.local.workspace import Workspace, toml_text
from fedfair.simulation.rounds import SimulationResult, run_rounds
from fedfair.runtime.aggregator.checkpoint import (
    Checkpoint,
    load_checkpoint,
    read_round_log,
    save_checkpoint,
    state_digest,
)
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.collaborator.client import Collaborator, control_beyond_clip
from fedfair.runtime.collaborator.config import (
    CollaboratorConfig,
    load_collaborator_config,
)
from fedfair.runtime.peer.retries import RetryPolicy
from fedfair.core.update import update_dimension
from fedfair.runtime.contract import (
    split_training_download,
    training_download,
)
from fedfair.runtime.plan.aggregator_plan import (
    SharedSettings,
    load_aggregator_plan,
    load_shared_settings,
    plan_digest,
    shared_settings,
)
from tests.federations import adult_by_race
from tests.runtime.harness import Processes, new_workspace, thread_federation

NAMES = ["site-a", "site-b", "site-c"]
DRIFT_PLAN: dict[str, dict[str, Any]] = {
    "training": {"rounds": 4, "local_steps": 3, "drift_correction": "scaffold"},
    "quorum": {"min_collaborators": 3},
}
"""Four rounds of three corrected local steps, every collaborator in every round."""


def accumulated_bound(log: list[dict[str, Any]]) -> float:
    """The encoding's worst-case effect on the model after the logged rounds (test_processes' bound)."""
    return float(sum(record.get("mean_update_error_bound", 0.0) for record in log))


def simulated(workspace: Workspace) -> SimulationResult:
    plan = load_aggregator_plan(workspace.plan)
    return run_rounds(adult_by_race(), plan.training, plan.objective, options=simulation_options(plan))


def assert_state_matches(state: server.ServerState, expected: server.ServerState, bound: float) -> None:
    assert state.control is not None and expected.control is not None
    assert (state.theta - expected.theta).abs().max().item() <= bound
    assert (state.theta_average - expected.theta_average).abs().max().item() <= bound
    assert abs(state.c - expected.c) <= bound
    assert (state.control - expected.control).abs().max().item() <= bound
    assert expected.control.abs().max().item() > 100 * bound  # sigma moved: the comparison says something


# ---------------------------------------------------------------- settings and layout


def test_the_plan_reads_shares_and_digests_drift_correction(tmp_path: Path) -> None:
    corrected = load_aggregator_plan(new_workspace(tmp_path / "on", NAMES, **DRIFT_PLAN).plan)
    plain = load_aggregator_plan(new_workspace(tmp_path / "off", NAMES, training={"rounds": 4}).plan)
    assert corrected.training.local.drift_correction == "scaffold"
    assert plain.training.local == LocalConfig(local_steps=2, lr=0.1, threshold_lr=0.1)
    # Collaborators receive the setting with the plan and build their LocalConfig from it.
    assert load_shared_settings(shared_settings(corrected)).training.local.corrects_drift
    # Plans without it share and digest what they did before the setting existed.
    assert b"drift_correction" not in shared_settings(plain)
    uncorrected = new_workspace(tmp_path / "tau3", NAMES, training={"rounds": 4, "local_steps": 3})
    assert plan_digest(corrected) != plan_digest(load_aggregator_plan(uncorrected.plan))
    with pytest.raises(ConfigError, match=r'\[training\] drift_correction = "sgd" is not known; known: none, scaffold'):
        load_aggregator_plan(new_workspace(tmp_path / "bad", NAMES, training={"drift_correction": "sgd"}).plan)


def test_a_collaborator_refuses_a_plan_whose_drift_correction_it_does_not_know(tmp_path: Path) -> None:
    """The shared plan is read with the same checks as the aggregator's: a method this collaborator
    does not have (an aggregator of a later version) is a plan mismatch naming the setting."""
    plan = load_aggregator_plan(new_workspace(tmp_path, NAMES, **DRIFT_PLAN).plan)
    shared = shared_settings(plan).replace(b'"drift_correction":"scaffold"', b'"drift_correction":"fedprox"')
    with pytest.raises(ConfigError, match=r'\[training\] drift_correction = "fedprox" is not known'):
        load_shared_settings(shared)


def test_sigma_travels_after_theta_and_the_sum_is_twice_as_long() -> None:
    theta, sigma = np.arange(5.0), np.arange(6.0) + 10
    plain = training_download(theta, None, True)  # plain FedSRCVaR: theta alone, in the float32 the model trains in
    assert plain.dtype == np.float32 and np.array_equal(plain, theta.astype(np.float32))
    assert training_download(theta, None, False).dtype == np.float64  # a factory's model may be float64
    values = training_download(theta, sigma, True)
    got_theta, got_sigma = split_training_download(values, 5, True)
    assert np.array_equal(got_theta, theta) and got_sigma is not None and np.array_equal(got_sigma, sigma)
    assert update_dimension(5, False) == 6 and update_dimension(5, True) == 12
    with pytest.raises(ConfigError, match="holds 5 values"):
        split_training_download(theta, 5, True)


def test_a_control_variate_past_the_clip_is_refused_not_clipped() -> None:
    weight = 4.0
    update = np.array([0.5, -0.5, 0.1]) * weight  # [w delta, w delta_c] for d = 2
    inside = np.concatenate([update, np.array([9.0, -9.0, 0.0]) * weight])
    assert control_beyond_clip(inside, weight, clip=10.0) is None
    beyond = np.concatenate([update, np.array([12.0, -9.0, 0.0]) * weight])
    problem = control_beyond_clip(beyond, weight, clip=10.0)
    assert problem is not None and "raise [secure_aggregation] clip" in problem and "largest 12" in problem


def test_a_checkpoint_keeps_sigma(tmp_path: Path) -> None:
    plan = load_aggregator_plan(new_workspace(tmp_path, NAMES, **DRIFT_PLAN).plan)
    start = initial_state(plan)
    assert start.control is not None and start.control.numel() == start.theta.numel() + 1
    d = start.theta.numel()
    vector = torch.linspace(-1.0, 1.0, 2 * (d + 1), dtype=torch.float64)
    aggregate = server.Aggregate.from_vector(vector, 2.0, with_control=True)
    state = server.apply(start, aggregate, bound=plan.objective.bound)
    assert state.control is not None
    save_checkpoint(plan.aggregator.output, Checkpoint(1, state, plan_digest(plan)))
    resumed = load_checkpoint(plan.aggregator.output, plan_digest(plan)).state
    assert resumed.control is not None and torch.equal(resumed.control, state.control)
    assert state_digest(resumed) == state_digest(state)
    # The round log's model digest tells two sigmas apart (a resume must start from the same one).
    assert state_digest(state) != state_digest(server.ServerState(**{**state.__dict__, "control": state.control * 2}))


# ---------------------------------------------------------------- federations


@pytest.mark.slow
def test_a_drift_corrected_secure_federation_equals_the_simulation(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, NAMES, **DRIFT_PLAN)
    with thread_federation(workspace) as federation:
        federation.join()
    assert not federation.errors, federation.errors

    log = read_round_log(workspace.output)
    assert [record["round"] for record in log] == [1, 2, 3, 4]
    assert all(record["status"] == "applied" and record["contributors"] == NAMES for record in log)
    assert all(record["secure_aggregation"] for record in log)
    final = load_checkpoint(workspace.output, plan_digest(federation.plan)).state
    bound = accumulated_bound(log)
    assert 0 < bound < 1e-4
    assert_state_matches(final, simulated(workspace).state, bound)
    for collaborator in federation.collaborators.values():
        assert collaborator.contributed_rounds == [1, 2, 3, 4]


@pytest.mark.slow
def test_drift_correction_runs_with_differential_privacy(tmp_path: Path) -> None:
    """DP-SGD at one institution, drift correction in the plan: the combination is allowed (the correction is
    post-processing) and every round takes the private institution's masked update and control variate."""
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={**DRIFT_PLAN["training"], "rounds": 2},
        quorum={"min_collaborators": 3},
        privacy={"report_epsilon": 1.0},  # a site with its own DP-SGD refuses answers decoded exact
    )
    config = workspace.configs["site-b"]
    config.write_text(config.read_text() + toml_text({"privacy": {"enabled": True, "noise_multiplier": 1.0}}))
    with thread_federation(workspace) as federation:
        federation.join()
    assert not federation.errors, federation.errors
    assert isinstance(federation.collaborators["site-b"].trainer, PrivateLearner)
    log = read_round_log(workspace.output)
    assert all(record["status"] == "applied" and record["contributors"] == NAMES for record in log)
    final = load_checkpoint(workspace.output, plan_digest(federation.plan)).state
    assert final.control is not None and bool(torch.isfinite(final.control).all())
    assert final.control.abs().max().item() > 0


class IgnoresDriftCorrection:
    """A trainer built without the plan's drift correction (a custom trainer, or an older fedfair's)."""

    def __init__(self, learner: LocalLearner, config: CollaboratorConfig, shared: SharedSettings) -> None:
        plain = LocalConfig(local_steps=shared.training.local.local_steps, lr=shared.training.local.lr)
        self.learner = LocalLearner(
            learner.model, learner.features, learner.labels, learner.batch_size, plain, threshold=learner.threshold
        )

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        return self.learner.train_round(theta, c)


@pytest.mark.slow
def test_a_collaborator_whose_trainer_ignores_the_plans_drift_correction_is_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = new_workspace(
        tmp_path, NAMES, training={**DRIFT_PLAN["training"], "rounds": 2}, quorum={"min_collaborators": 2}
    )

    def break_site_c(name: str, collaborator: Collaborator) -> None:
        if name == "site-c":
            collaborator.trainer_factory = IgnoresDriftCorrection

    with caplog.at_level("INFO"), thread_federation(workspace, collaborator=break_site_c) as federation:
        federation.join()
    # Left out of every round, site-c checks each model by catching up on the sums it missed (issue 98).
    assert not federation.errors, federation.errors
    assert "site-c: round 1: caught up" in caplog.text
    assert (
        "site-c: round 1: the trainer's update holds 109 values, but the plan's [training] drift_correction = "
        '"scaffold" makes a round\'s vector 218 long'
    ) in caplog.text
    log = read_round_log(workspace.output)
    assert all(record["status"] == "applied" and record["contributors"] == NAMES[:2] for record in log)
    assert federation.collaborators["site-c"].contributed_rounds == []


QUICK_RECONNECT = RetryPolicy(attempts=400, base_seconds=0.05, cap_seconds=0.5)
"""Collaborators that find a restarted aggregator within half a second (test_processes' policy)."""


@pytest.fixture()
def threads() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=len(NAMES), thread_name_prefix="test-collaborator")
    yield pool
    pool.shutdown(wait=False, cancel_futures=True)


@pytest.mark.slow
def test_a_resumed_drift_corrected_federation_goes_on_with_the_same_sigma(
    tmp_path: Path, processes: Processes, threads: ThreadPoolExecutor
) -> None:
    """The aggregator (a process) is killed right after round 2's checkpoint and resumed; collaborators in
    threads live through it. Round 3 starts from the checkpointed state, sigma included (the round log's
    model digest covers it), and the federation ends where the uninterrupted simulation does."""
    workspace = new_workspace(tmp_path, NAMES, **DRIFT_PLAN)
    plan = load_aggregator_plan(workspace.plan)
    collaborators = [
        Collaborator(load_collaborator_config(path), retry=QUICK_RECONNECT) for path in workspace.configs.values()
    ]
    try:
        finished = [threads.submit(collaborator.run) for collaborator in collaborators]
        first = processes.aggregator(workspace, fault="after-checkpoint:2")
        assert first.wait(120) == -9, processes.tail()
        saved = load_checkpoint(workspace.output, plan_digest(plan))
        assert saved.round == 2 and saved.state.control is not None
        resumed = processes.aggregator(workspace, "--resume")
        assert resumed.wait(120) == 0, processes.tail()
        assert [done.result(timeout=60) for done in finished] == [0, 0, 0]
    finally:
        for collaborator in collaborators:
            collaborator.stop()

    log = read_round_log(workspace.output)
    assert [record["round"] for record in log] == [1, 2, 3, 4]
    assert log[2]["model_sha256"] == state_digest(saved.state)
    final = load_checkpoint(workspace.output, plan_digest(plan)).state
    assert_state_matches(final, simulated(workspace).state, accumulated_bound(log))
