"""A site frozen mid-round (SIGSTOP during a stage) is named with that stage by every view, then the round completes.

Three sites as OS processes over loopback mutual TLS, three secure rounds. site-c stops itself (SIGSTOP, the
fault point ``freeze:before-upload:2:STAGE_ADVERTISE_KEYS``) when round 2's key advertisement is due, its task
stream still open. Within 15 s of the freeze `fedfair status --json`, the status page and the metrics endpoint
must name site-c and the stage it holds up, as a site that is connected but not answering; after SIGCONT the
round completes with site-c in it, and every party exits 0.
"""

from __future__ import annotations

import html
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.local.workspace import free_port
from fedfair.runtime.observe.status import FederationState
from tests.runtime.harness import Processes, frozen, new_workspace
from tests.runtime.test_stall import WAIT_SECONDS, reached, sample, served

NAMES = ["site-a", "site-b", "site-c"]
NAMED_WITHIN_SECONDS = 15.0
"""The issue's bound: the aggregator writes a stage's wait every 10 s (board.PROGRESS_SECONDS), so a freeze at the
stage's opening is named 10 s later, plus a poll's and a loaded machine's slack."""
ROOT = Path(__file__).resolve().parents[2]


def names_the_stage(state: FederationState) -> bool:
    waiting = state.waiting
    return waiting is not None and waiting.stage == "STAGE_ADVERTISE_KEYS" and waiting.missing == ("site-c",)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads a process's state from /proc")
def test_a_site_frozen_mid_round_is_named_with_its_stage_and_the_round_completes_after_it_goes_on(
    tmp_path: Path, processes: Processes
) -> None:
    port = free_port()
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": 3},
        quorum={"round_timeout_seconds": 120.0},
        monitoring={"address": f"127.0.0.1:{port}"},
    )
    aggregator = processes.aggregator(workspace)
    for name in NAMES[:2]:
        processes.collaborator(workspace, name)
    site_c = processes.collaborator(workspace, "site-c", fault="freeze:before-upload:2:STAGE_ADVERTISE_KEYS")
    deadline = time.monotonic() + WAIT_SECONDS
    while not frozen(site_c.process.pid):
        assert site_c.process.poll() is None and time.monotonic() < deadline, processes.tail()
        time.sleep(0.1)
    froze = time.monotonic()

    state = reached(workspace.output, "a wait naming site-c's stage", names_the_stage, processes)
    named_after = time.monotonic() - froze
    assert named_after <= NAMED_WITHIN_SECONDS, f"named {named_after:.1f} s after the freeze"
    listed = subprocess.run(
        [sys.executable, "-m", "fedfair.cli", "status", "--json", str(workspace.output)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    waiting = json.loads(listed.stdout)["waiting"]
    assert (waiting["round"], waiting["goal"], waiting["missing"], waiting["silent"]) == (
        2,
        "key advertisements",
        ["site-c"],
        ["site-c"],
    ), waiting
    assert 0.0 < waiting["seconds_left"] <= 120.0
    url = state.monitoring_url
    assert url is not None
    with urllib.request.urlopen(f"{url}/", timeout=30) as answer:
        page = html.unescape(answer.read().decode())
    assert re.search(
        r"round 2: waiting for site-c's key advertisements, \d+ s left \(2 of 3 answered; site-c connected but not "
        r"answering\)",
        page,
    ), page
    scrape, _ = served(url)
    assert sample(scrape, "fedfair_waiting_for", "site-c") == 1.0
    assert sample(scrape, "fedfair_waiting_for", "site-a") == 0.0
    assert re.search(r'^fedfair_waiting_stage\{stage="key advertisements"\} 1\.0$', scrape, re.MULTILINE), scrape
    (left,) = re.findall(r"^fedfair_waiting_seconds_left (\S+)$", scrape, re.MULTILINE)
    assert 0.0 < float(left) <= 120.0

    site_c.process.send_signal(signal.SIGCONT)
    finished = reached(workspace.output, "its finish", lambda s: s.finished, processes)
    assert finished.waiting is None
    processes.finish(aggregator)
    rounds = read_round_log(workspace.output)
    assert [(record["status"], record.get("contributors")) for record in rounds] == [("applied", NAMES)] * 3


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads a process's state from /proc")
def test_a_site_frozen_past_one_timeout_costs_one_aborted_round_and_everyone_exits_0(
    tmp_path: Path, processes: Processes
) -> None:
    """dropouts = "none", aborted_rounds_allowed = 1: site-c frozen at round 2's key advertisement for longer than
    the 20 s round timeout. Round 2 aborts; round 3 waits for the quorum, which site-c (its stream still open, but
    silent through all of round 2) is not counted in until it is heard from, rather than starting with it and
    aborting again at its timeout. site-c goes on, round 3 runs with it: exactly one round aborted, exit 0 all."""
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": 4},
        secure_aggregation={"dropouts": "none"},
        quorum={"round_timeout_seconds": 20.0, "aborted_rounds_allowed": 1},
    )
    aggregator = processes.aggregator(workspace)
    for name in NAMES[:2]:
        processes.collaborator(workspace, name)
    site_c = processes.collaborator(workspace, "site-c", fault="freeze:before-upload:2:STAGE_ADVERTISE_KEYS")
    aborted = reached(workspace.output, "round 2 aborted", lambda s: s.rounds_aborted == 1, processes)
    assert frozen(site_c.process.pid) and aborted.last_round == 2, processes.tail()
    waiting = reached(workspace.output, "round 3's wait", lambda s: s.waiting is not None, processes).waiting
    assert waiting is not None and (waiting.round, waiting.goal, waiting.missing, waiting.silent) == (
        3,
        "the quorum",
        ("site-c",),
        ("site-c",),
    ), waiting
    assert waiting.line().endswith("(2 of 3 connected, before round 3; site-c connected but not answering)")
    site_c.process.send_signal(signal.SIGCONT)  # 20 s and more after it froze: past one round timeout
    processes.finish(aggregator)  # every party exits 0: one aborted round is within the plan's allowance
    statuses = [record["status"] for record in read_round_log(workspace.output)]
    assert statuses == ["applied", "aborted", "applied", "applied"]
