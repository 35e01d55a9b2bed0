"""A site killed mid-run: every view says the aggregator waits for it, it counts as a dropout, and the run,
one aborted round within the plan's tolerance, exits 0. Every family docs/operations.md lists is served.

Three sites as OS processes over loopback mutual TLS, four secure rounds with ``dropouts = "none"`` (every site
in every round, so the quorum is all three). site-c is killed (kill -9) just before its upload of round 2, so
round 2 aborts and round 3 waits for the quorum with site-c missing. While it waits, the status page, `fedfair
status` and the metrics endpoint must name site-c; then site-c is started again, the federation finishes with
one aborted round, and under ``[quorum] aborted_rounds_allowed = 1`` every party exits 0. The aggregator and
site-a serve metrics (their ``[monitoring]`` added to the configuration the tests' workspaces use, which sets
no privacy budget of a site's own, as ``fedfair init``'s does): each documented family must be on them.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from fedfair import cli
from fedfair.core.errors import ConfigError
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.local.workspace import free_port, toml_text
from fedfair.runtime.observe.federation_metrics import FAMILIES
from fedfair.runtime.observe.status import FederationState, federation_state
from tests.runtime.harness import Processes, new_workspace

NAMES = ["site-a", "site-b", "site-c"]
WAIT_SECONDS = 180.0
"""The longest the test waits for the federation to reach a state (a bound that ends a failing test, never asserted)."""

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def documented(section: str) -> set[str]:
    """The families a section of docs/operations.md lists (its table's first column)."""
    text = OPERATIONS.read_text().split(f"### {section}", 1)[1].split("\n### ", 1)[0]
    return set(re.findall(r"^\| `(fedfair_\w+)` \|", text, re.MULTILINE))


def served(url: str) -> tuple[str, set[str]]:
    """The scrape of a metrics endpoint and the families it serves (each announced by its HELP line)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
        text: str = answer.read().decode()
    return text, set(re.findall(r"^# HELP (\S+) ", text, re.MULTILINE))


def sample(text: str, name: str, site: str) -> float:
    (value,) = re.findall(rf'^{name}\{{site="{site}"\}} (\S+)$', text, re.MULTILINE)
    return float(value)


def reached(output: Path, what: str, test: Callable[[FederationState], bool], processes: Processes) -> FederationState:
    """The federation's state once `test(state)` holds (polled from its output folder)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            state = federation_state(output)
            if test(state):
                return state
        except ConfigError:
            pass  # no events yet: the aggregator is starting
        assert time.monotonic() < deadline, f"the federation never reached: {what}\n{processes.tail()}"
        time.sleep(0.5)


@pytest.mark.slow
def test_a_killed_site_is_waited_for_by_name_everywhere_and_the_run_exits_0(
    tmp_path: Path, processes: Processes, capsys: pytest.CaptureFixture[str]
) -> None:
    ports = {"aggregator": free_port(), "site-a": free_port()}
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": 4},
        secure_aggregation={"dropouts": "none"},
        quorum={"round_timeout_seconds": 120.0, "aborted_rounds_allowed": 1},
        monitoring={"address": f"127.0.0.1:{ports['aggregator']}"},
    )
    site_a = workspace.configs["site-a"]
    site_a.write_text(site_a.read_text() + toml_text({"monitoring": {"address": f"127.0.0.1:{ports['site-a']}"}}))
    aggregator = processes.aggregator(workspace)
    for name in NAMES[:2]:
        processes.collaborator(workspace, name)
    killed = processes.collaborator(workspace, "site-c", fault="before-upload:2:STAGE_MASKED_INPUT")
    assert killed.wait(WAIT_SECONDS) == -9, processes.tail()

    state = reached(workspace.output, "a wait for site-c", lambda s: s.waiting is not None, processes)
    assert state.running and state.waiting is not None and state.waiting.missing == ("site-c",), state
    assert state.waiting.line().startswith("waiting for the quorum: missing site-c, "), state.waiting
    assert cli.main(["status", str(workspace.output)]) == 0
    assert "  waiting for the quorum: missing site-c, " in capsys.readouterr().out
    url = state.monitoring_url
    assert url is not None
    with urllib.request.urlopen(f"{url}/", timeout=30) as answer:
        page = answer.read().decode()
    assert re.search(r'<p id="waiting" class="waiting">waiting for the quorum: missing site-c, \d+ s left', page), page
    scrape, _ = served(url)
    assert sample(scrape, "fedfair_waiting_for", "site-c") == 1.0
    assert sample(scrape, "fedfair_waiting_for", "site-a") == 0.0
    assert sample(scrape, "fedfair_site_dropouts_total", "site-c") == 1.0  # round 2 aborted without it
    assert sample(scrape, "fedfair_site_dropouts_total", "site-a") == 0.0
    _, site_families = served(f"http://127.0.0.1:{ports['site-a']}")
    missing = documented("A collaborator's metrics") - site_families
    assert not missing, f"site-a's endpoint does not serve {sorted(missing)}"

    processes.collaborator(workspace, "site-c")  # back, its state intact: the wait ends
    finished = reached(workspace.output, "its finish", lambda s: s.finished, processes)
    assert finished.waiting is None and (finished.rounds_completed, finished.rounds_aborted) == (3, 1)
    final_scrape, aggregator_families = served(url)  # its last scrape: the aggregator then exits
    missing = (documented("The aggregator's metrics") | set(FAMILIES)) - aggregator_families
    assert not missing, f"the aggregator's endpoint does not serve {sorted(missing)}"
    assert sample(final_scrape, "fedfair_waiting_for", "site-c") == 0.0
    processes.finish(aggregator)  # every party exits 0: one aborted round is within the plan's tolerance
    assert [record["status"] for record in read_round_log(workspace.output)] == [
        "applied",
        "aborted",
        "applied",
        "applied",
    ]
