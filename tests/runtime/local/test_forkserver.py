"""The forkserver forks `fedfair` parties that behave as fresh processes: own session, output, directory,
environment and exit status (signals included), and it declines to fork once it has a second thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.local.processes import FEDFAIR_COMMAND, child_environment, spawn
from fedfair.runtime.local.forkserver import DISABLE, ForkedProcess, ForkServer

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the forkserver forks on Linux only")


@pytest.fixture(scope="module")
def forkserver() -> Iterator[ForkServer]:
    started = ForkServer(child_environment())
    assert started.ready
    yield started
    started.stop()
    assert started.process.returncode == 0


def test_a_party_runs_fedfair_with_its_own_environment_directory_and_status(
    forkserver: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = child_environment({"FEDFAIR_FORKSERVER_PROBE": "1"})
    party = forkserver.spawn(["aggregator", "start", "--plan", "missing.toml"], env)
    assert party.stdout is not None
    said = party.stdout.read()
    assert party.wait(60) == 2 == party.returncode and party.poll() == 2
    # The relative path was read in this test's directory, not the forkserver's.
    assert f"fedfair: error: {tmp_path / 'missing.toml'} not found" in said or "missing.toml not found" in said
    assert party.args == ["fedfair", "aggregator", "start", "--plan", "missing.toml"]


def test_a_party_has_its_own_session_and_stops_on_the_signal_it_is_sent(forkserver: ForkServer, tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path, ["site-a", "site-b"])  # nobody serves its aggregator's address
    # A collaborator whose aggregator never answers waits (minutes) until it is stopped.
    party = forkserver.spawn(
        ["collaborator", "start", "--config", str(workspace.configs["site-a"])], child_environment()
    )
    assert party.stdout is not None
    assert "waiting up to" in party.stdout.readline() + party.stdout.readline()
    assert party.pid not in (os.getpid(), forkserver.process.pid) and party.poll() is None
    assert os.getsid(party.pid) == party.pid  # a session of its own, as start_new_session gives
    party.terminate()
    assert party.wait(60) == 128 + signal.SIGTERM  # a stop as at Ctrl-C: its closing line, then status 143
    with pytest.raises(subprocess.TimeoutExpired):
        ForkedProcess(0, ["never"]).wait(0.01)


def test_spawn_forks_fedfair_commands_and_executes_any_other() -> None:
    forked = spawn([*FEDFAIR_COMMAND, "--version"], child_environment())
    executed = spawn([sys.executable, "-c", "print('fresh')"], child_environment())
    assert isinstance(forked, ForkedProcess) and isinstance(executed, subprocess.Popen)
    assert forked.stdout is not None and executed.stdout is not None
    assert forked.stdout.read().startswith("fedfair ") and executed.stdout.read() == "fresh\n"
    assert forked.wait(60) == 0 and executed.wait(60) == 0


def test_fedfair_forkserver_0_executes_every_party_afresh() -> None:
    fresh = spawn([*FEDFAIR_COMMAND, "--version"], {**child_environment(), DISABLE: "0"})
    assert isinstance(fresh, subprocess.Popen) and fresh.stdout is not None
    assert fresh.stdout.read().startswith("fedfair ") and fresh.wait(60) == 0


def test_a_forkserver_with_a_second_thread_declines_to_fork() -> None:
    # pyarrow's allocator keeps a background thread when asked to: forking then could copy a held lock.
    declined = ForkServer(child_environment({"JE_ARROW_MALLOC_CONF": "background_thread:true"}))
    try:
        assert not declined.ready
    finally:
        declined.stop()


def test_signalling_a_party_reaped_before_its_status_arrives_is_no_error() -> None:
    # The forkserver reaps a party and then reports its status; a kill in between finds no such process. A test's
    # teardown killed one in that window (ProcessLookupError): the party is gone, which is what the kill wanted.
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    party = ForkedProcess(finished.pid, ["fedfair"])
    party.terminate()
    party.kill()
    assert party.poll() is None  # its status is still the forkserver's to report


def test_a_party_still_running_when_its_forkserver_stops_is_stopped_too(tmp_path: Path) -> None:
    """A launcher stops its parties before its forkserver; one it lost track of (a Ctrl-C between the fork and its
    record) ran on for its own timeouts and held the launcher's exit: the forkserver stops it (SIGTERM)."""
    server = ForkServer(child_environment())
    assert server.ready
    workspace = make_workspace(tmp_path, ["site-a", "site-b"])  # nobody serves its aggregator's address
    party = server.spawn(["collaborator", "start", "--config", str(workspace.configs["site-a"])], child_environment())
    assert party.stdout is not None and "waiting up to" in party.stdout.readline() + party.stdout.readline()
    began = time.monotonic()
    server.stop()
    assert time.monotonic() - began < 30.0  # its stop, not the collaborator's 60 s wait for an aggregator
    assert party.wait(10) == 128 + signal.SIGTERM and server.process.returncode == 0
