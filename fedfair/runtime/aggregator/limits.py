"""How much of the aggregator one caller may hold.

Long requests counted per certified name, and refusals, arrivals and departures logged at a bounded rate, so no
caller can starve the others or flood the operator's log.

The servicer (:mod:`fedfair.runtime.aggregator.servicer`) applies these to every RPC; the gRPC
pool is sized by :func:`worker_threads` so that every listed collaborator at its limits still
leaves threads for the short requests.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum


from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.rate_limits import LineBudget, RateLimit

logger = logging.getLogger("fedfair.aggregator")

BUSY = "refused: too many concurrent requests of this kind from this caller; retry when one has ended"
"""What a peer hears when it is at its limit of concurrent streams, uploads or downloads."""

HEADROOM_THREADS = 8
"""Worker threads beyond what every listed collaborator may hold at its limits: for the
short requests (GetPlan, refusals) that must always find a free thread."""


class Hold(Enum):
    """The kinds of request that can hold a worker thread for long, each limited per caller."""

    TASK_STREAM = "task streams"
    UPLOAD = "uploads"
    DOWNLOAD = "downloads"


@dataclass(frozen=True)
class PeerLimits:
    """How many requests of each long-held kind one certified name may have open at once.

    An honest collaborator holds one of each at most, plus one while the aggregator has
    not yet noticed that a lost connection is gone (a reconnecting task stream, a retried
    upload or download); two of each leave room for that and nothing more.
    """

    task_streams: int = 2
    uploads: int = 2
    downloads: int = 2

    def limit(self, kind: Hold) -> int:
        """How many holds of `kind` one name may have at once."""
        return {Hold.TASK_STREAM: self.task_streams, Hold.UPLOAD: self.uploads, Hold.DOWNLOAD: self.downloads}[kind]

    @property
    def per_peer(self) -> int:
        """Worker threads one name can hold at once."""
        return self.task_streams + self.uploads + self.downloads


def worker_threads(collaborators: int, limits: PeerLimits = PeerLimits()) -> int:
    """The gRPC pool size for a roster of `collaborators` names: all of them at their limits, plus headroom."""
    return collaborators * limits.per_peer + HEADROOM_THREADS


class Quotas:
    """Counts each caller's open long-held requests and refuses one over its limit (thread-safe)."""

    def __init__(self, limits: PeerLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._held: Counter[tuple[str, Hold]] = Counter()

    @contextmanager
    def hold(self, peer: str, kind: Hold) -> Iterator[None]:
        """Count one request of `kind` by `peer` while it runs, or raise RefusedError (OVER_LIMIT) at once."""
        key = (peer, kind)
        with self._lock:
            if self._held[key] >= self.limits.limit(kind):
                raise RefusedError(Refusal.OVER_LIMIT, BUSY)
            self._held[key] += 1
        try:
            yield
        finally:
            with self._lock:
                self._held[key] -= 1
                if not self._held[key]:
                    del self._held[key]

    def held(self, peer: str, kind: Hold) -> int:
        """How many requests of `kind` `peer` has open now."""
        with self._lock:
            return self._held[(peer, kind)]


class RefusalLog(LineBudget):
    """Which refusals get their own line and ``refusal`` event: 20 per caller, then one a second."""

    def __init__(self, rate: RateLimit | None = None) -> None:
        super().__init__(rate or RateLimit(per_second=1.0, burst=20))


PRESENCE_BURST = 4
"""Connect and disconnect lines a collaborator gets at once: its arrival, and a couple of honest reconnects."""

PRESENCE_SECONDS = 60.0
"""Then one line per this many seconds per collaborator: 500 reconnects in a minute add a handful of lines."""


class Presence:
    """Each collaborator's arrival and departure as the operator sees them.

    One line and a ``connect`` / ``disconnect`` event each, within a :class:`LineBudget` per collaborator
    (PRESENCE_BURST at once, then one per PRESENCE_SECONDS), the skipped ones counted on its next line
    (thread-safe).
    """

    def __init__(self, events: EventLog | None, rate: RateLimit | None = None) -> None:
        self.events = events
        self.budget = LineBudget(rate or RateLimit(per_second=1.0 / PRESENCE_SECONDS, burst=PRESENCE_BURST))
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._gone: set[str] = set()

    def arrived(self, peer: str, connected: Callable[[], int], allowed: int) -> None:
        """`peer` opened a task stream.

        A line on its first contact with this process or its return after it left; `connected()` counts the
        collaborators with a task stream.
        """
        with self._lock:
            first, back = peer not in self._seen, peer in self._gone
            self._seen.add(peer)
            self._gone.discard(peer)
        unlogged = self.budget.admit(peer) if first or back else None
        if unlogged is None:
            return
        how = "connected" if first else "reconnected"
        logger.info(
            "%s %s (%d of %d collaborators have a task stream)%s", peer, how, connected(), allowed, _note(unlogged)
        )
        if self.events is not None:
            self.events.emit("connect", name=peer)

    def departed(self, peer: str) -> None:
        """The last task stream of `peer` ended."""
        with self._lock:
            self._gone.add(peer)
        unlogged = self.budget.admit(peer)
        if unlogged is None:
            return
        logger.info("%s disconnected%s", peer, _note(unlogged))
        if self.events is not None:
            self.events.emit("disconnect", name=peer)


def _note(unlogged: int) -> str:
    return f" ({unlogged} more connects and disconnects of it since its last line were not logged)" if unlogged else ""
