"""Each failure class of the collaborator over real mutual TLS on loopback: its exact message, and in time.

The aggregator is the real mTLS gRPC server with the real servicer (`serve`: it answers
GetPlan, no rounds run). A permanent failure must end the collaborator at once (no retry waited
for) with its class's message; a transient one is retried, one line per retry, until the
aggregator appears. What the retries wait is read from the delays they choose (`Backoff.pause`),
not timed, so the tests hold on a loaded machine.
"""

from __future__ import annotations

import io
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedfair import pki
from fedfair.core.errors import PermanentFailureError
from fedfair.runtime.aggregator.network import Network, serve
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.peer.retries import START_POLL_SECONDS, Backoff, RetryPolicy, Target, probe
from fedfair.runtime.failures import (
    AGGREGATOR_NAME_MISMATCH,
    AGGREGATOR_NOT_TRUSTED,
    CERTIFICATE_NOT_FEDERATIONS,
    CERTIFICATE_REFUSED,
    WRONG_CA_FILE,
    FEDERATION_MISMATCH,
    NAME_NOT_ALLOWED,
)
from fedfair.runtime.local.workspace import Workspace, toml_text
from fedfair.runtime.observe.logs import ROUTINE, Console
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest
from fedfair.runtime.transport import TlsFiles
from tests.runtime.harness import eventually, new_workspace

NAMES = ["site-a", "site-b"]
QUICK = RetryPolicy(max_wait_seconds=60.0, base_seconds=0.05, cap_seconds=0.2)


def config_file(workspace: Workspace, name: str, **sections: dict[str, Any]) -> Path:
    """A collaborator.toml for `name` in its own folder, with sections' keys replaced or added."""
    content: dict[str, dict[str, Any]] = {
        "collaborator": {
            "name": name,
            "aggregator": workspace.address,
            "aggregator_name": "aggregator",
            "federation": "fedfair-launch",
            "device": "cpu",
        },
        "certificates": {"dir": str(workspace.certs)},
        "data": {"dataset": "adult", "partition": "race", "index": 0},
    }
    for section, values in sections.items():
        content.setdefault(section, {}).update(values)
    path = workspace.root / f"{name}-{len(list(workspace.root.glob('*.toml')))}.toml"
    path.write_text(toml_text(content))
    return path


def pauses_of(collaborator: Collaborator) -> list[float]:
    """The delays `collaborator`'s retries wait from now on, in order (each still waited)."""
    pauses: list[float] = []
    pause = collaborator.backoff.pause

    def recorded(seconds: float) -> bool:
        pauses.append(seconds)
        return pause(seconds)

    collaborator.backoff.pause = recorded
    return pauses


def stopped_at_once(path: Path) -> str:
    """Start a collaborator from `path`; it must stop with a permanent failure without waiting out a retry."""
    pauses: list[float] = []
    with pytest.raises(PermanentFailureError) as caught:
        collaborator = Collaborator(load_collaborator_config(path), retry=QUICK)  # local checks stop it here
        pauses = pauses_of(collaborator)
        collaborator.run()
    assert pauses == [], str(caught.value)
    return str(caught.value)


@pytest.fixture(scope="module")
def aggregator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    root = tmp_path_factory.mktemp("failures")
    workspace = new_workspace(root, NAMES)
    pki.issue(workspace.certs, "collaborator", "mallory")
    other = root / "other-ca"
    pki.init_ca(other)
    pki.issue(other, "collaborator", "site-a")
    plan = load_aggregator_plan(workspace.plan)
    network: Network = serve(plan, plan_digest(plan))
    try:
        yield workspace
    finally:
        network.stop()


def test_an_aggregator_certificate_from_another_ca(aggregator: Workspace) -> None:
    other = aggregator.root / "other-ca"
    message = stopped_at_once(config_file(aggregator, "site-a", certificates={"dir": str(other)}))
    assert message == AGGREGATOR_NOT_TRUSTED.message(
        address=aggregator.address, ca=other / "ca.crt", reason="unable to get local issuer certificate"
    )


def test_an_own_certificate_from_another_ca_is_named_the_rogue_file(aggregator: Workspace) -> None:
    """Its ca.crt is the federation's, its certificate another CA's: the aggregator's certificate says which."""
    other = aggregator.root / "other-ca"
    certificates = {"dir": str(aggregator.certs), "cert": str(other / "site-a.crt"), "key": str(other / "site-a.key")}
    message = stopped_at_once(config_file(aggregator, "site-a", certificates=certificates))
    assert message == CERTIFICATE_NOT_FEDERATIONS.message(
        cert=other / "site-a.crt", ca=aggregator.certs / "ca.crt", address=aggregator.address
    )


