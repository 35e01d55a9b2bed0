"""What the aggregator knows shows everywhere: a wait names who is missing, and a lost site counts as a dropout.

The output folders are written with the aggregator's own writers (EventLog, append_round_log), as a run that
is still going would leave them: the ``start`` event carries this test's PID, so the federation reads as
running. `fedfair status`, the status page and the metrics endpoint all read the same state.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fedfair import cli
from fedfair.core.errors import RoundAbortedError
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.checkpoint import append_round_log
from fedfair.runtime.aggregator.progress_line import report_progress
from fedfair.runtime.aggregator.voided import BoundSurvivors
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.observe.federation_metrics import FederationCollector
from fedfair.runtime.observe.status import federation_state
from fedfair.runtime.observe.status_page import status_page
from fedfair.runtime.contract import TRAINING
from fedfair.runtime.transport import make_binding
from tests.runtime.harness import eventually
from tests.runtime.test_monitoring import samples
from tests.runtime.test_report import NAMES, applied
from tests.runtime.wire_stages import WIRE

ROOT = Path(__file__).resolve().parents[2]


def running_federation(folder: Path, *, lost_in_round: int | None = 2) -> EventLog:
    """Two rounds of a running aggregator: round 1 applied with everyone; site-c's stream then ends, and round 2
    aborts (naming nobody missing: the abort is all the record says). `lost_in_round` None: no disconnect."""
    events = EventLog(folder)
    events.emit("start", federation_id="fed-wait", pid=os.getpid(), resume=False, first_round=1, rounds=4,
                collaborators=NAMES)  # fmt: skip
    for name in NAMES:
        events.emit("connect", name=name)
    records = [
        applied(1, NAMES, NAMES, {}, 9.8),
        {"round": 2, "participants": NAMES, "model_sha256": "0" * 64, "secure_aggregation": True,
         "status": "aborted", "reason": "too few survivors", "seconds": 0.4},
    ]  # fmt: skip
    for record in records:
        if record["round"] == lost_in_round:
            events.emit("disconnect", name="site-c")
        append_round_log(folder, record)
        events.emit("round", round=record["round"], status=record["status"], participants=NAMES,
                    contributors=record.get("contributors", []), seconds={}, bytes=0, objective=None, epsilon={})  # fmt: skip
    return events


def metrics_of(folder: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FederationCollector(folder))
    return samples(generate_latest(registry).decode())


def test_a_wait_for_the_quorum_names_the_missing_site_on_the_page_in_status_and_in_a_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = running_federation(tmp_path)
    events.emit("waiting", round=3, goal="the quorum", connected=2, eligible=3, missing=["site-c"], seconds_left=290.0)
    state = federation_state(tmp_path)
    assert state.running and state.waiting is not None and state.waiting.missing == ("site-c",)
    line = state.waiting.line()
    shown = re.fullmatch(
        r"waiting for the quorum: missing site-c, (\d+) s left \(2 of 3 connected, before round 3\)", line
    )
    assert shown is not None, line
    assert 280 <= int(shown[1]) <= 290  # counted down from the event's 290 s by the seconds since it was written

    assert cli.main(["status", str(tmp_path)]) == 0
    assert "  waiting for the quorum: missing site-c, " in capsys.readouterr().out

    page = status_page(state)
    (shown_on_page,) = re.findall(r'<p id="waiting" class="waiting">(.*?)</p>', page)
    assert shown_on_page.startswith("waiting for the quorum: missing site-c, ")

    scraped = metrics_of(tmp_path)
    waiting = {name: scraped["fedfair_waiting_for", (("site", name),)] for name in NAMES}
    assert waiting == {"site-a": 0.0, "site-b": 0.0, "site-c": 1.0}


def test_the_wait_ends_when_the_round_starts(tmp_path: Path) -> None:
    events = running_federation(tmp_path)
    events.emit("waiting", round=3, goal="the quorum", connected=2, eligible=3, missing=["site-c"], seconds_left=290.0)
    events.emit("connect", name="site-c")
    events.emit("round_start", round=3, participants=NAMES)
    assert federation_state(tmp_path).waiting is None
    assert {scraped for (name, _), scraped in metrics_of(tmp_path).items() if name == "fedfair_waiting_for"} == {0.0}
    assert 'id="waiting"' not in status_page(federation_state(tmp_path))


def test_a_site_whose_stream_ends_before_an_aborted_round_counts_as_a_dropout(tmp_path: Path) -> None:
    running_federation(tmp_path, lost_in_round=2)
    dropouts = {name: site.dropouts for name, site in federation_state(tmp_path).sites.items()}
    assert dropouts == {"site-a": 0, "site-b": 0, "site-c": 1}
    assert metrics_of(tmp_path)["fedfair_site_dropouts_total", (("site", "site-c"),)] == 1.0


def test_a_stream_lost_after_the_last_round_counts_while_the_aggregator_goes_on(tmp_path: Path) -> None:
    events = running_federation(tmp_path, lost_in_round=None)
    assert federation_state(tmp_path).sites["site-c"].dropouts == 0
    events.emit("disconnect", name="site-c")  # no round has settled it yet: the aggregator goes on without it
    assert federation_state(tmp_path).sites["site-c"].dropouts == 1
    events.emit("finish", rounds=4, output=str(tmp_path))  # the streams a finished run closes are no dropouts
    for name in NAMES:
        events.emit("disconnect", name=name)
    assert {site.dropouts for site in federation_state(tmp_path).sites.values()} == {0}


def test_a_site_that_came_back_in_time_or_that_a_round_names_is_counted_once(tmp_path: Path) -> None:
    events = EventLog(tmp_path)
    events.emit("start", federation_id="fed-wait", pid=os.getpid(), resume=False, first_round=1, rounds=4,
                collaborators=NAMES)  # fmt: skip
    records = [
        applied(1, NAMES, NAMES, {}, 9.8),  # site-b's stream ends and comes back before its upload: no dropout
        applied(2, NAMES, NAMES[:2], {"STAGE_MASKED_INPUT": ["site-c"]}, 9.7),  # site-c lost: the record names it
    ]
    for record, lost in zip(records, ("site-b", "site-c"), strict=True):
        events.emit("disconnect", name=lost)
        if lost == "site-b":
            events.emit("connect", name=lost)
        append_round_log(tmp_path, record)
        events.emit("round", round=record["round"], status="applied", participants=NAMES,
                    contributors=record["contributors"], seconds={}, bytes=0, objective=None, epsilon={})  # fmt: skip
    dropouts = {name: site.dropouts for name, site in federation_state(tmp_path).sites.items()}
    assert dropouts == {"site-a": 0, "site-b": 0, "site-c": 1}


def test_status_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    running_federation(tmp_path)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written, as `head` is once it has its lines
    try:
        ended = subprocess.run(
            [sys.executable, "-m", "fedfair.cli", "status", "--json", str(tmp_path)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            check=False,
        )
    finally:
        os.close(write)
    assert ended.stderr == "" and ended.returncode == cli.EXIT_CLOSED_PIPE


def test_logs_are_readable_lines_by_default_and_an_unknown_site_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = running_federation(tmp_path)
    long = {f"site-{index}": 1.0 / 3.0 for index in range(40)}
    events.emit("round", round=3, status="applied", participants=NAMES, contributors=NAMES, seconds={}, bytes=0,
                objective=None, epsilon=long)  # fmt: skip
    assert cli.main(["logs", str(tmp_path), "--event", "round"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and max(len(line) for line in lines) < 400, lines
    assert "epsilon=site-0:0.3333,site-1:0.3333," in lines[-1] and "..." in lines[-1]
    assert cli.main(["logs", str(tmp_path), "--event", "round", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()[-1]) > 1000  # --json gives every field whole
    assert cli.main(["logs", str(tmp_path), "--site", "site-9"]) == 2
    error = capsys.readouterr().err
    assert "--site site-9" in error and "site-a, site-b, site-c" in error


def test_the_waiting_line_counts_down_without_going_below_zero(tmp_path: Path) -> None:
    events = running_federation(tmp_path)
    events.emit("waiting", round=3, goal="everyone", connected=2, eligible=3, missing=["site-c"], seconds_left=0.5)
    time.sleep(0.6)
    waiting = federation_state(tmp_path).waiting
    assert waiting is not None and waiting.seconds_left == 0.0 and waiting.goal == "everyone"


def test_a_wait_for_a_voided_rounds_survivors_is_a_waiting_event(tmp_path: Path) -> None:
    """After a round voided once its sum was unmasked, the next round waits for exactly its survivors: that wait
    names the missing one like a wait for the quorum, and raises (the round is void) when it does not come."""
    events = running_federation(tmp_path, lost_in_round=None)
    bound = BoundSurvivors()
    bound.note(2, frozenset(NAMES), "no tag of the claimed sum from site-c")
    with pytest.raises(RoundAbortedError, match="site-c is not connected"):
        bound.participants(Board("digest"), 3, frozenset(NAMES[:2]), 0.05, events)
    waiting = federation_state(tmp_path).waiting
    assert waiting is not None and waiting.missing == ("site-c",) and waiting.goal == "round 2's survivors"


def test_a_site_that_holds_a_stage_up_is_named_with_the_stage_everywhere_until_it_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver's wait for a stage writes its progress as ``waiting`` events: the views name the site that has
    not answered and the stage's uploads, tell a site still connected from one whose stream ended, count the
    seconds left down, and forget the wait once the stage settles."""
    events = running_federation(tmp_path, lost_in_round=None)
    board = Board("digest", events=events)
    for name in NAMES:
        board.connect(name, make_binding("fed-wait", 2, WIRE["STAGE_EVAL_UNMASK"]))
    board.new_round(3)
    advertise = make_binding("fed-wait", 3, WIRE["STAGE_ADVERTISE_KEYS"])
    opened = time.monotonic()  # no later than the stage's opening, on the board's clock

    def counted_down(left: float) -> bool:
        """Whether `left` is the stage's 60 s less at most the time since it opened (reports round to 0.1 s): a
        fixed 10 s of slack would fail a loaded machine that took longer to reach the check."""
        return 60.0 - (time.monotonic() - opened) - 0.05 <= left <= 60.0

    board.open_stage(advertise, NAMES, b"", lambda peer, payload: None, max_upload_bytes=1 << 10, timeout=60.0)
    for name in NAMES[:2]:
        board.deliver(name, advertise, b"key")
    waiter = threading.Thread(target=board.wait_stage, args=(partial(report_progress, True, TRAINING, events), 0.2))
    waiter.start()
    assert eventually(lambda: federation_state(tmp_path).waiting is not None)
    waiting = federation_state(tmp_path).waiting
    assert waiting is not None and (waiting.stage, waiting.missing, waiting.silent) == (
        "STAGE_ADVERTISE_KEYS",
        ("site-c",),
        ("site-c",),
    )
    assert waiting.seconds_left is not None and counted_down(waiting.seconds_left)
    line = (
        r"round 3: waiting for site-c's key advertisements, (\d+) s left "
        r"\(2 of 3 answered; site-c connected but not answering\)"
    )
    assert re.fullmatch(line, waiting.line()), waiting.line()
    assert cli.main(["status", str(tmp_path)]) == 0
    assert re.search(f"^  {line}$", capsys.readouterr().out, re.MULTILINE)
    page = html.unescape(status_page(federation_state(tmp_path)))  # the page escapes the apostrophe
    assert re.search(f'<p id="waiting" class="waiting">{line}</p>', page), page
    scraped = metrics_of(tmp_path)
    assert {name: scraped["fedfair_waiting_for", (("site", name),)] for name in NAMES} == {
        "site-a": 0.0,
        "site-b": 0.0,
        "site-c": 1.0,
    }
    assert scraped["fedfair_waiting_stage", (("stage", "key advertisements"),)] == 1.0
    assert counted_down(scraped["fedfair_waiting_seconds_left", ()])

    events.emit("disconnect", name="site-c")  # its stream ended: the views say so rather than "not answering"
    gone = federation_state(tmp_path).waiting
    assert gone is not None and gone.silent == () and gone.line().endswith("(2 of 3 answered; site-c disconnected)")

    board.deliver("site-c", advertise, b"key")
    waiter.join(60.0)  # settled at once: the bound only ends a failing test
    assert not waiter.is_alive() and federation_state(tmp_path).waiting is None  # the `waited` event ended it
    scraped = metrics_of(tmp_path)
    assert not any(name in ("fedfair_waiting_stage", "fedfair_waiting_seconds_left") for name, _ in scraped)


