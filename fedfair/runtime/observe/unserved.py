"""Connections a monitoring endpoint closed without serving them: counted by reason, said once per burst.

A port scan, a load balancer's TCP health check or a stalled client opens connections that never send a
request, or fail the TLS handshake. None of them is the party's fault, and a hundred of them must not
print a hundred tracebacks (issue 79): the endpoint counts each here, and the first of a burst starts a
window of :data:`SUMMARY_SECONDS` at whose end one line says how many were closed and why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

SUMMARY_SECONDS = 60.0
"""How long a burst of unserved connections is gathered into one log line."""


class UnservedConnections:
    """A count of connections closed without a request, logged on `logger` at most once per `window` seconds."""

    def __init__(self, logger: logging.Logger, window: float = SUMMARY_SECONDS) -> None:
        if window <= 0:
            raise ValueError(f"window = {window!r} s: give a positive number of seconds to gather a burst over")
        self.logger = logger
        self.window = window
        self._lock = threading.Lock()
        self._reasons: Counter[str] = Counter()
        self._started = 0.0
        self._timer: threading.Timer | None = None

    def closed(self, reason: str) -> None:
        """Count one connection closed for `reason` (e.g. "silent for 10 s"); the burst's line comes later."""
        with self._lock:
            self._reasons[reason] += 1
            if self._timer is None:
                self._started = time.monotonic()
                self._timer = threading.Timer(self.window, self.flush)
                self._timer.daemon = True  # a pending line never holds the party's exit (stop() flushes it)
                self._timer.start()

    def flush(self) -> None:
        """Log the burst so far in one line (nothing when none was closed) and start a new one."""
        with self._lock:
            reasons, self._reasons = self._reasons, Counter()
            timer, self._timer = self._timer, None
            seconds = time.monotonic() - self._started
        if timer is not None:
            timer.cancel()  # when called by the timer itself, a no-op
        if not reasons:
            return
        total = sum(reasons.values())
        self.logger.info(
            "closed %d idle or broken monitoring connection%s in the last %.1f s without a request (%s)",
            total,
            "" if total == 1 else "s",
            seconds,
            ", ".join(f"{reason}: {count}" for reason, count in reasons.most_common()),
        )
