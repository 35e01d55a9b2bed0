"""How often one key may do a thing, and which of a flood of like events get a log line.

Shared by both processes: the aggregator limits each caller's status reports, refusals and arrivals
(:mod:`fedfair.runtime.aggregator.limits`); a collaborator limits the lines a hostile or broken
aggregator's tasks make it write (:mod:`fedfair.runtime.collaborator.stream`). A peer in a loop
would otherwise fill the operator's log at the speed of its network.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable


class RateLimit:
    """A token bucket per key: `burst` at once, then `per_second` on average.

    The keys are certified names (and one key shared by every caller without a listed name), or the kinds
    of a collaborator's lines, so the buckets never outnumber a fixed list.
    """

    def __init__(
        self, per_second: float = 1.0, burst: int = 10, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}

    def allow(self, key: str) -> bool:
        """Spend one of `key`'s tokens; False if it has none left."""
        now = self._clock()
        with self._lock:
            tokens, since = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - since) * self.per_second)
            allowed = tokens >= 1.0
            self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
            return allowed


class LineBudget:
    """Which events of a kind get their own log line (and event): a burst per key, then a rate.

    The event itself always happens; only its line is skipped. The events not logged are
    counted per key, and the count rides on that key's next logged line (or is taken by
    :meth:`drain` when the process stops hearing them), so none goes unaccounted for.
    """

    UNIDENTIFIED = ""
    """The one key of every caller not yet identified (no name from the allow-list)."""

    def __init__(self, rate: RateLimit) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._unlogged: Counter[str] = Counter()

    def admit(self, key: str | None) -> int | None:
        """None if this event of `key` goes unlogged (it is counted).

        Otherwise how many went unlogged since that key's last logged one.
        """
        key = self.UNIDENTIFIED if key is None else key
        with self._lock:
            if not self.rate.allow(key):
                self._unlogged[key] += 1
                return None
            return self._unlogged.pop(key, 0)

    def drain(self) -> dict[str, int]:
        """The events not logged since each key's last line, by key (those with any); the counts start again."""
        with self._lock:
            unlogged, self._unlogged = dict(self._unlogged), Counter()
            return unlogged
