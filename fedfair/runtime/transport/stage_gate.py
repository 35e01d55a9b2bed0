"""Binding every message to (federation id, round, stage); refusing replays and late messages.

A stage on the wire is a :class:`WireStage`: its aggregation (JOIN, TRAIN, EVALUATE) and its step there, the
stage's place in its round kind's declaration (0: the aggregation's start). Stages are ordered by (round,
aggregation, step).

The aggregator opens stages one after another with a :class:`StageGate`. An upload
is admitted once per peer, only for the stage open now and before its deadline; a
read (Fetch, DownloadModel) only for the current round and a stage already opened.
Refusals are :class:`~fedfair.core.errors.RefusedError` errors with one generic message, so a caller learns
neither who else takes part nor which check failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, NoReturn

import grpc

from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.transport import fedfair_pb2 as pb
from fedfair.runtime.transport.chunks import DEFAULT_CHUNK_BYTES, read_payload

NOT_PERMITTED = "not permitted"
NOT_EXPECTED = "message refused: not expected for this federation, round and stage"


STATUS_CODES: dict[Refusal, grpc.StatusCode] = {
    Refusal.NOT_EXPECTED: grpc.StatusCode.FAILED_PRECONDITION,
    Refusal.LATE: grpc.StatusCode.FAILED_PRECONDITION,
    Refusal.NOT_PERMITTED: grpc.StatusCode.PERMISSION_DENIED,
    Refusal.OVER_LIMIT: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Refusal.ALREADY_CONNECTED: grpc.StatusCode.ALREADY_EXISTS,
    Refusal.INVALID_UPLOAD: grpc.StatusCode.INVALID_ARGUMENT,
}
"""The gRPC status a caller hears for each refusal of the aggregator's (the others are a collaborator's own)."""


def abort(refused: RefusedError, context: grpc.ServicerContext) -> NoReturn:
    """End the RPC with the refusal's status and its generic message (``context.abort`` raises)."""
    context.abort(STATUS_CODES[refused.reason], str(refused))
    raise AssertionError("unreachable: context.abort raises")


@dataclass(frozen=True)
class _Expected:
    """Who a stage admits: its participants (None: anyone) and who has uploaded so far."""

    participants: frozenset[str] | None
    submitted: set[str]

    def awaits(self, peer: str) -> bool:
        return (self.participants is None or peer in self.participants) and peer not in self.submitted


class WireStage(NamedTuple):
    """A stage as the wire binds it: its aggregation and its step there, ordered as the aggregator opens them.

    aggregation: JOIN, TRAIN or EVALUATE (proto/fedfair.proto's Stage).
    step: 0 for the aggregation's start (its download), k >= 1 for the k-th stage of its round kind's declaration
        (fedfair.runtime.contract.Stages names it).
    """

    aggregation: pb.Stage
    step: int = 0

    @classmethod
    def of(cls, binding: pb.Binding) -> WireStage:
        """The stage `binding` names."""
        return cls(binding.stage, binding.step)

    @property
    def known(self) -> bool:
        """Whether the aggregation is one this schema names (not STAGE_UNSPECIFIED nor an unknown number)."""
        return self.aggregation != pb.STAGE_UNSPECIFIED and self.aggregation in pb.Stage.values()

    def __str__(self) -> str:
        """'STAGE_TRAIN' for a start, 'STAGE_TRAIN step 4' for a stage of its round (a contract names it better)."""
        try:
            name = pb.Stage.Name(self.aggregation)
        except ValueError:
            name = f"stage {self.aggregation}"
        return f"{name} step {self.step}" if self.step else name


JOIN = WireStage(pb.STAGE_JOIN)
"""Joining: the plan's fetch (round 0), and where a collaborator's task stream starts."""
TRAIN = WireStage(pb.STAGE_TRAIN)
"""A training round's start: its model's download and the local steps."""
EVALUATE = WireStage(pb.STAGE_EVALUATE)
"""An evaluation's start: the model to evaluate."""
_NONE = WireStage(pb.STAGE_UNSPECIFIED)


def make_binding(federation_id: str, round_number: int, stage: WireStage) -> pb.Binding:
    """The binding of a message to one federation, round and stage."""
    return pb.Binding(federation_id=federation_id, round=round_number, stage=stage.aggregation, step=stage.step)


def describe_binding(binding: pb.Binding, name: Callable[[WireStage], str] = str) -> str:
    """For logs: 'round 3 STAGE_MASKED_INPUT' (never a peer's name), the stage as `name` calls it."""
    return f"round {binding.round} {name(WireStage.of(binding))}"


def _refuse() -> NoReturn:
    raise RefusedError(Refusal.NOT_EXPECTED, NOT_EXPECTED)


