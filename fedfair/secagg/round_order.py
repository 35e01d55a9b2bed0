"""The one guard of a round's order: where a party, and the server, stand in a kind of round's stages.

Whoever runs a round (the in-process simulation, the aggregator's driver, the collaborator's steps, the auditor)
takes each step of a :class:`~fedfair.secagg.round.SecureRound`'s stages through :class:`PartyOrder` or
:class:`ServerOrder`, which refuse a stage out of its order: the stages' state machines keep no order of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fedfair.core.errors import ProtocolError, StaleMessageError
from fedfair.secagg.round import AnyStage, SecureRound

_Result = TypeVar("_Result")


class PartyOrder:
    """Where one party stands in its round's stages: the one guard of the order a party takes them in.

    The state machines keep no order of their own; whoever runs a party's steps takes each through this, so a
    server that sends a stage's input out of the declared order is refused. A party takes a stage once every
    stage before it was taken (or is :attr:`~fedfair.secagg.round.StageSpec.skippable`), and once only unless it is
    :attr:`~fedfair.secagg.round.StageSpec.repeatable`. A step that raises leaves the party where it was.
    """

    def __init__(self, stages: tuple[AnyStage, ...]) -> None:
        self._stages = stages
        self._taken: set[int] = set()

    def take(self, spec: AnyStage, step: Callable[[], _Result]) -> _Result:
        """Run `step`, the party's step of `spec`, if the party may take that stage now.

        Raises:
            ProtocolError: `spec` is out of order (naming the stage the party waits for), or not of this round.
        """
        index = _index(self._stages, spec)
        before = self._stages[:index]
        ready = all(earlier in self._taken or spec_before.skippable for earlier, spec_before in enumerate(before))
        if not ready or (index in self._taken and not spec.repeatable):
            waiting = next((s.stage.name for i, s in enumerate(self._stages) if i not in self._taken), "none")
            raise ProtocolError(
                f"stage {spec.stage.name} ({spec.wire}) is out of order: this party is waiting for stage {waiting}"
            )
        outcome = step()
        self._taken.add(index)
        return outcome


class ServerOrder:
    """Where the server's round stands in its stages: the one guard of the order the server runs them in.

    A round is opened (:meth:`begin`), then each stage takes uploads until it is closed, and its close opens the
    next; the sum's last close (:meth:`~fedfair.secagg.round.SecureSum.finish`) opens nothing, and the verifying stages begin with
    :meth:`verify`. An upload for any other stage is stale; a close that raises aborts the round, after which
    nothing is taken.
    """

    def __init__(self, round_kind: SecureRound, verified: bool) -> None:
        self._sum = len(round_kind.sum_stages)
        self._stages = round_kind.stages(verified)
        self._open: int | None = None
        self._closed = 0
        self._aborted = False

    @property
    def where(self) -> str:
        """The stage the server collects uploads for, or where the round stands between and after its stages."""
        if self._aborted:
            return "aborted"
        if self._open is not None:
            return self._stages[self._open].stage.name
        if self._closed == 0:
            return "not begun"
        return "finished" if self._closed == self._sum else "closed"

    def begin(self) -> None:
        """Open the round's first stage."""
        self._opening(0)

    def verify(self) -> None:
        """Open the first verifying stage, once the sum is finished."""
        self._opening(self._sum)

    def is_open(self, spec: AnyStage) -> bool:
        """Whether `spec` is the stage the server collects uploads for."""
        return not self._aborted and self._open is not None and self._stages[self._open] is spec

    def receive(self, spec: AnyStage, message: object, step: Callable[[], None]) -> None:
        """Run `step`, the server's receive of `message` in `spec`, if that stage is open.

        Raises:
            StaleMessageError: `spec` is not the open stage (the message is dropped).
            ProtocolError: the round was aborted.
        """
        self._refuse_aborted()
        if not self.is_open(spec):
            raise StaleMessageError(
                f"{type(message).__name__} arrived while the server is in stage {self.where}; it was dropped"
            )
        step()

    def close(self, spec: AnyStage, step: Callable[[], _Result]) -> _Result:
        """Run `step`, the server's close of `spec`, if that stage is open; then open the stage after it.

        The sum's last close and the round's open nothing: the verifying stages begin with :meth:`verify`.

        Raises:
            ProtocolError: `spec` is not the open stage, or the round was aborted; whatever `step` raises, which
                aborts the round.
        """
        self._refuse_aborted()
        if not self.is_open(spec):
            raise ProtocolError(f"called out of order: the server is in stage {self.where}")
        try:
            outcome = step()
        except ProtocolError:
            self._aborted = True
            raise
        self._closed += 1
        self._open = self._closed if self._closed not in (self._sum, len(self._stages)) else None
        return outcome

    def _opening(self, index: int) -> None:
        self._refuse_aborted()
        if self._open is not None or self._closed != index or index >= len(self._stages):
            raise ProtocolError(f"called out of order: the server is in stage {self.where}")
        self._open = index

    def _refuse_aborted(self) -> None:
        if self._aborted:
            raise ProtocolError("this round was aborted; start a new round")


def _index(stages: tuple[AnyStage, ...], spec: AnyStage) -> int:
    for index, known in enumerate(stages):
        if known is spec:
            return index
    raise ProtocolError(f"stage {spec.wire} is not a stage of this round")