def test_a_wrong_ca_file_is_named_with_its_fix(aggregator: Workspace) -> None:
    """Its certificate is the federation's, its ca.crt another CA's: the fix is the federation's ca.crt."""
    other = aggregator.root / "other-ca"
    certificates = {"dir": str(aggregator.certs), "ca": str(other / "ca.crt")}
    message = stopped_at_once(config_file(aggregator, "site-a", certificates=certificates))
    issuer = pki.load_certificate(aggregator.certs / "ca.crt").subject.rfc4514_string()
    assert message == WRONG_CA_FILE.message(ca=other / "ca.crt", address=aggregator.address, issuer=issuer)
    assert "put the federation's ca.crt at" in message


def test_a_certificate_mismatch_with_nobody_serving_keeps_the_local_message(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, NAMES)  # nobody serves its address
    other = tmp_path / "other-ca"
    pki.init_ca(other)
    message = stopped_at_once(
        config_file(workspace, "site-a", certificates={"dir": str(workspace.certs), "ca": str(other / "ca.crt")})
    )
    assert message.startswith("local-certificates: this collaborator's own TLS files are unusable: ")
    assert "does not verify against this federation's CA" in message


def test_a_wrong_aggregator_name(aggregator: Workspace) -> None:
    message = stopped_at_once(config_file(aggregator, "site-a", collaborator={"aggregator_name": "aggregator-2"}))
    assert message == AGGREGATOR_NAME_MISMATCH.message(address=aggregator.address, name="aggregator-2")


def test_a_name_not_on_the_allow_list(aggregator: Workspace) -> None:
    message = stopped_at_once(config_file(aggregator, "mallory"))
    assert message == NAME_NOT_ALLOWED.message(name="mallory")
    assert "ask the operator to add 'mallory' to [federation] collaborators" in message


def test_another_federations_aggregator(aggregator: Workspace) -> None:
    message = stopped_at_once(config_file(aggregator, "site-a", collaborator={"federation": "another-federation"}))
    assert message == FEDERATION_MISMATCH.message(
        address=aggregator.address, theirs="fedfair-launch", ours="another-federation"
    )


def test_the_probe_names_a_refused_collaborator_certificate(aggregator: Workspace) -> None:
    """What the aggregator does to a certificate from another CA (past the local check), seen by the diagnostic dial."""
    other = aggregator.root / "other-ca"
    files = TlsFiles(ca=aggregator.certs / "ca.crt", cert=other / "site-a.crt", key=other / "site-a.key")
    diagnosed = probe(Target(aggregator.address, files, "aggregator"))
    assert diagnosed is not None and diagnosed.failure is CERTIFICATE_REFUSED
    assert probe(Target(aggregator.address, TlsFiles.in_folder(aggregator.certs, "site-a"), "aggregator")) is None


def test_local_failures_stop_before_connecting(tmp_path: Path) -> None:
    """A wrong data path, a header-only CSV, a missing certificate: with nobody serving the address."""
    workspace = new_workspace(tmp_path, NAMES)
    header_only = tmp_path / "empty.csv"
    header_only.write_text("age,bmi,outcome\n")
    missing = tmp_path / "nowhere.csv"
    for data, start in (
        (
            {"csv": str(missing), "label": "outcome"},
            f"local-data: this institution's data cannot be loaded: data file {missing} not found; check the path (CSV or Parquet)",
        ),
        ({"csv": str(header_only), "label": "outcome"}, "local-data: this institution's data cannot be loaded: "),
    ):
        path = config_file(workspace, "site-a", data=data)
        with_csv = path.read_text().replace('dataset = "adult"\npartition = "race"\nindex = 0\n', "")
        path.write_text(with_csv)
        message = stopped_at_once(path)
        assert message.startswith(start) and message.endswith(f"Fix: correct [data] in {path}")
        assert "Traceback" not in message and "IndexError" not in message
    path = config_file(workspace, "site-a", certificates={"cert": "missing.crt"})
    message = stopped_at_once(path)
    assert message.startswith("local-certificates: ") and "missing.crt" in message


