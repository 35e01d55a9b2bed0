"""How a collaborator survives a lost aggregator: bounded, jittered back-off, and one-line failures.

An unavailable aggregator is retried with jittered exponential back-off a bounded
number of times (peers that lost it together do not all come back at once), and the
wait ends early when the collaborator is asked to stop; nothing waits on a fixed
sleep. Any other gRPC failure becomes one actionable line (:func:`refusal`).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from fedfair.core.errors import ConfigError, FedfairError

logger = logging.getLogger("fedfair.collaborator")

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
"""Transient: the aggregator is down, or still holds this collaborator's previous stream (it
allows two per name) until it notices the old connection is gone."""

_T = TypeVar("_T")


class AggregatorUnreachable(FedfairError):
    """The aggregator could not be reached within the retry bound."""


@dataclass(frozen=True)
class RetryPolicy:
    """Jittered exponential back-off: attempt k waits uniform(0.5, 1) * min(cap, base * 2^k)."""

    attempts: int = 8
    base_seconds: float = 0.5
    cap_seconds: float = 15.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.5, 1.0) * min(self.cap_seconds, self.base_seconds * 2.0**attempt)


DEFAULT_RETRY_POLICY = RetryPolicy()


class Backoff:
    """One collaborator's waits between attempts; `stop` (set from another thread) cuts them short."""

    def __init__(self, policy: RetryPolicy, name: str, stop: threading.Event) -> None:
        self.policy = policy
        self.name = name
        self.stop = stop
        self.random = random.Random()

    def wait(self, attempt: int, why: str) -> None:
        delay = self.policy.delay(attempt, self.random)
        logger.info("%s: %s; retrying in %.1f s", self.name, why, delay)
        self.stop.wait(delay)

    def call(self, what: str, call: Callable[[], _T]) -> _T:
        """`call()`, retried with back-off while the aggregator is unavailable."""
        for attempt in range(self.policy.attempts + 1):
            try:
                return call()
            except grpc.RpcError as error:
                if error.code() not in RETRYABLE or attempt == self.policy.attempts or self.stop.is_set():
                    raise refusal(error, what) from None
                self.wait(attempt, f"the aggregator is unavailable while {what}")
        raise AssertionError("unreachable: the loop returns or raises")


def refusal(error: grpc.RpcError, what: str) -> FedfairError:
    """A gRPC failure as one actionable line."""
    code = error.code()
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return ConfigError(
            f"the aggregator refused this collaborator while {what}: its certificate is not on the plan's "
            "allow-list or not from the federation's CA; ask the operator"
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return AggregatorUnreachable(
            f"the aggregator is unreachable while {what} ({error.details()}); check the address, that it "
            "runs, and that its certificate name matches aggregator_name"
        )
    return FedfairError(f"the aggregator answered {code.name} while {what}: {error.details()}")
