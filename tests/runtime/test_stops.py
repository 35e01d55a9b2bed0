"""SIGTERM and SIGINT stop a party in its main thread at once, whichever thread the kernel hands them to."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from fedfair.runtime.stops import Stopped, stop_name, stop_on_signals, stop_status


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
