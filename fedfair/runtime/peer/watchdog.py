"""A wait on the aggregator that says so and ends: the idle watchdog of a collaborator or the auditor.

While a party (a collaborator, the auditor) follows the task stream it waits on the aggregator: for the next
task, for a model or a stage's input to download, for the aggregator to come back. An
aggregator that stays up and sends nothing would hold it forever. :class:`Watchdog` counts
the seconds since the last progress (a task carried out); every ``report_seconds`` of a wait
it logs one line saying what it waits for and for how long, and once the wait reaches its file's
``idle_timeout_seconds`` it calls its ``expire`` callback (the task stream closes
its channel, which ends every RPC on it at once) and holds the failure the party then
exits with, ``aggregator-silent``. Time spent on the party's own work (training,
encoding) is not waiting: the aggregator then waits for it, not the other way round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fedfair.core.errors import PermanentFailureError
from fedfair.core.tables import Table
from fedfair.runtime.failures import AGGREGATOR_SILENT

DEFAULT_IDLE_TIMEOUT_SECONDS = 3600.0
"""[collaborator] (or [auditor]) idle_timeout_seconds: how long a party waits on its aggregator without progress
(no task carried out, a download stalled) before it exits with aggregator-silent. An hour: well above a
round of any plan's default timeouts, and above how long a federation usually takes to gather its quorum."""

REPORT_SECONDS = 60.0
"""How often a party waiting on its aggregator says so (or four times per idle timeout, if shorter)."""


def idle_timeout(section: Table) -> float:
    """The ``idle_timeout_seconds`` of a party's own section: at least a second, an hour where left out."""
    return section.number(
        "idle_timeout_seconds",
        DEFAULT_IDLE_TIMEOUT_SECONDS,
        check=lambda x: x >= 1,
        expected="seconds >= 1 (how long to wait on a silent aggregator)",
    )


class Watchdog:
    """Times one party's waits on the aggregator; see the module's notes. Thread-safe."""

    def __init__(
        self,
        name: str,
        address: str,
        limit_seconds: float,
        expire: Callable[[], None],
        *,
        role: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`role` is the party's ("collaborator", "auditor"): its lines log as ``fedfair.<role>``."""
        self.name, self.address, self.limit = name, address, limit_seconds
        self.logger = logging.getLogger(f"fedfair.{role}")
        self.report_seconds = min(REPORT_SECONDS, limit_seconds / 4)
        self._expire = expire
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._since = clock()
        self._working = 0
        self._what = ""
        self.expired: PermanentFailureError | None = None
        """The failure to exit with once a wait outlasted the limit (None until then)."""

    def progress(self, next_wait: str = "the next task") -> None:
        """Something moved: the wait starts again, for `next_wait`."""
        with self._lock:
            self._since, self._what = self._clock(), next_wait

    def waiting_for(self, what: str) -> None:
        """Name what the current wait is for (its time keeps counting)."""
        with self._lock:
            self._what = what

    @contextmanager
    def working(self) -> Iterator[None]:
        """This party's own work: not counted as a wait; the wait starts again when it ends."""
        with self._lock:
            self._working += 1
        try:
            yield
        finally:
            with self._lock:
                self._working -= 1
                self._since = self._clock()

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Run the watchdog's thread for the duration of the block."""
        thread = threading.Thread(target=self._watch, name=f"{self.name}-watchdog", daemon=True)
        self._wake.clear()
        self.progress("the first task")
        thread.start()
        try:
            yield
        finally:
            self._wake.set()
            thread.join()

    def _watch(self) -> None:
        reported = 0.0
        while not self._wake.wait(self.report_seconds / 4):
            with self._lock:
                waited = 0.0 if self._working else self._clock() - self._since
                what = self._what
            if waited < reported:  # progress since the last line: a new wait
                reported = 0.0
            if waited >= self.limit:
                self.expired = PermanentFailureError(
                    AGGREGATOR_SILENT, seconds=waited, address=self.address, what=what, limit=self.limit
                )
                self.logger.error("%s: %s", self.name, self.expired)
                self._expire()
                return
            if waited >= reported + self.report_seconds:
                reported = waited
                self.logger.info(
                    "%s: waiting for %s from the aggregator for %s s (it gives up after %s s without progress)",
                    self.name,
                    what,
                    _seconds(waited),
                    _seconds(self.limit),
                )


def _seconds(value: float) -> str:
    """Seconds for a log line: tenths below a minute (a test's short limits), whole seconds above."""
    return f"{value:.1f}" if value < 60 else f"{value:.0f}"