class StageGate:
    """The open (round, stage) of one federation, and who has already uploaded to it.

    Thread-safe: gRPC servicer methods run on a thread pool.
    """

    def __init__(
        self,
        federation_id: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        name: Callable[[WireStage], str] = str,
    ) -> None:
        self.federation_id = federation_id
        self._clock = clock
        self.name = name
        """What logs call a stage of this federation (its round kinds name them; the wire's numbers without)."""
        self._lock = threading.Lock()
        self._open: pb.Binding | None = None
        self._last: tuple[int, WireStage] = (0, _NONE)
        self._deadline: float | None = None
        self._expected = _Expected(None, set())
        self._closed: dict[tuple[int, WireStage], _Expected] = {}
        """The stages closed in this round and the one before, each with who it still awaited then: their uploads
        are late, not foreign. A stage that closes on enough answers is followed at once by the next ones, so an
        honest participant's answer may come a stage or two on (round r's unmask as the evaluation's keys open)."""

    @property
    def current(self) -> pb.Binding | None:
        """The open stage's binding, or None when no stage is open."""
        with self._lock:
            if self._open is None:
                return None
            return make_binding(self.federation_id, self._open.round, WireStage.of(self._open))

    def open(
        self,
        round_number: int,
        stage: WireStage,
        *,
        timeout_seconds: float | None = None,
        participants: Iterable[str] | None = None,
    ) -> pb.Binding:
        """Open a stage strictly after every stage opened before; return its binding.

        ``participants`` (if given) are the only peers admitted to upload, e.g. the
        survivors of the previous secure-aggregation stage.
        """
        if not stage.known:
            raise ValueError(f"cannot open stage {stage}")
        with self._lock:
            if (round_number, stage) <= self._last:
                raise ValueError(
                    f"stages only move forward: round {round_number} stage {stage} is not after {self._last}"
                )
            if self._open is not None:
                self._remember_closed(round_number)
            self._last = (round_number, stage)
            self._open = make_binding(self.federation_id, round_number, stage)
            self._deadline = None if timeout_seconds is None else self._clock() + timeout_seconds
            self._expected = _Expected(None if participants is None else frozenset(participants), set())
            return make_binding(self.federation_id, round_number, stage)

    def restart_at(self, round_number: int) -> None:
        """Let round `round_number`'s stages open again, all of them (the stage open now stays open until then).

        As a restarted aggregator process's gate would (a fresh gate admits any round); the running aggregator
        never moves back. It is the public seam through which a test or an attack replays a restart, or an
        aggregator that re-runs a round, without a new process.
        """
        with self._lock:
            self._last = (round_number, _NONE)

    def close(self) -> None:
        """No stage is open: every upload is refused until the next ``open``."""
        with self._lock:
            if self._open is not None:
                self._remember_closed(self._last[0])
            self._open = None

    def _remember_closed(self, current: int) -> None:
        """Lock held. Keep the open stage's awaited peers as closed; forget stages before round `current` - 1."""
        self._closed[self._last] = self._expected
        oldest = current - 1
        self._closed = {key: expected for key, expected in self._closed.items() if key[0] >= oldest}

    def submitted(self) -> frozenset[str]:
        """The peers admitted to upload to the open stage so far."""
        with self._lock:
            return frozenset(self._expected.submitted)

    def admit(self, binding: pb.Binding, peer: str) -> None:
        """Admit one upload by ``peer`` (a name from its certificate).

        Raises:
            RefusedError: :attr:`Refusal.LATE` when the stage it names (of this round or the one before) closed
                while still awaiting ``peer``, else :attr:`Refusal.NOT_EXPECTED`.

        The peer's slot for this stage is taken at once, so a concurrent or later
        duplicate is refused; :meth:`release` gives it back if the upload then fails.
        """
        with self._lock:
            expired = self._deadline is not None and self._clock() > self._deadline
            if self._open is None or binding != self._open or expired or not self._expected.awaits(peer):
                if self._late(binding, peer, expired):
                    raise RefusedError(Refusal.LATE, NOT_EXPECTED, stage=describe_binding(binding, self.name))
                _refuse()
            self._expected.submitted.add(peer)

    def _late(self, binding: pb.Binding, peer: str, expired: bool) -> bool:
        """Lock held.

        Whether a refused upload is one its stage awaited from `peer` but closed (or ran out of time) before it
        came: for the open stage past its deadline, or a stage closed in this round or the one before.
        """
        if binding.federation_id != self.federation_id:
            return False
        if binding == self._open:
            return expired and self._expected.awaits(peer)
        closed = self._closed.get((binding.round, WireStage.of(binding)))
        return closed is not None and closed.awaits(peer)

    def release(self, binding: pb.Binding, peer: str) -> None:
        """Undo ``admit`` for an upload that failed before it completed (so it may be retried)."""
        with self._lock:
            if self._open is not None and binding == self._open:
                self._expected.submitted.discard(peer)

    def check_federation(self, binding: pb.Binding) -> None:
        """Allow a request that needs only the right federation (GetPlan, WaitForTasks)."""
        if binding.federation_id != self.federation_id:
            _refuse()

    def check_read(self, binding: pb.Binding) -> None:
        """Allow a read for the current round at a stage already opened, or raise RefusedError."""
        with self._lock:
            if (
                binding.federation_id != self.federation_id
                or binding.round != self._last[0]
                or not WireStage.of(binding).known
                or WireStage.of(binding) > self._last[1]
            ):
                _refuse()


def receive_upload(
    parts: Iterable[pb.Part],
    gate: StageGate,
    peer: str,
    *,
    max_total_bytes: int,
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> tuple[pb.Binding, bytes]:
    """A Submit stream from ``peer``.

    Admitted by ``gate`` on its first part, before any data is buffered, then reassembled under the limits.
    Raises RefusedError (replay, late, foreign) or WireError (malformed); a failed upload frees the peer's slot.
    """
    admitted: list[pb.Binding] = []

    def admit(binding: pb.Binding) -> None:
        gate.admit(binding, peer)
        admitted.append(binding)

    try:
        return read_payload(parts, max_total_bytes=max_total_bytes, max_chunk_bytes=max_chunk_bytes, on_binding=admit)
    except BaseException:
        for binding in admitted:
            gate.release(binding, peer)
        raise
