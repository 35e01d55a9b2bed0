"""Stops by signal: SIGTERM is a stop like Ctrl-C, for the aggregator, a collaborator and ``launch``.

systemd, Docker, ``timeout`` and ``fedfair stop`` send SIGTERM, which by default ends a Python process on the
spot: no closing line, no goodbye to the aggregator, children left behind. Under :func:`stop_on_signals` both
SIGTERM and SIGINT raise :class:`Stopped` (a KeyboardInterrupt, so every ``except KeyboardInterrupt`` that
closes up after Ctrl-C closes up after SIGTERM too), and the process exits with :func:`stop_status`: 128 plus
the signal's number, as a shell reports a process the signal ended (130 after Ctrl-C, 143 after SIGTERM).

Why: docs/operations.md, "Stopping".
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from fedfair.runtime.observe.logs import CLOSING_LINE


class Stopped(KeyboardInterrupt):
    """The process was asked to stop by `signum` (SIGINT: Ctrl-C; SIGTERM: a service manager or ``fedfair stop``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_status(stop: KeyboardInterrupt) -> int:
    """The exit status of a process `stop` ended: 128 + its signal (a bare KeyboardInterrupt is Ctrl-C's SIGINT)."""
    return 128 + (stop.signum if isinstance(stop, Stopped) else signal.SIGINT)


def stop_name(stop: KeyboardInterrupt) -> str:
    """How the operator stopped the process, for its closing line: "Ctrl-C (SIGINT)" or "SIGTERM"."""
    signum = stop.signum if isinstance(stop, Stopped) else signal.SIGINT
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name


def say_stopped(stop: KeyboardInterrupt, party: str, then: str, logger: logging.Logger) -> int:
    """Log a party's closing line after `stop`, "<party>: stopped by SIGTERM; <then>"; its exit status.

    `then` says what the party kept and how to go on.
    """
    logger.warning("%s: stopped by %s; %s", party, stop_name(stop), then, extra=CLOSING_LINE)
    return stop_status(stop)


FORWARD_PAUSE_SECONDS = 0.5
"""How long the forwarder waits for the main thread to act on a stop it forwarded before it forwards another."""


@contextmanager
def stop_on_signals(on_stop: Callable[[], None] | None = None) -> Iterator[None]:
    """Turn SIGTERM and SIGINT into :class:`Stopped` in the main thread while the block runs.

    So a party stops its work and closes up instead of dying on the spot or going on. SIGINT is set
    outright because a process started in the background by a non-interactive shell inherits it ignored,
    and Python then never raises KeyboardInterrupt. Only the main thread can set a handler: elsewhere the
    block runs with the handlers as they are.

    A signal the kernel hands to another thread (gRPC's, a server's) would reach the main thread's handler only
    when its current wait times out, up to 10 s later, past the 5 s a launcher or Docker grants a stop: a
    forwarder thread, woken through the signal wakeup fd, sends it on to the main thread, whose wait it
    interrupts. The first stop raises; a repeat (the forwarded copy, or a second Ctrl-C while it closes up) is
    ignored, so the closing up is not cut short.

    The stop is kept as well as raised, since the handler raises wherever the main thread is: inside a library
    that catches the interrupt in one of its calls and ends the call with an error of its own (a gRPC call, a
    TLS dial), or drops it (an exception raised in a ``__del__`` is ignored). So a block that ends in any
    other exception once a stop arrived raises the stop instead (from that error), and `on_stop` (a party's
    ``stop``, which ends its waits), called from the forwarder once at the first stop, ends a block that would
    otherwise go on waiting after its interrupt was dropped.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = threading.Event()
    received: list[int] = []
    """The first stop's signal, kept by whichever of the handler and the forwarder sees it first."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if stopping.is_set():
            return
        received.append(signum)
        stopping.set()
        raise Stopped(signum)

    main = threading.main_thread().ident
    assert main is not None  # the main thread has started: this code runs in it
    woken, wake = os.pipe()
    os.set_blocking(wake, False)

    def forward() -> None:
        asked = False
        while data := os.read(woken, 64):
            if not any(signum in (signal.SIGINT, signal.SIGTERM) for signum in data):
                continue
            signum = signal.SIGTERM if signal.SIGTERM in data else signal.SIGINT
            if not received:
                received.append(signum)
            if not stopping.is_set():
                signal.pthread_kill(main, signum)
            if on_stop is not None and not asked:
                asked = True
                on_stop()
            stopping.wait(FORWARD_PAUSE_SECONDS)

    previous = {stop: signal.signal(stop, interrupt) for stop in (signal.SIGTERM, signal.SIGINT)}
    previous_fd = signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    forwarder = threading.Thread(target=forward, name="stop-signals", daemon=True)
    forwarder.start()
    try:
        yield
    except Exception as error:
        if received:
            raise Stopped(received[0]) from error
        raise
    finally:
        signal.set_wakeup_fd(previous_fd)
        for stop, handler in previous.items():
            signal.signal(stop, handler)
        os.close(wake)  # the forwarder reads the end of the pipe and returns
        forwarder.join(FORWARD_PAUSE_SECONDS * 2)
        os.close(woken)
