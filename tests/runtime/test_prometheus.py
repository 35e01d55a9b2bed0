"""A real Prometheus scrapes a real loopback federation; its HTTP API answers with the report's figures.

Two sites as OS processes, three plain rounds: site-b is killed (kill -9) just before its upload of
round 2, so round 2 completes without it and names it as a dropout; site-a trains under local DP,
shares its epsilon and serves its own metrics. The aggregator's endpoint takes a bearer token, which
Prometheus sends from a credentials file. Prometheus (the Debian `prometheus` package; `.ci/run`
installs it) scrapes every second; the test then asks its query API for the rounds completed, site-b's
dropouts and site-a's epsilon, and compares them with final_model.json, the round log and the
accountant's file. Every address is on loopback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedfair.privacy.accounting import PrivacyAccountant, privacy_state_path
from fedfair.privacy.ledger_home import ledger_folder
from fedfair.runtime.output_folder import FINAL_SUMMARY_NAME
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.observe.events import read_events
from fedfair.runtime.collaborator.charges import data_identity
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import free_port, toml_text
from tests.runtime.harness import Processes, new_workspace

NAMES = ["site-a", "site-b"]
WAIT_SECONDS = 120.0
"""The longest the test waits for Prometheus to start or to hold a figure (a bound, never asserted)."""


def prometheus() -> str:
    found = shutil.which("prometheus")
    if found is None:
        pytest.skip("the Prometheus server is not installed (Debian: apt-get install prometheus; .ci/run installs it)")
    return found


def api(port: int, path: str, **query: str) -> dict[str, Any]:
    """GET Prometheus's HTTP API on loopback `port` (its JSON answer)."""
    url = f"http://127.0.0.1:{port}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=30) as answer:
        answered: dict[str, Any] = json.loads(answer.read())
        return answered


def value(port: int, query: str, expected: float | None = None) -> float:
    """The one value of an instant `query`, polled until Prometheus has one (equal to `expected` if given)."""
    deadline = time.monotonic() + WAIT_SECONDS
    result: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        result = api(port, "/api/v1/query", query=query)["data"]["result"]
        if len(result) == 1 and (expected is None or float(result[0]["value"][1]) == pytest.approx(expected)):
            break
        time.sleep(0.5)
    assert len(result) == 1, f"{query}: {result}"
    return float(result[0]["value"][1])


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[int, dict[str, int], Path]]:
    """A Prometheus scraping the aggregator's and site-a's endpoints: (its port, their ports, the token file)."""
    binary = prometheus()
    ports = {"aggregator": free_port(), "site-a": free_port()}
    token = tmp_path / "metrics.token"
    token.write_text("prometheus-scrapes-fedfair\n")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "aggregator",
                "authorization": {"credentials_file": str(token)},
                "static_configs": [{"targets": [f"127.0.0.1:{ports['aggregator']}"]}],
            },
            {"job_name": "site-a", "static_configs": [{"targets": [f"127.0.0.1:{ports['site-a']}"]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    command = [
        binary,
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    log = (tmp_path / "prometheus.log").open("w")
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert child.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.5)
        yield port, ports, token
    finally:
        child.terminate()
        child.wait(30)
        log.close()


@pytest.mark.slow
def test_prometheus_scrapes_the_rounds_a_named_dropout_and_a_sites_epsilon(
    tmp_path: Path, processes: Processes, server: tuple[int, dict[str, int], Path]
) -> None:
    port, ports, token = server
    workspace = new_workspace(
        tmp_path / "federation",
        NAMES,
        training={"rounds": 3},
        secure_aggregation={"enabled": False},
        quorum={"min_collaborators": 1},
        monitoring={"address": f"127.0.0.1:{ports['aggregator']}", "token_file": str(token)},
    )
    site = workspace.configs["site-a"]
    site.write_text(
        site.read_text()
        + toml_text(
            {
                "privacy": {"enabled": True, "share_epsilon": True, "budget_epsilon": 50.0},
                "monitoring": {"address": f"127.0.0.1:{ports['site-a']}"},
            }
        )
    )
    aggregator = processes.aggregator(workspace)
    processes.collaborator(workspace, "site-a")
    killed = processes.collaborator(workspace, "site-b", fault="before-upload:2:STAGE_MASKED_INPUT")
    assert killed.wait(WAIT_SECONDS) == -9, processes.tail()
    processes.finish(aggregator)

    final = json.loads((workspace.output / FINAL_SUMMARY_NAME).read_text())
    log = read_round_log(workspace.output)
    assert final["applied_rounds"] == 3 and final["aborted_rounds"] == 0
    dropped = sum("site-b" in r["participants"] and "site-b" not in r.get("contributors", ()) for r in log)
    assert dropped == 1, log
    config = load_collaborator_config(site)
    identity = data_identity(config.data)
    spent = PrivacyAccountant(privacy_state_path(ledger_folder(), "site-a", identity), data=identity).epsilon(
        config.privacy.delta, config.privacy.accountant
    )
    shared = [event["epsilon"] for event in read_events(workspace.output) if event["event"] == "round"][-1]

    # The processes have exited: their series are stale, so the last sample of each is asked for.
    def last(selector: str, expected: float) -> float:
        return value(port, f"last_over_time({selector}[10m])", expected)

    assert last("fedfair_rounds_completed_total", final["applied_rounds"]) == final["applied_rounds"]
    assert last("fedfair_rounds_aborted_total", 0) == final["aborted_rounds"]
    assert last('fedfair_site_dropouts_total{site="site-b"}', dropped) == dropped
    assert last('fedfair_site_dropouts_total{site="site-a"}', 0) == 0
    assert last('fedfair_site_epsilon_spent{site="site-a",accounting="dp_sgd"}', spent) == pytest.approx(spent)
    assert last('fedfair_site_epsilon_shared{site="site-a"}', shared["site-a"]) == pytest.approx(shared["site-a"])
    assert last('fedfair_site_epsilon_budget{site="site-a"}', 50.0) == 50.0
    evaluation = final["evaluation"]
    if evaluation.get("status") == "done":
        assert last("fedfair_worst_group_risk", evaluation["worst_risk"]) == pytest.approx(evaluation["worst_risk"])
    info = api(port, "/api/v1/query", query="last_over_time(fedfair_federation_info[10m])")["data"]["result"]
    assert info[0]["metric"]["federation_id"] == final["federation_id"]
    assert info[0]["metric"]["plan_digest"] == final["plan_digest"]
