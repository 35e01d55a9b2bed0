"""Stops by signal: SIGTERM is a stop like Ctrl-C, for the aggregator, a collaborator and ``launch``.

systemd, Docker, ``timeout`` and ``fedfair stop`` send SIGTERM, which by default ends a Python process on the
spot: no closing line, no goodbye to the aggregator, children left behind. Under :func:`stop_on_signals` both
SIGTERM and SIGINT raise :class:`Stopped` (a KeyboardInterrupt, so every ``except KeyboardInterrupt`` that
closes up after Ctrl-C closes up after SIGTERM too), and the process exits with :func:`stop_status`: 128 plus
the signal's number, as a shell reports a process the signal ended (130 after Ctrl-C, 143 after SIGTERM).

Why: docs/operations.md, "Stopping".
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


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


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into :class:`Stopped` while the block runs.

    So a party stops its work and closes up instead of dying on the spot or going on. SIGINT is set
    outright because a process started in the background by a non-interactive shell inherits it ignored,
    and Python then never raises KeyboardInterrupt. Only the main thread can set a handler: elsewhere the
    block runs with the handlers as they are.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signum)

    previous = {stop: signal.signal(stop, interrupt) for stop in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
