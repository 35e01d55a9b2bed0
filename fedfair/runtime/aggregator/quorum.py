"""Waiting for collaborators: who is connected, the quorum, and what to do when it is not reached.

Before the first round of a process the aggregator waits for the plan's quorum with no
deadline (as Flower waits for ``min_available_clients``), naming every
:data:`WAIT_REPORT_SECONDS` who it still waits for; later rounds wait up to the round
timeout. A wait that would end short of the quorum goes on while a collaborator that may bring it back
is starting, for as long as a start is allowed (:mod:`fedfair.runtime.aggregator.starts`: the longest of
120 s, the round timeout and three times the longest start measured in this process): a restarted
site rejoins however long its start takes on a loaded machine. :class:`~fedfair.core.errors.QuorumError`
carries advice that depends on whether a checkpoint exists. A bounded round first waits for the plan's auditor
under the same deadlines (:func:`wait_for_auditor`): opened without it, the round would abort at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fedfair.core.errors import QuorumError, QuorumReason
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.plan.learning_settings import QuorumSettings

logger = logging.getLogger("fedfair.aggregator")

WAIT_REPORT_SECONDS = 10.0
"""How often a waiting aggregator names the collaborators it still waits for."""


@dataclass(frozen=True)
class WaitGoal:
    """What a wait is for.

    `count` of the `eligible` collaborators connected within `timeout` (None: no deadline), before round
    `round_number`; `goal` names it in the log ("the quorum", "everyone").
    """

    round_number: int
    count: int
    eligible: frozenset[str]
    timeout: float | None
    goal: str


def wait_for(
    board: Board,
    wait: WaitGoal,
    min_collaborators: int,
    *,
    checkpoint_round: Callable[[], int | None],
    output: Path,
    round_timeout: float,
    events: EventLog | None = None,
) -> frozenset[str]:
    """Wait until `wait.count` of `wait.eligible` are connected, naming who is missing every WAIT_REPORT_SECONDS.

    Return who is connected then. Each time it names them it also writes a ``waiting`` event to `events`, which
    ``fedfair status``, the status page and the metrics read.

    When the time is up with fewer than `min_collaborators` connected, the wait goes on while a missing
    collaborator is starting, up to the end of its start allowance (:meth:`Starts.until
    <fedfair.runtime.aggregator.starts.Starts.until>`, whose floor is the plan's `round_timeout`).

    Raises QuorumError (NOT_REACHED) if that is below `min_collaborators` when the time is up; its advice
    names the checkpoint of round `checkpoint_round()` in `output` when one is kept (None: none;
    asked only then, as a loop has no checkpoint before its statistics aggregation).
    """
    deadline = None if wait.timeout is None else time.monotonic() + wait.timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        step = WAIT_REPORT_SECONDS if left is None else max(min(WAIT_REPORT_SECONDS, left), 0.0)
        connected = board.wait_for_connected(wait.count, step, among=wait.eligible)
        if len(connected) >= wait.count or board.closed:
            break
        if left is not None and left <= step:
            extended = _start_deadline(board, wait, connected, min_collaborators, round_timeout)
            if extended is None or extended <= (deadline or 0.0):
                break
            deadline = extended
            continue
        missing = sorted(wait.eligible - connected)
        seconds_left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        logger.info(
            "round %d: waiting for %s: %d of %d collaborators connected, missing %s; %s",
            wait.round_number,
            wait.goal,
            len(connected),
            len(wait.eligible),
            ", ".join(missing),
            "no deadline" if seconds_left is None else f"{seconds_left:.0f} s left",
        )
        if events is not None:
            events.emit(
                "waiting",
                round=wait.round_number,
                goal=wait.goal,
                connected=len(connected),
                eligible=len(wait.eligible),
                missing=missing,
                seconds_left=None if seconds_left is None else round(seconds_left, 1),
            )
    if len(connected) < min_collaborators:
        raise QuorumError(
            QuorumReason.NOT_REACHED, quorum_failure(wait, connected, min_collaborators, checkpoint_round(), output)
        )
    return connected


def _start_deadline(
    board: Board, wait: WaitGoal, connected: frozenset[str], min_collaborators: int, round_timeout: float
) -> float | None:
    """Until when a wait short of the quorum goes on for missing collaborators that are starting (None: it ends)."""
    if len(connected) >= min_collaborators:
        return None
    until, starting = board.starts.until(wait.eligible - connected, round_timeout)
    if not starting:
        return None
    logger.warning(
        "round %d: %d of %d collaborators connected, below the quorum of %d; waiting up to %.0f s more for %s, "
        "which %s starting (a start is allowed %.0f s here)",
        wait.round_number,
        len(connected),
        len(wait.eligible),
        min_collaborators,
        until - time.monotonic(),
        ", ".join(starting),
        "is" if len(starting) == 1 else "are",
        board.starts.allowance(round_timeout),
    )
    return until


def quorum_failure(
    wait: WaitGoal, connected: frozenset[str], min_collaborators: int, checkpoint_round: int | None, output: Path
) -> str:
    """The message of a QuorumError (NOT_REACHED), with the advice that works from where the run stands."""
    missing = ", ".join(sorted(wait.eligible - connected)) or "none"
    what = (
        f"round {wait.round_number}: only {len(connected)} of the {len(wait.eligible)} collaborators connected "
        f"within {wait.timeout or 0:g} s, below the quorum of {min_collaborators} (missing: {missing})"
    )
    if checkpoint_round is not None:
        return (
            f"{what}. The checkpoint of round {checkpoint_round} is kept in {output}: start the "
            "missing collaborators (their logs say why they stopped), then restart the aggregator with "
            "--resume"
        )
    return (
        f"{what}. Nothing was trained yet. Check that the missing collaborators are running, dial this "
        "aggregator's address, and hold certificates from this federation's CA with the names listed in "
        "[federation] collaborators (their logs say why they cannot connect); then start the aggregator "
        "again, without --resume (there is no checkpoint yet), and without --startup-timeout to wait for "
        "them as long as it takes"
    )


def participants(
    board: Board,
    quorum: QuorumSettings,
    collaborators: frozenset[str],
    excluded: Mapping[str, str],
    round_number: int,
    *,
    wait_for_everyone: bool,
    startup_timeout: float,
    checkpoint_round: Callable[[], int | None],
    output: Path,
    events: EventLog | None = None,
    auditor: str | None = None,
) -> frozenset[str]:
    """Who takes part in round `round_number`.

    The plan's `collaborators` but the `excluded`, with a live task stream, at least the quorum of them.

    With `wait_for_everyone` (the first round of a process) it waits for the quorum under the start-up
    rules (`startup_timeout` seconds, 0: no deadline), then for the rest up to the round timeout; later
    rounds wait up to the round timeout for the quorum and start with whoever is there. A bounded round's
    `auditor` (None: the round has none) is waited for first, under the same deadline as the quorum
    (:func:`wait_for_auditor`). The ``round_start`` event to `events` says the wait is over.
    """
    eligible = collaborators - excluded.keys()
    if len(eligible) < quorum.min_collaborators:
        raise QuorumError(
            QuorumReason.LOST,
            f"round {round_number}: {len(excluded)} collaborators are excluded "
            f"({', '.join(sorted(excluded))}), which leaves {len(eligible)}, below the quorum of "
            f"{quorum.min_collaborators}; the federation cannot go on with this plan (see rounds.jsonl for "
            "why they were excluded)",
        )

    def wait(count: int, timeout: float | None, goal: str) -> frozenset[str]:
        goal_ = WaitGoal(round_number, count, eligible, timeout, goal)
        return wait_for(
            board,
            goal_,
            quorum.min_collaborators,
            checkpoint_round=checkpoint_round,
            output=output,
            round_timeout=quorum.round_timeout_seconds,
            events=events,
        )

    if auditor is not None:
        timeout = (startup_timeout or None) if wait_for_everyone else quorum.round_timeout_seconds
        wait_for_auditor(board, auditor, round_number, timeout, quorum.round_timeout_seconds, events)
    if wait_for_everyone:
        wait(quorum.min_collaborators, startup_timeout or None, "the quorum")
        connected = wait(len(eligible), quorum.round_timeout_seconds, "everyone")
    else:
        connected = wait(quorum.min_collaborators, quorum.round_timeout_seconds, "the quorum")
    missing = eligible - connected
    if missing:
        logger.info(
            "round %d starts with %d of %d collaborators; missing %s",
            round_number,
            len(connected),
            len(eligible),
            ", ".join(sorted(missing)),
        )
    if events is not None:
        events.emit("round_start", round=round_number, participants=sorted(connected))
    return connected


def wait_for_auditor(
    board: Board,
    auditor: str,
    round_number: int,
    timeout: float | None,
    round_timeout: float,
    events: EventLog | None = None,
) -> None:
    """Wait until the plan's `auditor` holds a task stream, naming it every WAIT_REPORT_SECONDS.

    `timeout` bounds the wait (None: no deadline), as the quorum wait of the same round is bounded; while the
    auditor is starting again (its stream ended in this process) the wait goes on up to its start allowance, as
    for a restarting collaborator. Each time it names the auditor it writes a ``waiting`` event to `events`.

    Raises:
        QuorumError: NOT_REACHED, naming the auditor and the command that starts it, when the time is up.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while not board.closed and auditor not in board.following():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0.0:
            until, starting = board.starts.until([auditor], round_timeout)
            if not starting or until <= (deadline or 0.0):
                raise QuorumError(QuorumReason.NOT_REACHED, auditor_missing(auditor, round_number, timeout or 0.0))
            deadline = until
            continue
        step = WAIT_REPORT_SECONDS if left is None else min(WAIT_REPORT_SECONDS, left)
        if board.wait_for_follower(auditor, step):
            break
        seconds_left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        logger.info(
            "round %d: waiting for the auditor %s (a bounded round runs only with it; start "
            "`fedfair auditor start --config %s/auditor.toml` in init's layout); %s",
            round_number,
            auditor,
            auditor,
            "no deadline" if seconds_left is None else f"{seconds_left:.0f} s left",
        )
        if events is not None:
            events.emit(
                "waiting",
                round=round_number,
                goal="the auditor",
                connected=0,
                eligible=1,
                missing=[auditor],
                seconds_left=None if seconds_left is None else round(seconds_left, 1),
            )


def auditor_missing(auditor: str, round_number: int, timeout: float) -> str:
    """The message of the QuorumError of an auditor that did not connect within `timeout` seconds."""
    return (
        f"round {round_number}: the plan's auditor {auditor} did not connect within {timeout:g} s, and a bounded "
        f"round runs only with it. Start it (`fedfair auditor start --config {auditor}/auditor.toml` in init's "
        "layout; check its certificate, the manifest and this aggregator's address: its log says why it cannot "
        "connect), then restart the aggregator (with --resume if a checkpoint is kept)"
    )
