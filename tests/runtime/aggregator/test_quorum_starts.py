"""A quorum wait covers a collaborator's start (issue 79): a restarting site rejoins before the wait gives up.

A later round waits the round timeout for the quorum. Short of it then, the wait goes on while a missing
collaborator is starting (its task stream ended in this process, or it fetched the plan without one), up to
its start allowance (fedfair.runtime.aggregator.starts); a site never seen, or gone past its allowance, ends
the wait at the timeout as before.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fedfair.core.errors import QuorumError
from fedfair.runtime.aggregator import starts
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.quorum import WaitGoal, wait_for
from fedfair.runtime.aggregator.starts import START_FACTOR, Starts
from fedfair.runtime.transport import make_binding
from tests.runtime.wire_stages import WIRE

SITES = frozenset({"site-a", "site-b"})
TIMEOUT = 0.3
"""The round timeout of these waits: far shorter than the site's start below."""
A_START = starts.START_FLOOR_SECONDS
"""What a start is allowed before one was measured (120 s; read before any test patches it): a wait that ends in
half of it was not extended for a start."""


def joined(board: Board, peer: str) -> None:
    board.connect(peer, make_binding("f", 0, WIRE["STAGE_JOIN"]))


def quorum_wait(board: Board, tmp_path: Path) -> frozenset[str]:
    goal = WaitGoal(3, len(SITES), SITES, TIMEOUT, "the quorum")
    return wait_for(board, goal, len(SITES), checkpoint_round=lambda: 2, output=tmp_path, round_timeout=TIMEOUT)


def test_a_site_restarting_past_the_round_timeout_is_waited_for(tmp_path: Path) -> None:
    board = Board("digest")
    joined(board, "site-a")
    joined(board, "site-b")
    board.disconnect("site-b")  # restarted: a new certificate, or a crash
    back = threading.Timer(6 * TIMEOUT, joined, (board, "site-b"))
    started = time.monotonic()  # before the timer starts: the wait is measured from no later than its start
    back.start()
    try:
        assert quorum_wait(board, tmp_path) == SITES
    finally:
        back.cancel()
    assert time.monotonic() - started >= 6 * TIMEOUT  # past the round timeout: the start was covered
    # Its start was measured: a later start is allowed at least START_FACTOR times as long.
    assert board.starts.allowance(TIMEOUT) >= min(START_FACTOR * 6 * TIMEOUT, starts.START_CEILING_SECONDS)


def test_a_plan_fetch_without_a_task_stream_is_a_start(tmp_path: Path) -> None:
    board = Board("digest")
    joined(board, "site-a")
    board.starts.fetched_plan("site-b", streaming=False)
    back = threading.Timer(4 * TIMEOUT, joined, (board, "site-b"))
    back.start()
    try:
        assert quorum_wait(board, tmp_path) == SITES
    finally:
        back.cancel()


def test_a_site_never_seen_ends_the_wait_at_the_round_timeout(tmp_path: Path) -> None:
    board = Board("digest")
    joined(board, "site-a")
    started = time.monotonic()
    with pytest.raises(QuorumError, match="below the quorum of 2"):
        quorum_wait(board, tmp_path)
    # Nothing to extend the wait for: it ends at the round timeout, far short of a start's allowance (a loaded
    # machine may stall the waiting thread for seconds; 3 s, ten timeouts, was within such a stall's reach).
    assert time.monotonic() - started < A_START / 2


def test_a_site_gone_past_its_allowance_ends_the_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(starts, "START_FLOOR_SECONDS", 4 * TIMEOUT)
    board = Board("digest")
    joined(board, "site-a")
    joined(board, "site-b")
    board.disconnect("site-b")  # gone for good
    started = time.monotonic()
    with pytest.raises(QuorumError, match="below the quorum of 2"):
        quorum_wait(board, tmp_path)
    waited = time.monotonic() - started
    # Its allowance, then the federation is told: not the product's floor (a stall of a loaded machine
    # only lengthens the wait, so the upper end leaves it room).
    assert 4 * TIMEOUT - 0.05 <= waited < A_START / 2


def test_the_allowance_follows_the_longest_start_measured_within_its_bounds() -> None:
    now = [0.0]
    measured = Starts(lambda: now[0])
    assert measured.allowance(20.0) == starts.START_FLOOR_SECONDS  # nothing measured: the floor
    assert measured.allowance(600.0) == 600.0  # a round timeout above the floor
    measured.left("site-b")
    now[0] = 100.0
    measured.streaming("site-b")
    assert measured.allowance(20.0) == START_FACTOR * 100.0
    measured.left("site-b")
    now[0] = 10_000.0
    measured.streaming("site-b")
    assert measured.allowance(20.0) == starts.START_CEILING_SECONDS
    assert measured.until(["site-b"], 20.0) == (0.0, [])  # streaming again: not starting
