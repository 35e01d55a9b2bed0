"""Who is starting, and how long a start takes here: what a quorum wait must cover before it gives up.

A restarted collaborator is away for as long as its process takes to start (imports, plan, data, trainer),
which on a loaded machine can outlast a round timeout. So a collaborator counts as *starting* from the end of
its last task stream of this process (or its plan fetch, if it had none) until a stream of it opens again,
and each such start is measured. A wait short of the quorum goes on while a starting collaborator is within
its allowance (:meth:`Starts.until`): the longest of :data:`START_FLOOR_SECONDS`, the round timeout and
:data:`START_FACTOR` x the longest start measured in this process, at most :data:`START_CEILING_SECONDS`.
Why: docs/operations.md, "When a collaborator restarts".
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

START_FLOOR_SECONDS = 120.0
"""What a start is allowed before one was measured: a collaborator's imports, plan, data and trainer on a loaded
two-core machine, with room to spare."""

START_FACTOR = 3.0
"""A start is allowed this many times the longest start measured in this process (the machine may be busier)."""

START_CEILING_SECONDS = 1800.0
"""The most a start is allowed, however long one took: a site gone for good holds a wait no longer than this."""


class Starts:
    """When each collaborator's start began (its task stream ended, or it fetched the plan without one)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._began: dict[str, float] = {}
        self._longest = 0.0
        """The longest start measured in this process: from its beginning to the task stream it opened."""

    def left(self, peer: str) -> None:
        """`peer`'s last task stream ended: it is starting again from now, if it comes back."""
        with self._lock:
            self._began[peer] = self._clock()

    def fetched_plan(self, peer: str, streaming: bool) -> None:
        """`peer` fetched the plan; without a task stream (`streaming`), that is the first sign of its start."""
        if not streaming:
            with self._lock:
                self._began.setdefault(peer, self._clock())

    def streaming(self, peer: str) -> None:
        """A task stream of `peer` opened: its start, if one began, is over and measured."""
        with self._lock:
            began = self._began.pop(peer, None)
            if began is not None:
                self._longest = max(self._longest, self._clock() - began)

    def allowance(self, round_timeout: float) -> float:
        """Seconds a start is allowed now (the module's rule), for a plan of `round_timeout` seconds."""
        with self._lock:
            measured = START_FACTOR * self._longest
        return min(max(START_FLOOR_SECONDS, round_timeout, measured), START_CEILING_SECONDS)

    def until(self, peers: Iterable[str], round_timeout: float) -> tuple[float, list[str]]:
        """Until when (on the clock) some of `peers` may still be starting, and who: (0.0, []) when none may be."""
        allowance = self.allowance(round_timeout)
        now = self._clock()
        with self._lock:
            ends = {peer: self._began[peer] + allowance for peer in peers if peer in self._began}
        starting = sorted(peer for peer, end in ends.items() if end > now)
        return max((ends[peer] for peer in starting), default=0.0), starting
