"""A model whose round was voided after its sum was unmasked: only the same survivors can train on it again.

Verified aggregation (docs/security.md) voids a round whose sum nobody could verify after it was unmasked: tags that
do not add up, or, on a SecAgg+ graph (not :func:`~fedfair.secagg.resum.resum_decides`), a survivor silent after
masking. On the complete graph a silent survivor voids nothing, below RESUMMED_WORDS or above it (there every other
survivor re-sums that round from the tag set). A bounded sum's round void once its shares were asked for
(a site lost before its tags) binds its whole roster the same way. The model stays; without noise in the sum every
site of it re-sends its kept input on it, signed for the same survivors only (differencing). So the next round
runs with exactly those survivors once all are connected (one wait: a round timeout, or a restarting survivor's
start allowance, :mod:`.starts`), or is void at once naming who is missing, and the federation ends in bounded
time. Under ``[privacy] mode = "distributed"`` each input is one round's charged release: the next round trains
afresh with whoever is connected, and no survivor set is kept (``InputRecord.view(..., one_round=True)``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from fedfair.core.errors import RoundAbortedError
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.observe.events import EventLog

logger = logging.getLogger("fedfair.aggregator")


@dataclass
class Voided:
    """The round whose unmasked sum was voided, its survivors (by name) and why."""

    round: int
    survivors: frozenset[str]
    reason: str
    waited: bool = False
    """Whether a round already waited a round timeout for the missing survivors (later rounds do not)."""


class BoundSurvivors:
    """The survivors the current model is bound to, after a round voided once its sum was unmasked."""

    def __init__(self) -> None:
        self.voided: Voided | None = None

    def note(self, round_number: int, survivors: frozenset[str], reason: str) -> None:
        """Round `round_number`'s sum over `survivors` was unmasked, then voided (the model is unchanged)."""
        if self.voided is None or not self.voided.survivors == survivors:
            self.voided = Voided(round_number, survivors, reason)

    def clear(self) -> None:
        """A round was applied: the model moved, and no site's input is bound to a survivor set any more."""
        self.voided = None

    def participants(
        self, board: Board, round_number: int, connected: frozenset[str], timeout: float, events: EventLog | None = None
    ) -> frozenset[str]:
        """Who takes part in `round_number`: `connected`, or exactly the bound survivors.

        The one wait for missing survivors lasts `timeout` seconds, or while one of them is starting, up to the
        end of its start allowance (:mod:`fedfair.runtime.aggregator.starts`).

        A wait for missing survivors is a ``waiting`` event in `events` too (the round's own event ends it).

        Raises:
            RoundAbortedError: some bound survivors are not connected (after one wait of `timeout` seconds for
                them, in the first round that misses them): the round is void, naming the voided round and them.
        """
        voided = self.voided
        if voided is None:
            return connected
        present = voided.survivors & connected
        if present != voided.survivors and not voided.waited:
            voided.waited = True
            # A survivor restarting (its stream ended, or it fetched the plan) is given its start's allowance.
            until, _ = board.starts.until(voided.survivors - present, timeout)
            timeout = max(timeout, until - time.monotonic())
            logger.warning(
                "round %d: waiting up to %.0f s for %s: round %d's sum over %s was unmasked but voided (%s), and "
                "every site's input on this model is bound to those survivors",
                round_number,
                timeout,
                ", ".join(sorted(voided.survivors - present)),
                voided.round,
                ", ".join(sorted(voided.survivors)),
                voided.reason,
            )
            if events is not None:
                events.emit(
                    "waiting",
                    round=round_number,
                    goal=f"round {voided.round}'s survivors",
                    connected=len(present),
                    eligible=len(voided.survivors),
                    missing=sorted(voided.survivors - present),
                    seconds_left=timeout,
                )
            present = board.wait_for_connected(len(voided.survivors), timeout, among=voided.survivors)
        missing = sorted(voided.survivors - present)
        if missing:
            raise RoundAbortedError(
                f"round {voided.round}'s sum over {', '.join(sorted(voided.survivors))} was unmasked but voided "
                f"({voided.reason}); every site's input on this model is bound to those survivors, and "
                f"{', '.join(missing)} is not connected: a round without it would let two sums be subtracted, "
                "so no round can apply until it returns"
            )
        return voided.survivors
