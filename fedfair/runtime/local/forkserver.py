"""Start a rehearsal's `fedfair` processes by forking one interpreter that has already imported their libraries.

A fresh interpreter spends about 2.5 CPU-seconds importing PyTorch, pandas, gRPC and fedfair before a party
reads its plan; `launch` starts one per party, and the runtime's tests start about a hundred. A fork server
(the pattern of Python's multiprocessing ``forkserver``) pays that once per launching process and forks each
party from it: still a process of its own (own memory, sockets, session and exit status), running
``python -m fedfair.cli`` as a fresh one would, minus the imports. Forking is safe only while the fork server
has a single thread, so it checks that after importing and otherwise declines (the caller then executes a
fresh interpreter). Linux only: elsewhere a fork after importing PyTorch is not safe. What a party inherits
that a fresh one would not: the fork server's interpreter, import paths and thread settings, which are the
launching process's at the fork server's start. ``FEDFAIR_FORKSERVER=0`` in the launcher's environment
executes every party afresh, as a deployment runs it (e.g. to measure its memory).
"""

from __future__ import annotations

import atexit
import io
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

_MESSAGE_BYTES = 1 << 20
"""The largest request: a command line and an environment."""

STOP_GRACE_SECONDS = 5.0
"""How long a party stopped with SIGTERM may take to close up (its closing line) before it is killed."""

_IMPORT_SECONDS = 120.0
"""How long the forkserver may take to import before it is declined (launch's own start-up bound)."""

DISABLE = "FEDFAIR_FORKSERVER"
"""The environment variable that, set to 0, has every party executed afresh rather than forked."""

_PRELOADED = (
    "torch",
    "pandas",
    "grpc",
    "fedfair.cli",
    "fedfair.runtime.aggregator.start",
    "fedfair.runtime.collaborator.client",
)
"""What every party imports first (fedfair.cli's subcommands import the rest when they run)."""


def _send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


# ---------------------------------------------------------------- the forkserver process


def serve(sock: socket.socket) -> None:
    """The forkserver's loop: import, say whether it can fork, then fork one party per request until EOF.

    A request is ``{"argv", "env", "cwd"}`` with one file descriptor, the party's output; the answers are
    ``{"started": pid}`` in request order and ``{"exited": pid, "code": c}`` (`c` as `Popen.returncode`).
    At EOF it reaps the parties still running, so their CPU time is counted where the forkserver's is.
    """
    for name in _PRELOADED:
        __import__(name)
    threads = len(os.listdir("/proc/self/task"))
    _send(sock, {"ready": threads == 1, "threads": threads})
    if threads != 1:
        return
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(woken, selectors.EVENT_READ)
    running: set[int] = set()
    while True:
        for key, _ in selector.select():
            if key.fileobj is woken:
                os.read(woken, 4096)
                continue
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 1)
            if not data:  # the launcher is gone (or stops): its parties go too, any it lost track of included
                _stop(running)
                _reap(sock, running, block=True)
                return
            request = json.loads(data)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                selector.close()
                os.close(woken)
                os.close(wake)
                sock.close()
                _become_party(request["argv"], request["env"], request["cwd"], fds[0])  # does not return
            os.close(fds[0])
            running.add(pid)
            _send(sock, {"started": pid})
        _reap(sock, running, block=False)


