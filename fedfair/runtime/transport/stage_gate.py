"""Binding every message to (federation id, round, stage); refusing replays and late messages.

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
from typing import NoReturn

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


def make_binding(federation_id: str, round_number: int, stage: pb.Stage) -> pb.Binding:
    """The binding of a message to one federation, round and stage."""
    return pb.Binding(federation_id=federation_id, round=round_number, stage=stage)


def describe_binding(binding: pb.Binding) -> str:
    """For logs: 'round 3 STAGE_MASKED_INPUT' (never a peer's name)."""
    try:
        stage = pb.Stage.Name(binding.stage)
    except ValueError:
        stage = f"stage {binding.stage}"
    return f"round {binding.round} {stage}"


def _refuse() -> NoReturn:
    raise RefusedError(Refusal.NOT_EXPECTED, NOT_EXPECTED)


class StageGate:
    """The open (round, stage) of one federation, and who has already uploaded to it.

    Thread-safe: gRPC servicer methods run on a thread pool.
    """

    def __init__(self, federation_id: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.federation_id = federation_id
        self._clock = clock
        self._lock = threading.Lock()
        self._open: pb.Binding | None = None
        self._last: tuple[int, int] = (0, pb.STAGE_UNSPECIFIED)
        self._deadline: float | None = None
        self._expected = _Expected(None, set())
        self._closed: dict[tuple[int, int], _Expected] = {}
        """The stages closed in this round and the one before, each with who it still awaited then: their uploads
        are late, not foreign. A stage that closes on enough answers is followed at once by the next ones, so an
        honest participant's answer may come a stage or two on (round r's unmask as the evaluation's keys open)."""

    @property
    def current(self) -> pb.Binding | None:
        """The open stage's binding, or None when no stage is open."""
        with self._lock:
            return None if self._open is None else make_binding(self.federation_id, self._open.round, self._open.stage)

    def open(
        self,
        round_number: int,
        stage: pb.Stage,
        *,
        timeout_seconds: float | None = None,
        participants: Iterable[str] | None = None,
    ) -> pb.Binding:
        """Open a stage strictly after every stage opened before; return its binding.

        ``participants`` (if given) are the only peers admitted to upload, e.g. the
        survivors of the previous secure-aggregation stage.
        """
        if stage == pb.STAGE_UNSPECIFIED or stage not in pb.Stage.values():
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
            self._last = (round_number, pb.STAGE_UNSPECIFIED)

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
                    raise RefusedError(Refusal.LATE, NOT_EXPECTED, stage=describe_binding(binding))
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
        closed = self._closed.get((binding.round, binding.stage))
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
                or binding.stage == pb.STAGE_UNSPECIFIED
                or binding.stage > self._last[1]
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