def test_a_stopped_federation_says_why_and_keeps_the_dropout_of_the_site_it_stopped_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """site-c's stream ends after round 2 and the quorum wait before round 3 times out: the aggregator's ``stop``
    event names the error and its fix, and the streams its own stop ends count for nobody."""
    events = running_federation(tmp_path, lost_in_round=None)
    events.emit("disconnect", name="site-c")
    events.emit("waiting", round=3, goal="the quorum", connected=2, eligible=3, missing=["site-c"], seconds_left=0.0)
    assert federation_state(tmp_path).sites["site-c"].dropouts == 1  # while it runs: it goes on without site-c
    why = (
        "round 3: only 2 of the 3 collaborators connected within 30 s, below the quorum of 3 (missing: site-c). "
        "The checkpoint of round 2 is kept in OUT: start the missing collaborators, then restart the aggregator "
        "with --resume"
    )
    events.emit("stop", reason=why, status=2)
    for name in NAMES[:2]:
        events.emit("disconnect", name=name)  # the aggregator's own stop closes their streams
    state = federation_state(tmp_path)
    assert (state.running, state.stopped, state.exit_status, state.waiting) == (False, why, 2, None)
    assert {name: site.dropouts for name, site in state.sites.items()} == {"site-a": 0, "site-b": 0, "site-c": 1}
    assert cli.main(["status", str(tmp_path)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("federation fed-wait: stopped (exit 2), round 2 of 4 (1 applied, 1 aborted)")
    assert f"  stopped: {why}" in shown
    assert f"stopped (exit 2): {why}" in html.unescape(status_page(state))
