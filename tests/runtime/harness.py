"""Shared pieces of the runtime tests (no tests here): workspaces, federations, replays.

Two ways to run a federation:
- as real OS processes (`processes.start_aggregator` / `start_collaborator`), for the
  end-to-end and fault tests;
- in threads of the test process, with the real gRPC server over loopback mutual TLS
  and real `Collaborator` objects, where a test must reach into a collaborator (to
  pause it, tap its bytes, or break its update) and process start-up would dominate.

`replay` recomputes, with the in-process simulation's code, what a federation should
have produced given which collaborators contributed to each round (from the round
log), so a run with dropouts and restarts can still be checked number for number.
"""

from __future__ import annotations

import fcntl
import io
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import pytest
import torch

from fedfair.core import server
from fedfair.core.update import bounded
from fedfair.core.models import flat_parameters
from fedfair.datasets import load_dataset, partition
from fedfair.research.launch_baseline import simulation_options
from fedfair.runtime.local.processes import Child, child_environment, start_aggregator, start_collaborator
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.simulation.federation import Federation, federation_from_arrays
from fedfair.simulation.rounds import make_learners
from fedfair.runtime.aggregator.start import run_aggregator
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.faults import VARIABLE as FAULT
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_aggregator_plan

RUNTIME_PLAN: dict[str, dict[str, Any]] = {
    "objective": {"epsilon": 0.1, "rho": 0.3},
    "training": {"local_steps": 2, "batch_fraction": 0.01, "lr": 0.1, "threshold_lr": 0.1, "seed": 0},
    "quorum": {"round_timeout_seconds": 30.0},
    # The end-of-run page costs each run about 1.5 CPU-s; tests/runtime/test_report.py turns it on.
    "aggregator": {"report": False},
}


def refused(call: Callable[[], object], code: grpc.StatusCode) -> grpc.RpcError:
    """The error `call()` raises, which must carry the gRPC status `code`."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == code, caught.value.details()
    return caught.value


def eventually(condition: Callable[[], bool], seconds: float = 60.0) -> bool:
    """Whether `condition()` turns true within `seconds` (other threads and servers act asynchronously).

    The bound only ends a failing test; no speed is asserted, so it is generous: a loaded machine is slow.
    """
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def frozen(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal (state T in /proc: a `freeze:` fault point, or SIGSTOP)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


@contextmanager
def lock_attempts() -> Iterator[list[int]]:
    """The operation of every `fcntl.flock` this thread makes in the block, in order (each still runs).

    A refusal "at once" is one no attempt waited for: every operation carries LOCK_NB. Reading that instead
    of a stopwatch, the test holds on a loaded machine. Other threads' locks (a ledger's) are not recorded.
    """
    operations: list[int] = []
    real, caller = fcntl.flock, threading.get_ident()

    def flock(fd: int, operation: int) -> None:
        if threading.get_ident() == caller:
            operations.append(operation)
        real(fd, operation)

    with mock.patch.object(fcntl, "flock", flock):
        yield operations


def plan_sections(**sections: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """RUNTIME_PLAN with some sections' keys replaced or added."""
    merged = {section: dict(values) for section, values in RUNTIME_PLAN.items()}
    for section, values in sections.items():
        merged.setdefault(section, {}).update(values)
    return merged


def new_workspace(root: Path, names: Sequence[str], **sections: Mapping[str, Any]) -> Workspace:
    return make_workspace(root, names, plan=plan_sections(**sections))


# ---------------------------------------------------------------- federations of processes


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

    def forging_aggregator(self, workspace: Workspace, *attack: str) -> Child:
        """tests/runtime/forging_aggregator.py making `attack` (its arguments after the plan), once it listens."""
        command = [sys.executable, str(Path(__file__).with_name("forging_aggregator.py")), str(workspace.plan)]
        child = Child(
            "aggregator", [*command, *attack], env=child_environment(), sink=self.log, watch="listening on port"
        )
        self.children.append(child)
        assert child.seen.wait(120) and child.process.poll() is None, self.tail()
        return child

    def tail(self) -> str:
        """The end of every child's log, for a failure message."""
        return self.log.getvalue()[-4000:]

    def finish(self, aggregator: Child, timeout: float = 240.0) -> None:
        """Wait for the aggregator to finish and every collaborator still running to exit cleanly."""
        assert aggregator.wait(timeout) == 0, self.tail()
        for child in self.children:
            if child is not aggregator and child.process.returncode is None:
                assert child.wait(60) == 0, self.tail()


# ---------------------------------------------------------------- federations in threads


