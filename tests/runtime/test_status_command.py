"""`fedfair status` and `fedfair logs` through the command line, on a folder the aggregator's writers wrote.

The folder is tests/runtime/test_report.py's run (five rounds: a dropout, an aborted round with an
exclusion, a re-admission, epsilons shared); a collaborator's text log is written in the format of
fedfair.runtime.observe.logs. `--follow` runs in a child process that ends at the aggregator's `finish` event.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedfair import cli
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.observe.events import EventLog, read_events
from fedfair.runtime.report.verdicts import progress_note
from tests.runtime.test_report import write_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    output = tmp_path / "output"
    write_run(output)
    return output


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_status_shows_the_federation_on_one_screen(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "status", str(folder))
    assert status == 0
    lines = out.splitlines()
    assert len(lines) < 25  # one screen
    assert lines[0].startswith("federation fed-test: finished, round 5 of 5 (4 applied, 1 aborted); no checkpoint")
    final = read_round_log(folder)[-1]["evaluation"]
    # The console's form, naming the round the figures are from.
    assert f"estimate: {progress_note(final)}" in out and "round 5)" in out
    (site_c,) = [line for line in lines if line.strip().startswith("site-c ")]
    assert site_c.split()[1:4] == ["no", "3", "1"]  # not connected, 3 contributions, 1 dropout
    (site_a,) = [line for line in lines if line.strip().startswith("site-a ")]
    assert "2.5" in site_a.split()


def test_status_json_is_the_whole_state(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "status", str(folder), "--json")
    assert status == 0
    state = json.loads(out)
    assert (state["rounds_completed"], state["rounds_aborted"], state["last_round"]) == (4, 1, 5)
    assert state["sites"]["site-c"]["dropouts"] == 1 and state["sites"]["site-a"]["epsilon"] == 2.5
    assert state["estimate"]["worst"] == read_round_log(folder)[-1]["evaluation"]["worst_risk"]
    assert state["finished"] and not state["running"] and state["excluded"] == {}  # site-b re-admitted


def test_status_of_a_folder_without_logs_says_what_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "status", str(tmp_path))
    assert status == 2
    assert "holds neither events.jsonl nor rounds.jsonl" in err and "[aggregator] output" in err


def test_logs_filter_the_event_log(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = read_events(folder)
    status, out, _ = run(capsys, "logs", str(folder), "--json")
    assert status == 0 and [json.loads(line) for line in out.splitlines()] == events
    _, out, _ = run(capsys, "logs", str(folder), "--json", "--event", "round", "--round", "4")
    assert [json.loads(line) for line in out.splitlines()] == [
        event for event in events if event["event"] == "round" and event["round"] == 4
    ]
    _, out, _ = run(capsys, "logs", str(folder), "--event", "status", "--site", "site-c")
    (line,) = out.splitlines()
    assert " status " in line and "name=site-c" in line and "status=budget_spent" in line
    _, out, _ = run(capsys, "logs", str(folder), "--json", "--tail", "2")
    assert [json.loads(line) for line in out.splitlines()] == events[-2:]


def test_logs_read_a_partys_text_log_as_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "site-a.log"
    log.write_text(
        "2026-11-26 15:00:01,250 INFO site-a: connecting to the aggregator at 127.0.0.1:1\n"
        "2026-11-26 15:00:02,000 WARNING site-a: round 2: not contributing: budget\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1\n'
        "2026-11-26 15:00:03,000 ERROR site-b: gone\n"
    )
    status, out, _ = run(capsys, "logs", str(log), "--json", "--level", "WARNING", "--site", "site-a")
    assert status == 0
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert record["event"] == "log" and record["level"] == "WARNING"
    assert (
        record["message"]
        == 'site-a: round 2: not contributing: budget\nTraceback (most recent call last):\n  File "x.py", line 1'
    )
    _, out, _ = run(capsys, "logs", str(log))
    assert len(out.splitlines()) == 5 and out.splitlines()[-1].endswith("ERROR   site-b: gone")


def test_logs_of_nothing_name_what_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "logs", str(tmp_path))
    assert status == 2 and "holds no events.jsonl" in err


def test_logs_follow_prints_new_events_until_the_finish(tmp_path: Path) -> None:
    output = tmp_path / "output"
    events = EventLog(output)
    events.emit("start", federation_id="f", pid=1, resume=False, first_round=1, rounds=1, collaborators=["a"])
    command = [sys.executable, "-m", "fedfair.cli", "logs", str(output), "--follow", "--json", "--event", "connect"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None
        events.emit("connect", name="a")
        assert json.loads(child.stdout.readline())["name"] == "a"  # printed while the log grows
        events.emit("disconnect", name="a")
        events.emit("connect", name="b")
        events.emit("finish", rounds=1, output=str(output))
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert [json.loads(line)["name"] for line in out.splitlines()] == ["b"]
