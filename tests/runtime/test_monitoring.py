"""The monitoring endpoints: metrics from the logs' own figures, a token off loopback, every family documented.

The aggregator's folder is written with the aggregator's own writers (tests/runtime/test_report.py's
`write_run`: a late site, a dropout, an aborted round with an exclusion, a re-admission, shared
epsilons), scraped through prometheus_client's text format and parsed back. The endpoint is served
on loopback only. A real Prometheus scraping a real federation: tests/runtime/test_prometheus.py.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fedfair import pki
from fedfair.core.errors import ConfigError
from fedfair.runtime.observe import federation_metrics as metrics
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.collaborator import metrics as site_metrics
from fedfair.runtime.collaborator.charges import data_identity
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import toml_text
from fedfair.runtime.observe.endpoint import MonitoringSettings, is_loopback, parse_monitoring, serve_monitoring
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.report.verdicts import worst_interval
from tests.runtime.harness import new_workspace
from tests.runtime.test_report import NAMES, write_run

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
LABELS = {"site", "stage", "accounting", "federation_id", "plan_digest"}
CERTS = ("cert_file", "key_file", "client_ca_file")


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    output = tmp_path / "output"
    write_run(output)
    return output


def registry_of(folder: Path) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.FederationCollector(folder))
    return registry


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape in the text format: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_metrics_are_the_round_logs_figures(folder: Path) -> None:
    scraped = samples(generate_latest(registry_of(folder)).decode())
    records = read_round_log(folder)
    assert scraped["fedfair_rounds_completed_total", ()] == sum(r["status"] == "applied" for r in records) == 4
    assert scraped["fedfair_rounds_aborted_total", ()] == 1
    assert scraped["fedfair_rounds_planned", ()] == 5 and scraped["fedfair_last_round", ()] == 5
    # site-c dropped out of round 2 only (late in round 1: its input is in that sum).
    dropouts = {name: scraped["fedfair_site_dropouts_total", (("site", name),)] for name in NAMES}
    assert dropouts == {"site-a": 0, "site-b": 0, "site-c": 1}
    contributions = {
        name: sum(name in r.get("contributors", ()) for r in records if r["status"] == "applied") for name in NAMES
    }
    assert {name: scraped["fedfair_site_contributions_total", (("site", name),)] for name in NAMES} == contributions
    assert scraped["fedfair_site_epsilon_shared", (("site", "site-a"),)] == 2.5
    assert ("fedfair_site_epsilon_shared", (("site", "site-b"),)) not in scraped  # never shared: no series
    final = records[-1]["evaluation"]
    low, high = worst_interval(final)
    assert scraped["fedfair_worst_group_risk", ()] == final["worst_risk"]
    assert (scraped["fedfair_worst_group_risk_lower", ()], scraped["fedfair_worst_group_risk_upper", ()]) == (low, high)
    assert scraped["fedfair_mean_risk", ()] == final["mean_risk"]
    assert scraped["fedfair_received_bytes_total", ()] == sum(r.get("received_bytes", 0) for r in records)
    assert scraped["fedfair_round_duration_seconds_count", ()] == len(records)
    info = next(key for key in scraped if key[0] == "fedfair_federation_info")
    assert dict(info[1])["federation_id"] == "fed-test"


def test_no_series_is_per_record_and_every_family_is_declared_and_documented(folder: Path) -> None:
    scraped = samples(generate_latest(registry_of(folder)).decode())
    for _, labels in scraped:
        assert {key for key, _ in labels} <= LABELS, labels
    declared = {**metrics.FAMILIES, **site_metrics.FAMILIES}
    for name, _ in scraped:
        base = name.removesuffix("_count").removesuffix("_sum") if name not in declared else name
        assert base in declared, f"{name} is served but not declared in FAMILIES"
    documented = OPERATIONS.read_text().split("## Monitoring", 1)[1]
    for name, (kind, _) in declared.items():
        assert f"| `{name}` | {kind} |" in documented, f"docs/operations.md does not list {name} as a {kind}"


def get(url: str, token: str | None = None) -> tuple[int, str]:
    """(status, body) of a GET of a loopback `url`, with a bearer `token` if given."""
    assert url.startswith("http://127."), url  # loopback only
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_an_endpoint_with_a_token_refuses_a_request_without_it(folder: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    settings = MonitoringSettings("127.0.0.1:0", token_file)
    pages: dict[str, Any] = {"/status": lambda: ("text/plain", b"page")}
    endpoint = serve_monitoring(settings, registry_of(folder), pages)
    try:
        for path in ("/metrics", "/status"):
            assert get(endpoint.url + path)[0] == 401
            assert get(endpoint.url + path, "wrong")[0] == 401
            assert get(endpoint.url + path, "s3cret-token-and-more")[0] == 401
        status, body = get(endpoint.url + "/metrics", "s3cret-token")
        assert status == 200 and "fedfair_rounds_completed_total 4.0" in body
        assert get(endpoint.url + "/status", "s3cret-token") == (200, "page")
        assert get(endpoint.url + "/nothing", "s3cret-token")[0] == 404
    finally:
        endpoint.stop()


def test_off_loopback_a_token_is_required_before_anything_is_bound(tmp_path: Path) -> None:
    assert all(map(is_loopback, ("127.0.0.1", "127.0.0.2", "localhost", "::1")))
    assert not any(map(is_loopback, ("0.0.0.0", "192.0.2.1", "example.org", "::")))
    for address in ("0.0.0.0:9464", "[::]:9464", "monitor.example.org:9464"):
        with pytest.raises(ConfigError, match="token_file"):
            serve_monitoring(MonitoringSettings(address), CollectorRegistry())
        with pytest.raises(ConfigError, match=r"\[monitoring\] address .* token_file"):
            parse_monitoring("plan.toml", {"monitoring": {"address": address}}, tmp_path)
    with pytest.raises(ConfigError, match="token_file .* is empty"):
        (tmp_path / "empty").write_text("\n")
        serve_monitoring(MonitoringSettings("0.0.0.0:0", tmp_path / "empty"), CollectorRegistry())
    with pytest.raises(ConfigError, match="port in 0..65535"):
        parse_monitoring("plan.toml", {"monitoring": {"address": "127.0.0.1:70000"}}, tmp_path)


def test_the_plan_and_a_collaborators_config_read_their_monitoring_section(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, NAMES[:2], monitoring={"address": "127.0.0.1:0", "token_file": "token"})
    plan = load_aggregator_plan(workspace.plan)
    assert plan.monitoring == MonitoringSettings("127.0.0.1:0", workspace.plan.parent / "token")
    refused = new_workspace(tmp_path / "open", NAMES[:2], monitoring={"address": "0.0.0.0:9464"})
    with pytest.raises(ConfigError, match="token_file"):
        load_aggregator_plan(refused.plan)
    config = workspace.configs["site-a"]
    assert load_collaborator_config(config).monitoring is None
    config.write_text(config.read_text() + toml_text({"monitoring": {"address": "127.0.0.1:0"}}))
    assert load_collaborator_config(config).monitoring == MonitoringSettings("127.0.0.1:0")


def test_a_finished_party_serves_until_scraped_once_more(folder: Path) -> None:
    endpoint = serve_monitoring(MonitoringSettings("127.0.0.1:0", final_scrape_seconds=0.0), registry_of(folder))
    try:
        assert not endpoint.final_scrape()  # nobody scraped within 0 s
        seen = endpoint.scrapes.count
        assert get(endpoint.url + "/metrics")[0] == 200
        assert endpoint.scrapes.wait_beyond(seen, 0.0)
    finally:
        endpoint.stop()


def test_a_sites_endpoint_states_its_accountants_epsilon_and_its_budget(tmp_path: Path) -> None:
    from fedfair.privacy.accounting import PrivacyAccountant, privacy_state_path
    from fedfair.privacy.ledger_home import ledger_folder

    workspace = new_workspace(tmp_path, NAMES[:2])
    path = workspace.configs["site-a"]
    path.write_text(path.read_text() + toml_text({"privacy": {"enabled": True, "budget_epsilon": 8.0}}))
    config = load_collaborator_config(path)
    collector = site_metrics.SiteCollector(config)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    assert not any(key[0] == "fedfair_site_epsilon_spent" for key in samples(generate_latest(registry).decode()))
    identity = data_identity(config.data)
    accountant = PrivacyAccountant(
        privacy_state_path(ledger_folder(), "site-a", identity), federation="f", data=identity
    )
    accountant.spend(1.1, 0.01, 20)
    scraped = samples(generate_latest(registry).decode())
    spent = scraped["fedfair_site_epsilon_spent", (("accounting", "dp_sgd"), ("site", "site-a"))]
    assert spent == pytest.approx(accountant.epsilon(config.privacy.delta, config.privacy.accountant), rel=1e-12)
    assert spent > 0
    assert scraped["fedfair_site_epsilon_budget", (("site", "site-a"),)] == 8.0
    assert scraped["fedfair_site_dp_sgd_steps_total", (("site", "site-a"),)] == 20


def test_the_collector_serves_nothing_before_the_first_event(tmp_path: Path) -> None:
    assert samples(generate_latest(registry_of(tmp_path / "empty")).decode()) == {}
    EventLog(tmp_path / "empty").emit("start", federation_id="f", rounds=2, collaborators=["a"], plan_digest="d")
    scraped = samples(generate_latest(registry_of(tmp_path / "empty")).decode())
    assert scraped["fedfair_rounds_completed_total", ()] == 0 and scraped["fedfair_rounds_planned", ()] == 2


def test_the_grafana_dashboard_queries_only_declared_families() -> None:
    dashboard = json.loads((OPERATIONS.parent / "grafana-dashboard.json").read_text())
    declared = {**metrics.FAMILIES, **site_metrics.FAMILIES}
    used = set()
    for panel in dashboard["panels"]:
        assert panel["description"] and panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"\bfedfair_[a-z_]+", target["expr"]):
                base = re.sub(r"_(count|sum)$", "", name) if name not in declared else name
                assert base in declared, f"{panel['title']}: {name} is no family of fedfair's"
                used.add(base)
    must = ("rounds_aborted_total", "site_dropouts_total", "worst_group_risk_upper", "site_epsilon_spent")
    assert {f"fedfair_{name}" for name in must} <= used


@pytest.mark.slow
def test_the_aggregator_serves_while_it_runs_and_stops_with_it(tmp_path: Path) -> None:
    """A real two-round federation in threads: the endpoint answers at the URL its event names, then is gone."""
    from fedfair.runtime.observe.events import read_events
    from tests.runtime.harness import thread_federation

    monitoring = {"address": "127.0.0.1:0", "final_scrape_seconds": 0.0}
    workspace = new_workspace(tmp_path, NAMES[:2], training={"rounds": 2}, monitoring=monitoring)
    answers: list[tuple[int, str]] = []
    with thread_federation(workspace) as federation:
        while not answers and not federation.summary and not federation.errors:
            urls = [event["url"] for event in read_events(workspace.output) if event["event"] == "monitoring"]
            if urls:
                answers.append(get(urls[0] + "/metrics"))
                answers.append(get(urls[0] + "/status.json"))
            time.sleep(0.05)
        federation.join()
    assert not federation.errors, federation.errors
    (url,) = [event["url"] for event in read_events(workspace.output) if event["event"] == "monitoring"]
    assert answers[0][0] == 200 and "fedfair_federation_info" in answers[0][1]
    assert answers[1][0] == 200 and json.loads(answers[1][1])["federation_id"] == federation.plan.federation_id
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/metrics", timeout=10)


def test_mutual_tls_admits_only_a_client_the_ca_signed(folder: Path, tmp_path: Path) -> None:
    certs, strangers = tmp_path / "certs", tmp_path / "strangers"
    pki.init_ca(certs)
    pki.issue(certs, "aggregator", "aggregator", hosts=["127.0.0.1"])
    pki.issue(certs, "collaborator", "prometheus")
    pki.init_ca(strangers)
    pki.issue(strangers, "collaborator", "prometheus")
    settings = MonitoringSettings(
        "127.0.0.1:0",
        cert_file=certs / "aggregator.crt",
        key_file=certs / "aggregator.key",
        client_ca_file=certs / "ca.crt",
    )
    assert MonitoringSettings("0.0.0.0:9464", **{key: getattr(settings, key) for key in CERTS}).problem() is None
    endpoint = serve_monitoring(settings, registry_of(folder))
    assert endpoint.url.startswith("https://127.0.0.1:")

    def scrape(client: Path | None) -> str:
        context = ssl.create_default_context(cafile=certs / "ca.crt")
        if client is not None:
            context.load_cert_chain(client / "prometheus.crt", client / "prometheus.key")
        with urllib.request.urlopen(endpoint.url + "/metrics", timeout=30, context=context) as answer:
            return str(answer.read().decode())

    silent = socket.create_connection(("127.0.0.1", int(endpoint.url.rpartition(":")[2])))  # never says a word
    try:
        assert "fedfair_rounds_completed_total 4.0" in scrape(certs)  # not held up by the silent one
        for client in (None, strangers):
            with pytest.raises(OSError):  # the handshake fails (urllib's URLError and ssl's errors are OSErrors)
                scrape(client)
    finally:
        silent.close()
        endpoint.stop()
    with pytest.raises(ConfigError, match="client_ca_file asks for mutual TLS"):
        serve_monitoring(MonitoringSettings("127.0.0.1:0", client_ca_file=certs / "ca.crt"), CollectorRegistry())
    with pytest.raises(ConfigError, match="cannot be loaded"):
        broken = MonitoringSettings("127.0.0.1:0", cert_file=certs / "ca.crt", key_file=certs / "missing.key")
        serve_monitoring(broken, CollectorRegistry())