@dataclass
class ThreadFederation:
    """An aggregator and collaborators running in threads of this process."""

    plan: AggregatorPlan
    collaborators: dict[str, Collaborator]
    summary: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, Exception] = field(default_factory=dict)
    exits: dict[str, int] = field(default_factory=dict)
    """Each collaborator's exit status (what its ``run`` returned)."""
    threads: list[threading.Thread] = field(default_factory=list)

    def _run(self, label: str, target: Callable[[], Any]) -> None:
        def body() -> None:
            try:
                result = target()
                if isinstance(result, dict):
                    self.summary.update(result)
                elif isinstance(result, int):
                    self.exits[label] = result
            except Exception as error:  # noqa: BLE001 -- kept for the test to report, not lost in a thread
                self.errors[label] = error

        thread = threading.Thread(target=body, name=f"test-{label}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self, timeout: float = 120.0) -> None:
        """Wait up to `timeout` s for each thread; fail at once, naming its error, if the aggregator raised.

        Its collaborators would wait for it to come back ([retry] max_wait_seconds, 15 minutes by default), so
        without the early end a crashed aggregator reads as a hung federation.
        """
        for thread in self.threads:
            deadline = time.monotonic() + timeout
            while thread.is_alive() and "aggregator" not in self.errors and time.monotonic() < deadline:
                thread.join(0.1)
        alive = [thread.name for thread in self.threads if thread.is_alive()]
        if "aggregator" in self.errors:
            assert not alive, f"the aggregator raised {self.errors['aggregator']!r}; still running: {alive}"
        assert not alive, f"still running after {timeout} s: {alive}"


@contextmanager
def thread_federation(
    workspace: Workspace, *, collaborator: Callable[[str, Collaborator], None] | None = None
) -> Iterator[ThreadFederation]:
    """Start the aggregator and every collaborator of `workspace` in threads.

    `collaborator(name, instance)` may adjust an instance before it runs. On exit the
    collaborators are stopped; the test joins first if it wants the run to finish.
    """
    plan = load_aggregator_plan(workspace.plan)
    instances = {name: Collaborator(load_collaborator_config(path)) for name, path in workspace.configs.items()}
    for name, instance in instances.items():
        if collaborator is not None:
            collaborator(name, instance)
    federation = ThreadFederation(plan, instances)
    federation._run("aggregator", lambda: run_aggregator(plan))
    for name, instance in instances.items():
        federation._run(name, instance.run)
    try:
        yield federation
    finally:
        for instance in instances.values():
            instance.stop()


# ---------------------------------------------------------------- replaying a run in process


def replay(
    plan: AggregatorPlan,
    federation: Federation,
    names: Sequence[str],
    log: Sequence[Mapping[str, Any]],
    *,
    restarted: Mapping[str, int] | None = None,
) -> server.ServerState:
    """The server state the simulation's code reaches when, in round r, exactly the collaborators
    that trained do so (the round's participants in the log) and the log's contributors are summed.

    `restarted[name] = r`: that collaborator's process restarted and rejoined at round r, with a
    fresh learner (its sampler starts again from its seed).

    With drift correction the server's control variate goes with every round, and a learner's
    first round (of its process) starts its own control variate from the server's, as the
    collaborator process does (`fedfair.runtime.collaborator.client`).
    """
    training, objective, options = plan.training, plan.objective, simulation_options(plan)
    _, learners = make_learners(federation, training, objective, options=options)
    index = {name: position for position, name in enumerate(names)}
    state = server.init(
        _initial_theta(plan, federation), bound=objective.bound, drift_correction=training.local.corrects_drift
    )
    average_from = training.average_from_round
    trained: set[str] = set()
    for record in log:
        round_number = record["round"]
        for name, at in (restarted or {}).items():
            if at == round_number:
                learners[index[name]] = make_learners(federation, training, objective, options=options)[1][index[name]]
                trained.discard(name)
        updates = {}
        for name in record["participants"]:
            learner = learners[index[name]]
            if state.control is not None and name not in trained:
                learner.control = state.control.clone()
            trained.add(name)
            updates[name] = learner.train_round(state.theta, state.c, state.control)
        if record["status"] != "applied":
            continue
        influence, fraction = plan.influence, plan.batch_fraction
        aggregate = server.Aggregate.of(
            [
                bounded(updates[name], influence.weight_of(name, fraction), influence.update_norm)
                for name in record["contributors"]
            ]
        )
        # The plan's own server step (its server momentum included), as the aggregator applies it.
        state = plan.algorithm().server_apply(state, aggregate, average_from=average_from)
    return state


def adult_split(parts: int) -> Federation:
    """Adult split by race into `parts` institutions, as the collaborators' default configs split it."""
    dataset = load_dataset("adult")
    splits = partition(dataset, "race", parts, seed=0)
    return federation_from_arrays(
        [split.name for split in splits],
        [(dataset.x_train[split.train_index], dataset.y_train[split.train_index]) for split in splits],
        [(dataset.x_test[split.test_index], dataset.y_test[split.test_index]) for split in splits],
        dataset.num_classes,
    )


def _initial_theta(plan: AggregatorPlan, federation: Federation) -> torch.Tensor:
    template, _ = make_learners(federation, plan.training, plan.objective, options=simulation_options(plan))
    return flat_parameters(template)
