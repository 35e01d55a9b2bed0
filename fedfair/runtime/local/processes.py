"""The processes of a federation rehearsed on one machine: start them, stream their logs, supervise."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Protocol

from fedfair.core.errors import FedfairError
from fedfair.runtime.local.forkserver import STOP_GRACE_SECONDS, shared_forkserver

if TYPE_CHECKING:  # the workspace module reads plans (pandas): `fedfair launch --help` need not
    from fedfair.runtime.local.workspace import Workspace


class LogSink(Protocol):
    """Where children's log lines go: a text stream, or a `runtime.progress.Progress` (which keeps its bar intact)."""

    def write(self, text: str, /) -> int:
        """Write `text` (whole lines), returning how many characters were written."""
        ...

    def flush(self) -> None:
        """Push what was written to its destination."""
        ...


STARTUP_SECONDS = 120.0
"""How long the aggregator may take to start listening (imports included) before launch gives up."""


FEDFAIR_COMMAND = [sys.executable, "-m", "fedfair.cli"]
"""How a party's command line starts: such commands are forked from the forkserver where it can."""


def aggregator_command(workspace: Workspace, *extra: str) -> list[str]:
    """The command line that starts the workspace's aggregator, with `extra` flags."""
    return [*FEDFAIR_COMMAND, "aggregator", "start", "--plan", str(workspace.plan), *extra]


def collaborator_command(workspace: Workspace, name: str) -> list[str]:
    """The command line that starts the collaborator `name` of the workspace."""
    return [*FEDFAIR_COMMAND, "collaborator", "start", "--config", str(workspace.configs[name])]


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The children's environment: one compute thread each (they share this machine's cores)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.update(extra or {})
    return env


class Process(Protocol):
    """What a launcher uses of a child process: `subprocess.Popen`'s, or a fork server's `ForkedProcess`."""

    pid: int
    returncode: int | None
    stdout: IO[str] | None

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        ...

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to exit; its status."""
        ...

    def send_signal(self, signum: int) -> None:
        """Send it `signum`."""
        ...

    def terminate(self) -> None:
        """SIGTERM."""
        ...

    def kill(self) -> None:
        """SIGKILL."""
        ...


def spawn(command: Sequence[str], env: Mapping[str, str] | None) -> Process:
    """Start `command` in a new session, its stdout and stderr one text pipe.

    A `fedfair` command (:data:`FEDFAIR_COMMAND`) is forked from this process's forkserver
    (:mod:`fedfair.runtime.local.forkserver`), which saves each party the imports of a fresh interpreter; any
    other command, or any where the forkserver declined, is executed.
    """
    environment = dict(env) if env is not None else dict(os.environ)
    if list(command[: len(FEDFAIR_COMMAND)]) == FEDFAIR_COMMAND:
        forkserver = shared_forkserver(environment)
        if forkserver is not None:
            return forkserver.spawn(command[len(FEDFAIR_COMMAND) :], environment)
    return subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env=environment,
        start_new_session=True,
    )


class Child:
    """A child process whose output is streamed, line by line, with a prefix."""

    def __init__(
        self,
        label: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        sink: LogSink | None = None,
        watch: str | None = None,
        ended: threading.Event | None = None,
    ) -> None:
        self.label = label
        self.sink: LogSink = sink if sink is not None else sys.stdout
        self.lines: list[str] = []
        self.seen = threading.Event()
        self._watch = watch
        self._ended = ended
        self.process = spawn(command, env)
        self._reader = threading.Thread(target=self._pump, name=f"log-{label}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None  # opened as a pipe above
        for line in self.process.stdout:
            text = line.rstrip("\n")
            self.lines.append(text)
            # One write per line: children log from several threads at once, and a line must stay whole.
            self.sink.write(f"[{self.label}] {text}\n")
            self.sink.flush()
            if self._watch is not None and self._watch in text:
                self.seen.set()
        self.seen.set()  # the output closed: nobody should wait for a line any more
        self.process.wait()  # it is exiting; reap it so that its status is known
        if self._ended is not None:
            self._ended.set()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit and its output to be read; its exit status."""
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        """Stop it: SIGTERM, then SIGKILL if it does not go within :data:`STOP_GRACE_SECONDS` (:func:`stop_all`)."""
        stop_all([self])


def stop_all(children: Sequence[Child], grace: float = STOP_GRACE_SECONDS) -> None:
    """Stop `children` together: SIGTERM to each at once, then SIGKILL to any still running `grace` s later.

    Together, so that stopping a federation takes one grace, not one per process in turn (three took 25 s).
    """
    running = [child for child in children if child.process.poll() is None]
    for child in running:
        child.process.terminate()
    deadline = time.monotonic() + grace
    for child in running:
        try:
            child.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def start_aggregator(
    workspace: Workspace,
    *extra: str,
    env: Mapping[str, str] | None = None,
    sink: LogSink | None = None,
    ended: threading.Event | None = None,
) -> Child:
    """Start the aggregator and wait until it listens (or has exited)."""
    child = Child(
        "aggregator",
        aggregator_command(workspace, *extra),
        env=child_environment(env),
        sink=sink,
        watch="listening on port",
        ended=ended,
    )
    if not child.seen.wait(STARTUP_SECONDS) or child.process.poll() is not None:
        child.kill()
        raise FedfairError("the aggregator did not start; see its log above")
    return child


def start_collaborator(
    workspace: Workspace,
    name: str,
    *,
    env: Mapping[str, str] | None = None,
    sink: LogSink | None = None,
    ended: threading.Event | None = None,
) -> Child:
    """Start the collaborator `name` (it connects to the aggregator by itself, retrying until it listens)."""
    return Child(name, collaborator_command(workspace, name), env=child_environment(env), sink=sink, ended=ended)


def start_auditor(
    workspace: Workspace,
    *,
    env: Mapping[str, str] | None = None,
    sink: LogSink | None = None,
    ended: threading.Event | None = None,
) -> Child:
    """Start the workspace's auditor from its auditor.toml (it connects by itself, retrying until it is served)."""
    assert workspace.auditor is not None, "the workspace's plan bounds inputs: it has an auditor"
    command = [*FEDFAIR_COMMAND, "auditor", "start", "--config", str(workspace.auditor)]
    return Child(workspace.auditor.parent.name, command, env=child_environment(env), sink=sink, ended=ended)


def supervise(
    aggregator: Child,
    collaborators: Sequence[Child],
    ended: threading.Event,
    *,
    tick: Callable[[], None] | None = None,
    tick_seconds: float = 1.0,
) -> None:
    """Wait for the aggregator to finish and the collaborators after it; fail fast if any child fails.

    `ended` is set whenever a child has exited, so this waits on an event, not a clock;
    `tick` (e.g. a progress update), when given, also runs every `tick_seconds` meanwhile.
    """
    while True:
        ended.clear()
        for child in (aggregator, *collaborators):
            code = child.process.poll()
            if code not in (None, 0):
                raise FedfairError(f"{child.label} exited with status {code}; see its log above")
        if aggregator.process.poll() == 0:
            for child in collaborators:
                if child.wait(timeout=60) != 0:
                    raise FedfairError(f"{child.label} exited with status {child.process.returncode}; see its log")
            return
        if tick is not None:
            tick()
        ended.wait(tick_seconds if tick is not None else None)
