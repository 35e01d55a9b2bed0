"""How much of the aggregator one caller may hold: long requests counted per certified name, and
refusals logged at a bounded rate, so no caller can starve the others or flood the operator's log.

The servicer (:mod:`fedfair.runtime.aggregator.servicer`) applies these to every RPC; the gRPC
pool is sized by :func:`worker_threads` so that every listed collaborator at its limits still
leaves threads for the short requests.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

import grpc

from fedfair.runtime.transport import Rejected

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
        """Count one request of `kind` by `peer` while it runs, or raise Rejected(RESOURCE_EXHAUSTED) at once."""
        key = (peer, kind)
        with self._lock:
            if self._held[key] >= self.limits.limit(kind):
                raise Rejected(grpc.StatusCode.RESOURCE_EXHAUSTED, BUSY)
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


class RateLimit:
    """A token bucket per key: `burst` at once, then `per_second` on average.

    The keys are certified names (and one key shared by every caller without a listed name),
    so the buckets never outnumber the plan's allow-list.
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


class RefusalLog:
    """Which refusals get their own log line and ``refusal`` event: a burst per caller, then a rate.

    Every refusal still refuses; a caller that keeps sending what must be refused (a broken
    client in a loop, or one flooding on purpose) would otherwise fill the operator's log and
    events file at the speed of its network. The refusals not logged are counted per caller,
    and the count rides on that caller's next logged line, so none goes unaccounted for.
    """

    UNIDENTIFIED = ""
    """The one key of every caller refused before it was identified (no name from the allow-list)."""

    def __init__(self, rate: RateLimit | None = None) -> None:
        self.rate = rate or RateLimit(per_second=1.0, burst=20)
        self._lock = threading.Lock()
        self._unlogged: Counter[str] = Counter()

    def admit(self, peer: str | None) -> int | None:
        """None if this refusal of `peer` goes unlogged (it is counted); otherwise how many went
        unlogged since that caller's last logged refusal."""
        key = self.UNIDENTIFIED if peer is None else peer
        with self._lock:
            if not self.rate.allow(key):
                self._unlogged[key] += 1
                return None
            return self._unlogged.pop(key, 0)
