"""SIGTERM and SIGINT stop a party in its main thread at once, whichever thread the kernel hands them to."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

import pytest

from fedfair.core.errors import FailureError
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.failures import CONNECTION_LOST
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.peer.connection import get_plan
from fedfair.runtime.peer.retries import Backoff, Target
from fedfair.runtime.peer.uplink import federation_stub
from fedfair.runtime.observe.logs import CLOSING
from fedfair.runtime.stops import Stopped, say_stopped, stop_name, stop_on_signals, stop_status
from fedfair.runtime.transport import secure_channel


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_handed_to_another_thread_interrupts_the_main_threads_wait_at_once(signum: signal.Signals) -> None:
    """Without the forwarder the main thread would go on waiting until its wait's timeout (here 30 s)."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    began = time.monotonic()
    with pytest.raises(Stopped) as stopped, stop_on_signals():
        threading.Thread(target=lambda: signal.pthread_kill(threading.get_ident(), signum)).start()
        threading.Event().wait(30.0)
    # Two thirds of the 30 s wait: a loaded machine's scheduling may stall the signal's thread for seconds, and a
    # missing forwarder still fails (the wait then runs its whole 30 s).
    assert time.monotonic() - began < 20.0
    assert stop_status(stopped.value) == 128 + signum
    assert stop_name(stopped.value) == ("SIGTERM" if signum == signal.SIGTERM else "Ctrl-C (SIGINT)")
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # handlers restored


def test_a_second_stop_while_closing_up_does_not_cut_it_short() -> None:
    closed = False
    with pytest.raises(Stopped), stop_on_signals():
        try:
            signal.raise_signal(signal.SIGTERM)
            threading.Event().wait(30.0)
        finally:
            signal.raise_signal(signal.SIGINT)  # the operator presses Ctrl-C while it closes up: ignored
            time.sleep(0.1)  # where the handler would raise
            closed = True
    assert closed


def test_a_stop_a_library_turns_into_an_error_of_its_own_ends_the_block_as_the_stop() -> None:
    """The handler raises wherever the main thread is, e.g. inside a library's call that catches the interrupt and
    ends the call with an error of its own: a collaborator stopped by SIGTERM then exited 2 (a failure), not 143."""
    with pytest.raises(Stopped) as stopped, stop_on_signals():
        try:
            signal.raise_signal(signal.SIGTERM)
            threading.Event().wait(30.0)
        except KeyboardInterrupt:
            raise FailureError(CONNECTION_LOST, address="127.0.0.1:1", reason="the call was cancelled") from None
    assert stop_status(stopped.value) == 128 + signal.SIGTERM
    assert isinstance(stopped.value.__cause__, FailureError)


def test_a_stop_dropped_inside_a_call_still_ends_the_wait_for_a_first_answer(tmp_path: Path) -> None:
    """A dropped interrupt (an exception raised in a ``__del__`` is ignored) left the party waiting for an aggregator
    nobody serves: `on_stop` (the party's stop) ends the back-off's wait at once, and the block ends as the stop."""
    workspace = make_workspace(tmp_path, ["site-a", "site-b"])  # nobody serves its aggregator's address
    config = load_collaborator_config(workspace.configs["site-a"])
    stop = threading.Event()
    target = Target(config.aggregator, config.certificates, config.aggregator_name)
    backoff = Backoff(config.retry, config.name, stop, target, config.name, role="collaborator")
    dropped: list[Stopped] = []

    def fetch_plan() -> object:
        with secure_channel(config.aggregator, config.certificates) as channel:
            if not dropped:
                try:
                    signal.raise_signal(signal.SIGTERM)
                    time.sleep(1.0)
                except Stopped as stop_dropped:
                    dropped.append(stop_dropped)
            return get_plan(federation_stub(channel), "collaborator", config.aggregator)

    began = time.monotonic()
    with pytest.raises(Stopped) as stopped, stop_on_signals(on_stop=backoff.stop.set):
        backoff.call("fetching the plan", fetch_plan)
    # Well within the 45 s wait for a first answer ([retry] start_wait_seconds), which it ran out before, on a
    # loaded machine too: the stop ends the wait's next pause of at most 1 s.
    assert len(dropped) == 1 and time.monotonic() - began < 20.0
    assert config.retry.start_wait_seconds == 45.0
    assert stop_status(stopped.value) == 128 + signal.SIGTERM
    assert isinstance(stopped.value.__cause__, FailureError)


@pytest.mark.parametrize(
    ("stop", "how", "status"),
    [
        (Stopped(signal.SIGTERM), "SIGTERM", 143),
        (Stopped(signal.SIGINT), "Ctrl-C (SIGINT)", 130),
        (KeyboardInterrupt(), "Ctrl-C (SIGINT)", 130),
    ],
)
def test_a_parties_closing_line_names_the_stop_and_how_to_go_on(
    stop: KeyboardInterrupt, how: str, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The collaborator's and the auditor's last line: a warning marked as the closing line (the console ends its
    progress bar first), "<party>: stopped by <how>; <then>"; the status a shell reports for that signal."""
    logger = logging.getLogger("fedfair.auditor")
    with caplog.at_level(logging.WARNING, logger="fedfair.auditor"):
        assert say_stopped(stop, "audit-co", "its state is in here: start it again", logger) == status
    (record,) = caplog.records
    assert record.getMessage() == f"audit-co: stopped by {how}; its state is in here: start it again"
    assert record.levelno == logging.WARNING and getattr(record, CLOSING) is True
