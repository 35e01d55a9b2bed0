"""A bounded round waits for the plan's auditor as for its quorum (issue 80): it neither opens without it nor waits
past its deadline, and the error of an auditor that never came names it and the command that starts it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fedfair.core.errors import QuorumError, QuorumReason
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.quorum import participants, wait_for_auditor
from fedfair.runtime.plan.learning_settings import QuorumSettings
from fedfair.runtime.transport import fedfair_pb2 as pb

AUDITOR = "audit-co"
SITES = frozenset({"site-a", "site-b"})


def board_with_sites() -> Board:
    """A board whose sites follow the task stream and whose auditor (a verifier) does not yet."""
    board = Board("digest")
    board.verifiers = frozenset({AUDITOR})
    for site in SITES:
        board.connect(site, pb.Binding())
    return board


def test_the_round_starts_once_the_auditor_connects_and_not_before(tmp_path: Path) -> None:
    board = board_with_sites()
    connect_after = 0.5
    timer = threading.Timer(connect_after, board.connect, (AUDITOR, pb.Binding()))
    began = time.monotonic()
    timer.start()
    chosen = participants(
        board,
        QuorumSettings(min_collaborators=2, round_timeout_seconds=30.0),
        SITES,
        {},
        1,
        wait_for_everyone=True,
        startup_timeout=30.0,
        checkpoint_round=lambda: None,
        output=tmp_path,
        auditor=AUDITOR,
    )
    timer.join()
    assert chosen == SITES  # the auditor never counts as a participant
    assert time.monotonic() - began >= connect_after


def test_an_auditor_that_never_comes_ends_the_wait_at_its_deadline_naming_it_and_its_command() -> None:
    board = board_with_sites()
    timeout = 0.3
    began = time.monotonic()
    with pytest.raises(QuorumError) as caught:
        wait_for_auditor(board, AUDITOR, 3, timeout, round_timeout=30.0)
    assert time.monotonic() - began >= timeout
    assert caught.value.reason is QuorumReason.NOT_REACHED
    assert f"start it (`fedfair auditor start --config {AUDITOR}/auditor.toml`" in str(caught.value).lower()
    assert "round 3" in str(caught.value)


def test_a_restarting_auditor_is_waited_for_beyond_the_deadline_within_its_start_allowance() -> None:
    board = board_with_sites()
    board.connect(AUDITOR, pb.Binding())
    board.disconnect(AUDITOR)  # its stream ended in this process: it is starting again
    timer = threading.Timer(0.5, board.connect, (AUDITOR, pb.Binding()))
    timer.start()
    wait_for_auditor(board, AUDITOR, 2, 0.1, round_timeout=30.0)
    timer.join()
    assert AUDITOR in board.following()
