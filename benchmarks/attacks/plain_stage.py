"""The stage the plain federation's insider holds open, and what every attack on it shares.

:class:`InsiderStage` is the part of :class:`~attacks.plain_attacks.PlainAttacks` that the attack rows of
:mod:`attacks.door_attacks` and :mod:`attacks.flood_attacks` use: the run's parties and the insider's uploads to
the open MASKED_INPUT stage (:class:`StageContext`), each refusal judged by :func:`refused`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attacks.federation import HONEST, INSIDER, STRANGER, AggregatorProcess, AttackCredentials, exact_update
from attacks.hostile_client import Answer, TaskFollower, plain_payload, submit
from attacks.rows import RowBook
from fedfair.runtime.transport import fedfair_pb2 as pb

LEAK_MARKERS = ("Traceback", "Exception", "Error", 'File "', *HONEST, INSIDER, STRANGER)
"""What a refusal's details must never contain: exception text or anyone's name."""
REFUSED_AT_DOOR = ("UNAVAILABLE", "PERMISSION_DENIED")


@dataclass(frozen=True)
class Sizes:
    """How hard the run pushes (the full run, or --quick)."""

    fuzz_messages: int
    fuzz_rounds: int
    starvation_seconds: float
    flood_connections: int
    flood_seconds: float
    streams: int = 50

    @classmethod
    def of(cls, quick: bool, fuzz_messages: int | None) -> Sizes:
        if quick:
            return cls(fuzz_messages or 500, 1, 2.0, 200, 2.0)
        return cls(fuzz_messages or 10_000, 8, 6.0, 1000, 5.0)


def generic(answer: Answer) -> bool:
    """Whether a refusal says nothing about who takes part or what failed inside the aggregator."""
    return not any(marker in answer.details for marker in LEAK_MARKERS)


def refused(answer: Answer, codes: tuple[str, ...]) -> bool:
    """Whether the request was refused with one of `codes` and generic details (a failed TLS handshake's
    details are the client library's own, so they are not checked)."""
    return answer.code in codes and (answer.code == "UNAVAILABLE" or generic(answer))


@dataclass
class StageContext:
    """The stage the insider holds open, as its attacks see it."""

    task: pb.Task
    parameters: dict[str, Any]
    consumed: bool = False
    """Whether an upload to this stage was taken (the insider's slot is used up)."""

    @property
    def binding(self) -> pb.Binding:
        return self.task.binding

    @property
    def round(self) -> int:
        return int(self.task.binding.round)

    @property
    def dimension(self) -> int:
        return int(self.parameters["dimension"])

    @property
    def clip(self) -> float:
        return float(self.parameters["encoding"]["clip"])


Job = Callable[[StageContext], None]


class InsiderStage:
    """The insider's side of the plain federation, as its attack rows use it: the parties, the genuine update,
    and each upload to the open stage recorded (whether it used up the insider's slot, and what was taken).

    :class:`~attacks.plain_attacks.PlainAttacks` sets every attribute: its fields, and the rest as its run starts.
    """

    book: RowBook
    sizes: Sizes
    seed: int
    insider_uploads: dict[int, bytes | None]
    _genuine: dict[int, bytes]
    address: str
    credentials: AttackCredentials
    insider: TaskFollower
    aggregator: AggregatorProcess

    def _genuine_payload(self, context: StageContext) -> bytes:
        return self._genuine_payload_for(context.dimension - 1)

    @staticmethod
    def _genuine_payload_for(parameters: int) -> bytes:
        update = exact_update(INSIDER, parameters)
        return plain_payload(update.weighted_vector().numpy(), update.weight)

    def _upload(self, context: StageContext, messages: list[pb.Part]) -> Answer:
        """Submit as the insider to the open stage, keeping track of whether its slot was used up."""
        answer = submit(self.insider.channel, messages)
        if answer.ok and messages and messages[0].binding == context.binding:
            context.consumed = True
            receipt: pb.Receipt = answer.reply
            payload = b"".join(item.chunk.data for item in messages)
            self.insider_uploads[context.round] = payload if receipt.received_size == len(payload) else None
        return answer