def _stop(running: set[int], grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM to every party still running, then SIGKILL to any still running `grace` s later (not reaped here).

    A launcher stops its parties itself before it stops this server; one still running then is one it never
    learnt of (a Ctrl-C between the fork and the launcher's record of it), which would otherwise run on, and
    hold the launcher's exit, until its own timeouts ended it.
    """
    for pid in running:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_running(pid) for pid in running):
        time.sleep(0.05)
    for pid in running:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it exited: a zombie still takes signals, so only one already reaped is missing


def _running(pid: int) -> bool:
    """Whether the party `pid` has not exited (a zombie, exited but not reaped, has)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def _reap(sock: socket.socket, running: set[int], *, block: bool) -> None:
    """Collect the parties that exited (with `block`, all of them) and report each one's status."""
    while running:
        pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        if pid == 0:
            return
        running.discard(pid)
        try:
            _send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        except OSError:  # the launcher is gone; the parties are still reaped, so their CPU time is counted
            pass


def _become_party(argv: list[str], env: dict[str, str], cwd: str, output: int) -> None:
    """In the forked child: take the party's session, output, directory and environment; run fedfair; exit."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(stdin)
    os.close(output)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    threads = env.get("OMP_NUM_THREADS")
    if threads is not None and threads.isdigit():
        import torch

        torch.set_num_threads(int(threads))  # OpenMP read the forkserver's value when it loaded
    # As `python -m fedfair.cli` runs it: the command is a program to this layer, named as its command line is.
    sys.argv = ["fedfair", *argv]
    runpy.run_module("fedfair.cli", run_name="__main__", alter_sys=True)
    sys.exit(0)  # never back into the forkserver's loop


# ---------------------------------------------------------------- the launcher's side


class ForkedProcess:
    """A party forked by the forkserver, with the part of `subprocess.Popen`'s interface a launcher uses."""

    def __init__(self, pid: int, argv: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(argv)
        self.returncode: int | None = None
        self.stdout: IO[str] | None = None
        self._exited = threading.Event()

    def _exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to exit; its status (raises `subprocess.TimeoutExpired` after `timeout` seconds)."""
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None  # set before the event
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Send `signum` unless it has exited (and its PID may be another process's)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass  # it exited and was reaped; the forkserver's report of its status has not arrived yet

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The launching process's handle on its forkserver: spawn parties, learn their exit statuses."""

    def __init__(self, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        # pyarrow (under pandas) starts a jemalloc thread by default, and a fork server must stay single-threaded.
        forkserver_env = {"JE_ARROW_MALLOC_CONF": "background_thread:false", **env}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fedfair.runtime.local.forkserver", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=forkserver_env,
        )
        theirs.close()
        # A fork server that cannot import (or hangs importing) is declined, and the parties are executed instead.
        ours.settimeout(_IMPORT_SECONDS)
        try:
            first = json.loads(ours.recv(_MESSAGE_BYTES) or b'{"ready": false}')
        except TimeoutError:
            self.process.kill()
            first = {"ready": False}
        ours.settimeout(None)
        self.ready = bool(first["ready"])
        self._lock = threading.Lock()
        self._started: list[ForkedProcess] = []
        self._arrived = threading.Condition()
        self._parties: dict[int, ForkedProcess] = {}
        self._reader = threading.Thread(target=self._read, name="forkserver", daemon=True)
        if self.ready:
            self._reader.start()

    def _read(self) -> None:
        while True:
            data = self._sock.recv(_MESSAGE_BYTES)
            if not data:
                break
            message = json.loads(data)
            with self._arrived:
                if "started" in message:
                    party = ForkedProcess(int(message["started"]), ())
                    self._parties[party.pid] = party
                    self._started.append(party)
                    self._arrived.notify_all()
                else:
                    self._parties.pop(int(message["exited"]))._exit(int(message["code"]))
        with self._arrived:  # the forkserver died: nobody will report these parties' ends any more
            for party in self._parties.values():
                party._exit(-signal.SIGKILL)
            self._parties.clear()
            self._arrived.notify_all()

    def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> ForkedProcess:
        """Fork ``fedfair *argv`` with `env`, in this process's directory; its output is the party's stdout."""
        reading, writing = os.pipe()
        with self._lock:
            try:
                _send(self._sock, {"argv": list(argv), "env": dict(env), "cwd": os.getcwd()}, [writing])
            finally:
                os.close(writing)
            with self._arrived:
                if not self._arrived.wait_for(lambda: self._started or not self._reader.is_alive(), 60.0):
                    os.close(reading)
                    raise OSError("the forkserver did not fork a party within 60 s")
                if not self._started:
                    os.close(reading)
                    raise OSError("the forkserver exited")
                party = self._started.pop(0)
        party.args = ["fedfair", *argv]
        party.stdout = io.TextIOWrapper(io.FileIO(reading, "r"), line_buffering=True)
        return party

    def stop(self, timeout: float = 60.0) -> None:
        """End the requests and wait for the forkserver, which first waits for its running parties."""
        self._sock.shutdown(socket.SHUT_WR)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.ready:  # the reader runs only then
            self._reader.join(timeout)
        self._sock.close()


_shared: ForkServer | None = None
_shared_lock = threading.Lock()


def shared_forkserver(env: Mapping[str, str]) -> ForkServer | None:
    """This process's forkserver, started on first use with `env`; None where forking is not safe or possible."""
    global _shared
    if sys.platform != "linux" or env.get(DISABLE) == "0":
        return None
    with _shared_lock:
        if _shared is None:
            _shared = ForkServer(env)
            atexit.register(stop_shared_forkserver)
        return _shared if _shared.ready else None


def stop_shared_forkserver() -> None:
    """Stop this process's forkserver, if one started, after its parties have exited (their CPU is then counted)."""
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.stop()
            _shared = None


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