@pytest.mark.slow
def test_a_site_started_first_waits_in_one_line_polls_every_second_at_most_and_joins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The default back-off (0.5 s doubling to 15 s) is capped at START_POLL_SECONDS while the aggregator has
    never answered, so a site started first joins within about a second of the aggregator coming up."""
    workspace = new_workspace(tmp_path, NAMES)
    policy = RetryPolicy()
    collaborator = Collaborator(load_collaborator_config(workspace.configs["site-a"]), retry=policy)
    pauses = pauses_of(collaborator)
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(collaborator.run()), daemon=True)
    with caplog.at_level(logging.INFO, logger="fedfair.collaborator"):
        thread.start()
        # Long past the back-off's growth: retry 3's bound (4 s) is well over the poll's.
        assert policy.delay_bound(3) > START_POLL_SECONDS and eventually(lambda: len(pauses) > 3)
        plan = load_aggregator_plan(workspace.plan)
        network = serve(plan, plan_digest(plan))
        try:
            joined = eventually(lambda: "joined federation fedfair-launch" in caplog.text)
        finally:
            collaborator.stop()
            network.stop()
            thread.join(10)
    assert joined and 0 < max(pauses) <= START_POLL_SECONDS, pauses
    waits = [r for r in caplog.records if "no answer yet from the aggregator" in r.getMessage()]
    assert len(waits) == 1 and waits[0].levelno == logging.INFO, [r.getMessage() for r in waits]
    assert "connection refused" in waits[0].getMessage() and "45 s in all" in waits[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "aggregator" in r.getMessage()]
    assert not thread.is_alive()


def test_a_port_nobody_answers_on_ends_with_a_clear_error_after_the_stated_time(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, NAMES)
    policy = RetryPolicy(start_wait_seconds=1.5, base_seconds=0.05, cap_seconds=0.2)
    collaborator = Collaborator(load_collaborator_config(workspace.configs["site-a"]), retry=policy)
    pauses = pauses_of(collaborator)
    started = time.monotonic()
    with pytest.raises(PermanentFailureError) as caught:
        collaborator.run()
    assert time.monotonic() - started >= 1.5  # not before the stated time (a loaded machine only adds to it)
    # Nor much after: it waits only while the stated time has not passed, each wait at most the policy's cap.
    assert sum(pauses[:-1]) < 1.5 and max(pauses) <= 0.2, pauses
    message = str(caught.value)
    assert message.startswith(f"aggregator-never-answered: nothing answered at {workspace.address} for ")
    assert "connection refused" in message and "raise [retry] start_wait_seconds" in message


@pytest.mark.parametrize("verbose", [False, True])
def test_an_aggregator_that_is_starting_costs_the_console_one_line(tmp_path: Path, verbose: bool) -> None:
    """Quiet retries (a transient outage younger than STARTING_SECONDS): the console shows the first and
    leaves the rest to the log file unless verbose; a WARNING (an outage that lasts) always shows."""
    log = logging.getLogger("fedfair.collaborator")
    stream = io.StringIO()
    console = Console("site-a", stream, verbose=verbose)
    console.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(console)
    # Another test in this worker may have configured logging: this logger must pass INFO to the console.
    # setLevel, not `.level =`: only setLevel clears the cache of isEnabledFor's earlier answers.
    level, disabled, log.disabled = log.level, log.disabled, False
    log.setLevel(logging.INFO)
    stop = threading.Event()
    stop.set()  # no delay is waited out
    target = Target("127.0.0.1:1", TlsFiles(tmp_path / "ca", tmp_path / "crt", tmp_path / "key"), None)
    backoff = Backoff(QUICK, "site-a", stop, target, "site-a", role="collaborator")
    try:
        for attempt in range(4):
            backoff.wait(attempt, "aggregator-unreachable: not up yet", quiet=True)
        backoff.wait(4, "aggregator-unreachable: still not up", quiet=False)
    finally:
        log.removeHandler(console)
        log.setLevel(level)
        log.disabled = disabled
    lines = stream.getvalue().splitlines()
    quiet = [line for line in lines if line.startswith("INFO ")]
    assert len(quiet) == (4 if verbose else 1) and "retry 1 in" in quiet[0]
    assert (
        [line for line in lines if line.startswith("WARNING ")]
        == [line for line in lines if "still not up; retry 5 in" in line]
        != []
    )


@pytest.mark.slow
def test_a_wrong_port_says_what_it_tried_every_30_s_and_stops_within_a_minute_with_its_fix(
    tmp_path: Path, caplog: pytest.CaptureFixture[str]
) -> None:
    """The default [retry]: a port nobody serves (the aggregator's, with no aggregator on it) is named on the
    console at once and again every 30 s, and the collaborator stops after 45 s with aggregator-never-answered and
    its fix: before any round, and not five silent minutes later."""
    workspace = new_workspace(tmp_path, NAMES)
    config = load_collaborator_config(workspace.configs["site-a"])
    assert config.retry.start_wait_seconds == 45.0
    collaborator = Collaborator(config)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="fedfair.collaborator"), pytest.raises(PermanentFailureError) as caught:
        collaborator.run()
    took = time.monotonic() - started
    assert 45.0 <= took < 45.0 + 15.0, took  # the stated wait, and the last try's dial and pause at most
    said = [r for r in caplog.records if "no answer yet from the aggregator" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO] * 2 and all("connection refused" in r.getMessage() for r in said)
    # Said at once and again once 30 s have passed: on a busy machine the retry that says it may come a little late.
    after = [int(match[1]) for record in said if (match := re.search(r"after (\d+) s", record.getMessage()))]
    assert after[0] == 0 and 30 <= after[1] < 45, after
    assert not any(getattr(r, ROUTINE, False) for r in said)  # each reaches the console, not only the log file
    message = str(caught.value)
    # The wait ends at the first try past 45 s, and a try comes every 0.5 to 1 s: the seconds said round that
    # moment, 45 or 46 s on an idle machine, never more than the run took.
    waited = re.match(
        rf"aggregator-never-answered: nothing answered at {re.escape(workspace.address)} for (\d+) s", message
    )
    assert waited is not None and 45 <= int(waited[1]) <= took + 0.5, (message, took)
    assert "[collaborator] aggregator names its host and port" in message
