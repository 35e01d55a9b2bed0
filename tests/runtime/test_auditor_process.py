"""The auditor's process against the aggregator's real service: loopback mutual TLS, the federation's certificates.

The aggregator's side is its :class:`Servicer` over a :class:`Board` and a :class:`StageGate`, driven stage by stage
as its driver runs a bounded round (the round's server, names and :class:`SecureUpload` handlers of
tests/runtime/test_bounded_round.py); the sites take their stages in process through their own steps. The auditor
is the real :class:`AuditorProcess` in a thread: it dials with its auditor certificate, checks the plan, waits for
its tasks, and its uploads are what the aggregator's bounded server receives. Its local checks and its plan check
refuse with clear errors.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from fedfair import cli
from fedfair.core.errors import ConfigError, PermanentFailureError
from fedfair.pki import load_certificate, store
from fedfair.pki.roster import PlanPin, Roster, pins_from_folders, write_manifest
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.network import auditor_authenticator
from fedfair.runtime.aggregator.round_identities import aggregator_setup
from fedfair.runtime.aggregator.secure_uploads import SecureUpload
from fedfair.runtime.aggregator.servicer import Servicer, federation_server
from fedfair.runtime.auditor.config import (
    AuditorConfig,
    auditor_config_from_flags,
    check_auditor_identity,
    load_auditor_config,
)
from fedfair.runtime.auditor.process import AuditorProcess
from fedfair.runtime.collaborator.kinds.bounded import bounded_encoding
from fedfair.runtime.peer.connection import plan_change
from fedfair.runtime.peer.retries import DEFAULT_RETRY_POLICY, RetryPolicy
from fedfair.runtime.process_facts import process_started
from fedfair.runtime.collaborator.stage_steps import round_steps
from fedfair.runtime.collaborator.steps import Work
from fedfair.runtime.contract import ACCEPTED
from tests.runtime.wire_stages import BOUNDED_TRAINING
from fedfair.runtime.failures import PLAN_CHANGED, PLAN_MISMATCH
from fedfair.runtime.manifest import UNPINNED_PLAN_WARNING, load_manifest
from fedfair.runtime.plan import aggregator_plan as plan
from fedfair.runtime.transport import (
    PeerAuthenticator,
    StageGate,
    TlsFiles,
    make_binding,
    pb,
    server_credentials,
    server_options,
)
from fedfair.secagg.bounded.exchange import AUDITOR as AUDITOR_PARTY
from fedfair.secagg.bounded.stages import BOUNDED_ROUND
from fedfair.secagg.round import Opening
from tests.runtime.harness import eventually
from tests.runtime.test_bounded_round import MODEL, PARAMETERS, Federation, bounded  # noqa: F401 (the fixture)
from tests.runtime.test_input_bound import AUDITOR, federation  # noqa: F401 (the fixture)
from tests.runtime.test_manifest import COLLABORATORS
from tests.runtime.wire_stages import WIRE

QUICK = RetryPolicy(max_wait_seconds=5.0, start_wait_seconds=5.0, base_seconds=0.1, cap_seconds=0.5)
"""The auditor's back-off in these tests: an aggregator that is there answers at once."""
STAGE_SECONDS = 60.0
"""An auditor stage's deadline: the stage ends once the auditor answered, so only a failing test waits for it."""


@dataclass
class Served:
    """The aggregator's service on a loopback port, for the plan `bounded.loaded`."""

    board: Board
    gate: StageGate
    address: str


@pytest.fixture()
def served(bounded: Federation) -> Iterator[Served]:  # noqa: F811
    loaded = bounded.loaded
    ca = bounded.folder / "ca"
    ca_certificate = load_certificate(ca / "ca.crt")
    board = Board(plan.plan_digest(loaded))
    gate = StageGate(loaded.federation_id)
    gate.open(0, WIRE["STAGE_JOIN"])
    auditor = auditor_authenticator(dataclasses.replace(loaded, manifest=bounded.manifest), ca_certificate)
    assert auditor is not None
    board.verifiers = auditor.allowed_names
    servicer = Servicer(
        board,
        gate,
        PeerAuthenticator(ca_certificate, COLLABORATORS),
        plan.shared_settings(loaded),
        auditor=auditor,
        training=BOUNDED_TRAINING,
    )
    server = federation_server(servicer, len(COLLABORATORS), server_options())
    files = TlsFiles(ca / "ca.crt", ca / "aggregator.crt", ca / "aggregator.key")
    port = server.add_secure_port("127.0.0.1:0", server_credentials(files))
    server.start()
    yield Served(board, gate, f"127.0.0.1:{port}")
    board.close()
    server.stop(grace=None).wait()


def auditor_config(folder: Path, address: str, name: str = AUDITOR) -> AuditorConfig:
    """The auditor's settings as its flags give them: its files as the CA and its request left them."""
    return auditor_config_from_flags(
        cert=folder / "ca" / f"{name}.crt",
        key=folder / name / f"{name}.key",
        ca=folder / "ca" / "ca.crt",
        manifest=folder / "manifest.toml",
        aggregator=address,
        folder=folder / name,
    )


def started(config: AuditorConfig) -> tuple[AuditorProcess, threading.Thread, list[int | BaseException]]:
    """The auditor's process, running in a thread; its exit status (or what it raised) lands in the list."""
    process = AuditorProcess(config, retry=QUICK)
    outcome: list[int | BaseException] = []

    def run() -> None:
        try:
            outcome.append(process.run())
        except BaseException as error:  # noqa: BLE001 -- handed to the test, which asserts on it
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return process, thread, outcome


def test_the_auditor_process_serves_a_bounded_rounds_auditor_stages(
    bounded: Federation,  # noqa: F811
    served: Served,
) -> None:
    process, thread, outcome = started(auditor_config(bounded.folder, served.address))
    # It joins as the plan's auditor: its task stream is live, yet it is no collaborator of any round.
    assert eventually(lambda: AUDITOR in served.board.following(), 30.0), outcome
    assert served.board.connected() == frozenset()
    parameters = bounded.parameters()
    config = parameters.secagg_config(bounded.loaded.federation_id, BOUNDED_TRAINING)
    setup = aggregator_setup(bounded.held, bounded.driver.verify, parameters, BOUNDED_TRAINING)
    server = BOUNDED_ROUND.server(config, setup)
    names = BOUNDED_ROUND.names(config, setup)
    works, updates = {}, {}
    rng = np.random.default_rng(3)
    for name, me in bounded.sites.items():
        weight = bounded.loaded.influence.weight_of(name, bounded.loaded.batch_fraction)
        direction = rng.normal(size=PARAMETERS + 1)
        updates[name] = direction * (0.5 * bounded.loaded.influence.update_norm * weight / np.linalg.norm(direction))
        works[name] = Work(1, BOUNDED_TRAINING, None, weight, model=MODEL)
        works[name].encoded = bounded_encoding(updates[name], name, me.shared)
    served.board.new_round(1)
    verdicts: dict[str, bytes] = {}
    opening: Opening | None = BOUNDED_ROUND.open_sum(server)
    for spec in BOUNDED_ROUND.stages(True):
        assert opening is not None
        inputs = parameters.to_bytes() if opening.inputs is None else opening.inputs.to_bytes()
        stage = BOUNDED_TRAINING.wire(spec)
        handler = (
            None if spec.upload is None else SecureUpload(spec.upload, partial(spec.receive, server)).handler(names)
        )
        for party in opening.among:
            if party == AUDITOR_PARTY:
                continue
            name = names.name_of(party)
            upload = round_steps(BOUNDED_TRAINING)[stage](bounded.sites[name], works[name], inputs)
            if handler is None:
                verdicts[name] = bytes(upload)
            else:
                handler(name, upload)
        if AUDITOR_PARTY in opening.among:
            # The auditor's upload, over the network: it takes its task, fetches its input and uploads.
            assert handler is not None
            binding = served.gate.open(1, stage, timeout_seconds=STAGE_SECONDS, participants=(AUDITOR,))
            served.board.open_stage(
                binding, (AUDITOR,), inputs, handler, max_upload_bytes=spec.upload_bytes(config), timeout=STAGE_SECONDS
            )
            served.board.wait_stage()
            assert served.board.close_stage()[0] == {AUDITOR}, (
                f"the auditor did not answer {BOUNDED_TRAINING.name(stage)}"
            )
        assert spec.withheld is None or spec.withheld(server) is None  # the sites' tags and the auditor's add up
        if spec is BOUNDED_ROUND.sum_stages[-1]:  # the sum is made: every site that tagged it verifies its total
            opening = BOUNDED_ROUND.open_verification(server, server.finish())
        else:
            opening = None if spec.close is None else spec.close(server)
    # Every site accepted the verdict record the two verifiers' evidence makes and verified the total, which is
    # every site's sum.
    assert verdicts == dict.fromkeys(COLLABORATORS, ACCEPTED)
    result = server.finish()
    assert tuple(config.name_of(party) for party in result.contributors) == COLLABORATORS
    expected = sum(updates[name] for name in COLLABORATORS)
    assert np.max(np.abs(result.decoded.weighted_sum - expected)) <= result.decoded.error_bound
    assert process.rounds.verified == process.rounds.tagged == [1]
    served.board.finish(make_binding(bounded.loaded.federation_id, 1, WIRE["STAGE_EVAL_UNMASK"]))
    thread.join(30.0)
    assert outcome == [0]


@contextmanager
def serving(folder: Path, loaded: plan.AggregatorPlan, auditor: str) -> Iterator[str]:
    """An aggregator's service that admits `auditor` (as if its plan named it) but serves `loaded`: its address."""
    ca = folder / "ca"
    ca_certificate = load_certificate(ca / "ca.crt")
    board, gate = Board(plan.plan_digest(loaded)), StageGate(loaded.federation_id)
    gate.open(0, WIRE["STAGE_JOIN"])
    admits = PeerAuthenticator(ca_certificate, (auditor,), "auditor")
    collaborators = PeerAuthenticator(ca_certificate, COLLABORATORS)
    servicer = Servicer(
        board, gate, collaborators, plan.shared_settings(loaded), auditor=admits, training=BOUNDED_TRAINING
    )
    server = federation_server(servicer, len(COLLABORATORS), server_options())
    files = TlsFiles(ca / "ca.crt", ca / "aggregator.crt", ca / "aggregator.key")
    port = server.add_secure_port("127.0.0.1:0", server_credentials(files))
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        board.close()
        server.stop(grace=None).wait()


def test_a_plan_that_does_not_name_the_auditor_is_refused(bounded: Federation) -> None:  # noqa: F811
    other = bounded.folder / "other-audit"
    _, request = store.request_certificate(other, "other-audit", "auditor")
    store.sign_certificate(bounded.folder / "ca", request)
    # The manifest lists both auditors (the plan names audit-co): the other is refused once it reads the plan.
    both = bounded.folder / "two-auditors.toml"
    write_manifest(both, Roster("fedfair-demo", tuple(pins_from_folders([bounded.folder / "ca"])), 0, 2))
    loaded = dataclasses.replace(bounded.loaded, manifest=load_manifest(both))
    with serving(bounded.folder, loaded, "other-audit") as address:
        config = auditor_config(bounded.folder, address, "other-audit")
        _, thread, outcome = started(dataclasses.replace(config, manifest=loaded.manifest))
        thread.join(30.0)
    (error,) = outcome
    assert isinstance(error, PermanentFailureError) and error.failure is PLAN_MISMATCH
    assert "plan does not fit this auditor: it names 'audit-co' as its auditor, not 'other-audit'" in str(error)
    assert 'input_bound = "two_verifiers", auditor = "other-audit"' in str(error)


def test_the_command_line_refuses_bad_input_naming_the_fix(
    federation: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    address = "127.0.0.1:9"

    def start(*flags: str) -> str:
        assert cli.main(["auditor", "start", *flags]) == 2
        return capsys.readouterr().err

    files = [
        "--folder",
        str(federation / "logs"),
        "--cert",
        str(federation / "ca" / f"{AUDITOR}.crt"),
        "--key",
        str(federation / AUDITOR / f"{AUDITOR}.key"),
        "--manifest",
        str(federation / "manifest.toml"),
        "--aggregator",
        address,
    ]
    said = start(*files[:-2])
    assert "missing --aggregator: give them, or --config auditor.toml" in said
    said = start(*files[:2], "--cert", str(federation / "nowhere.crt"), *files[4:])
    assert "--cert " in said and "nowhere.crt: no such file" in said
    # A collaborator's certificate is not an auditor's.
    site = [
        "--cert",
        str(federation / "ca" / "hospital-a.crt"),
        "--key",
        str(federation / "hospital-a" / "hospital-a.key"),
    ]
    said = start(*files[:2], *site, *files[6:])
    assert "the auditor's TLS files are unusable" in said and "not issued for the auditor role" in said
    assert "--role auditor" in said
    said = start("--config", str(federation / "auditor.toml"), *files[2:])
    assert "give --config or the flags, not both" in said


def test_local_checks_name_the_certificate_and_the_manifest(
    federation: Path,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = auditor_config(federation, "127.0.0.1:9")
    with caplog.at_level(logging.WARNING, logger="fedfair.auditor"):
        check_auditor_identity(config)  # its own files, its pin: nothing to refuse
    # The roster before `plan pin` (an operator's easy slip): the aggregator alone would say which bound is checked.
    (warned,) = [record.getMessage() for record in caplog.records if record.name == "fedfair.auditor"]
    assert warned == f"{federation / 'manifest.toml'}: {UNPINNED_PLAN_WARNING}"
    # A ca.crt never copied back (`cp ca/ca.crt NAME/certs/` skipped): the fix says whose file it is.
    files = dataclasses.replace(config.certificates, ca=federation / AUDITOR / "ca.crt")
    with pytest.raises(ConfigError) as refused:
        check_auditor_identity(dataclasses.replace(config, certificates=files))
    said = str(refused.value)
    assert f"certificate {federation / AUDITOR / 'ca.crt'} not found" in said, said
    assert "Fix: correct --cert, --key and --ca: ca.crt is the one the CA holder sends back" in said, said
    # Another federation's manifest listing an auditor of the same name, with another certificate.
    elsewhere = federation / "elsewhere"
    store.init_ca(elsewhere / "ca")
    for name, role in (("aggregator", "aggregator"), *((site, "collaborator") for site in COLLABORATORS)):
        store.issue(elsewhere / "ca", role, name)
    _, request = store.request_certificate(elsewhere / AUDITOR, AUDITOR, "auditor")
    store.sign_certificate(elsewhere / "ca", request)
    write_manifest(elsewhere / "manifest.toml", Roster("other-fed", tuple(pins_from_folders([elsewhere / "ca"])), 0, 2))
    with pytest.raises(ConfigError) as refused:
        check_auditor_identity(dataclasses.replace(config, manifest=load_manifest(elsewhere / "manifest.toml")))
    said = str(refused.value)
    assert "the certificate of 'audit-co' (sha256 " in said and " is not the one the manifest " in said, said
    assert "or --manifest names another federation's manifest (this one is federation 'other-fed')" in said, said
    other = dataclasses.replace(config, name="hospital-a")
    with pytest.raises(ConfigError, match="name = 'hospital-a' but .* certifies 'audit-co'"):
        check_auditor_identity(other)
    _, request = store.request_certificate(federation / "stranger-audit", "stranger-audit", "auditor")
    store.sign_certificate(federation / "ca", request)
    unlisted = auditor_config(federation, "127.0.0.1:9", "stranger-audit")
    with pytest.raises(ConfigError, match=r"does not list it; an auditor takes part only in a federation whose"):
        check_auditor_identity(unlisted)
    with pytest.raises(ConfigError, match="--aggregator 'nowhere': expected host:port"):
        auditor_config(federation, "nowhere")


def test_the_auditors_first_answer_wait_counts_from_its_command_as_a_sites(federation: Path) -> None:  # noqa: F811
    """[retry] start_wait_seconds counts from `started` (its command's start, which `fedfair auditor start` passes),
    as a site's does: an auditor whose command began 30 s ago, with 20 s to wait, gives up at its first failed dial
    (127.0.0.1:9 answers nothing) and names the 30 s; counted from that dial, it waited 20 s more."""
    config = auditor_config(federation, "127.0.0.1:9")
    policy = RetryPolicy(start_wait_seconds=20.0, base_seconds=0.05, cap_seconds=0.2)
    began = time.monotonic()
    auditor = AuditorProcess(config, retry=policy, started=began - 30.0)
    with pytest.raises(PermanentFailureError) as caught:
        auditor.run()
    assert time.monotonic() - began < 10.0  # one dial refused at once, not the 20 s wait again
    message = str(caught.value)
    assert message.startswith("aggregator-never-answered: nothing answered at 127.0.0.1:9 for "), message
    waited = re.search(r"for (\d+) s since", message)
    assert waited is not None and 30 <= int(waited[1]) < 40, message


def test_the_auditors_wait_for_a_first_answer_names_the_auditor_and_its_section(
    federation: Path,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The shared peer's lines and its never-answered failure name the party that runs them and its file's section:
    an auditor's say [auditor] and log as fedfair.auditor, where they said [collaborator] and "this collaborator"."""
    config = auditor_config(federation, "127.0.0.1:9")  # answers nothing
    policy = RetryPolicy(start_wait_seconds=0.5, base_seconds=0.05, cap_seconds=0.2)
    with caplog.at_level(logging.INFO), pytest.raises(PermanentFailureError) as caught:
        AuditorProcess(config, retry=policy).run()
    message = str(caught.value)
    assert "since this auditor started" in message and "that [auditor] aggregator names its host and port" in message
    assert "start this auditor again" in message and "collaborator" not in message, message
    waiting = [record for record in caplog.records if "no answer yet from the aggregator" in record.getMessage()]
    assert waiting and {record.name for record in waiting} == {"fedfair.auditor"}
    assert all("[auditor] aggregator names its host and port" in record.getMessage() for record in waiting)
    said = [record for record in caplog.records if record.name.startswith("fedfair.")]
    assert said and not [record for record in said if record.name == "fedfair.collaborator"]


def test_the_auditor_command_counts_the_wait_from_the_process_start(
    federation: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`fedfair auditor start` passes its process's start: with a wait shorter than this process has run, its first
    refused dial ends it, naming at least the process's age (counted from the dial, it named 0 s)."""
    folder = federation / AUDITOR
    (folder / "auditor.toml").write_text(
        f'[auditor]\nname = "{AUDITOR}"\naggregator = "127.0.0.1:9"\nmanifest = "../manifest.toml"\n'
        f'[certificates]\ndir = "../ca"\nkey = "../{AUDITOR}/{AUDITOR}.key"\n[retry]\nstart_wait_seconds = 0.001\n'
    )
    age = time.monotonic() - process_started()
    assert age >= 1.0  # this test process imported gRPC and numpy: the named seconds tell the clocks apart
    assert cli.main(["auditor", "start", "--config", str(folder / "auditor.toml")]) == 2
    error = capsys.readouterr().err
    waited = re.search(r"aggregator-never-answered: nothing answered at 127\.0\.0\.1:9 for (\d+) s", error)
    assert waited is not None and int(waited[1]) >= int(age), (age, error)


@pytest.mark.parametrize(("signum", "said"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C (SIGINT)")])
def test_a_signal_stops_an_auditor_waiting_for_its_aggregator_with_128_plus_it_and_its_closing_line(
    federation: Path,  # noqa: F811
    signum: signal.Signals,
    said: str,
) -> None:
    """`fedfair auditor start` as a real process, waiting for an aggregator nobody serves (127.0.0.1:9 refuses;
    the wait for a first answer is 45 s): SIGTERM, as systemd, Docker or `timeout` send it, stops it as Ctrl-C
    does, within seconds, with 128 + the signal (143, 130) and a closing line naming the stop and where its state
    is kept. SIGTERM ended it on the spot (-15, no line); Ctrl-C returned 130 with no line."""
    folder = federation / AUDITOR
    command = [sys.executable, "-m", "fedfair.cli", "auditor", "start", "--aggregator", "127.0.0.1:9"]
    command += ["--cert", str(federation / "ca" / f"{AUDITOR}.crt"), "--key", str(folder / f"{AUDITOR}.key")]
    command += ["--manifest", str(federation / "manifest.toml"), "--folder", str(folder)]
    console = federation / "console.txt"
    with console.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True)
        try:
            # Its first refused dial says it waits (on the console): the signal handlers are in place by then.
            assert eventually(lambda: "no answer yet from the aggregator" in console.read_text(), 120), (
                console.read_text()
            )
            began = time.monotonic()
            process.send_signal(signum)
            status = process.wait(60)
        finally:
            process.kill()
    # Within the back-off's next pause (at most 1 s) on a loaded machine too, well before the 45 s wait's end.
    assert time.monotonic() - began < 20.0
    lines = console.read_text().strip().splitlines()
    assert status == 128 + signum, lines
    closing = f"{AUDITOR}: stopped by {said}; what it keeps of the federation (totals.json, noise.secret) is in"
    assert closing in lines[-1] and str(folder) in lines[-1], lines[-3:]  # its closing line comes last
    assert "start it again with the same command and folder" in lines[-1]


def test_the_auditors_watchdog_logs_as_the_auditor(
    federation: Path,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The shared idle watchdog's lines (its waiting line, its aggregator-silent error) log as fedfair.auditor
    when the auditor runs it, where they logged as fedfair.collaborator: on a 1 s idle timeout, a line every 0.25 s
    of waiting for the first task, then the expiry (with no connection, nothing to close)."""
    config = dataclasses.replace(auditor_config(federation, "127.0.0.1:9"), idle_timeout_seconds=1.0)
    watchdog = AuditorProcess(config, retry=QUICK).connection.watchdog
    with caplog.at_level(logging.INFO), watchdog.watching():
        assert eventually(lambda: watchdog.expired is not None, 60)
    waiting = [r for r in caplog.records if r.getMessage().startswith(f"{AUDITOR}: waiting for the first task")]
    silent = [r for r in caplog.records if r.getMessage().startswith(f"{AUDITOR}: aggregator-silent: ")]
    assert waiting and len(silent) == 1, caplog.text
    assert {record.name for record in waiting + silent} == {"fedfair.auditor"}
    assert not [record for record in caplog.records if record.name == "fedfair.collaborator"]


def test_a_folder_restored_in_part_is_refused_before_the_auditor_dials(federation: Path) -> None:  # noqa: F811
    """totals.json recording a total without noise.secret beside it: named at construction, with no aggregator
    (127.0.0.1:9 answers nothing), where it was named only once an aggregator served the plan."""
    config = auditor_config(federation, "127.0.0.1:9")
    config.folder.mkdir(parents=True, exist_ok=True)
    entry = {"federation_id": "fedfair-demo", "round": 1, "model": "0" * 64, "sites": ["hospital-a", "hospital-b"]}
    (config.folder / "totals.json").write_text(json.dumps([entry]))
    with pytest.raises(ConfigError, match=r"noise\.secret is missing beside .*totals\.json, which records totals"):
        AuditorProcess(config, retry=QUICK)


def test_its_file_names_its_files_as_a_collaborators_does_and_refuses_unknown_keys(federation: Path) -> None:  # noqa: F811
    folder = federation / AUDITOR
    (folder / "auditor.toml").write_text(
        f'[auditor]\nname = "{AUDITOR}"\naggregator = "127.0.0.1:9"\nmanifest = "../manifest.toml"\n'
        f'[certificates]\ndir = "../ca"\nkey = "../{AUDITOR}/{AUDITOR}.key"\n'
    )
    config = load_auditor_config(folder / "auditor.toml")
    assert config.certificates == TlsFiles(
        federation / "ca" / "ca.crt", federation / "ca" / f"{AUDITOR}.crt", folder / f"{AUDITOR}.key"
    )
    assert (config.folder, config.aggregator_name, config.manifest.source) == (
        folder,
        "aggregator",
        federation / "manifest.toml",
    )
    check_auditor_identity(config)
    assert config.retry == DEFAULT_RETRY_POLICY
    with (folder / "auditor.toml").open("a") as file:
        file.write("[retry]\nmax_wait_seconds = 60\nfirst_delay_seconds = 2\n")
    retry = load_auditor_config(folder / "auditor.toml").retry
    assert (retry.max_wait_seconds, retry.base_seconds) == (60.0, 2.0)
    with (folder / "auditor.toml").open("a") as file:
        file.write("max_delay_seconds = 1\n")
    with pytest.raises(ConfigError, match=r"\[retry\] max_delay_seconds = 1 is below first_delay_seconds = 2"):
        load_auditor_config(folder / "auditor.toml")
    (folder / "auditor.toml").write_text('[auditor]\nname = "audit-co"\naggregator = "127.0.0.1:9"\nmanifests = "m"\n')
    with pytest.raises(ConfigError, match="manifests"):
        load_auditor_config(folder / "auditor.toml")


def test_the_process_exits_as_a_site_refusing_a_plan_when_the_plan_bounds_no_input(
    bounded: Federation,  # noqa: F811
) -> None:
    secure = dataclasses.replace(bounded.loaded.secure_aggregation, input_bound="none", auditor=None)
    unbounded = dataclasses.replace(bounded.loaded, secure_aggregation=secure)
    folder = bounded.folder
    with serving(folder, unbounded, AUDITOR) as address:
        command = [sys.executable, "-m", "fedfair.cli", "auditor", "start", "--aggregator", address]
        command += ["--cert", str(folder / "ca" / f"{AUDITOR}.crt"), "--key", str(folder / AUDITOR / f"{AUDITOR}.key")]
        command += ["--manifest", str(folder / "manifest.toml"), "--folder", str(folder / "logs")]
        finished = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    # A plan-mismatch, as a collaborator's refused plan: the status of every FedfairError (2), one line naming why.
    assert finished.returncode == 2, finished.stderr
    said = finished.stderr.strip().splitlines()[-1]
    assert said.startswith("fedfair: error: plan-mismatch: the aggregator's plan does not fit ")
    assert ": it declares no input bound, not 'audit-co'; an auditor verifies only for a plan that names it" in said
    assert f'auditor = "{AUDITOR}"' in said
    assert (folder / "logs" / f"{AUDITOR}.log").is_file()


def test_a_plan_changed_under_the_auditor_names_the_auditor_its_file_and_the_fields(
    bounded: Federation,  # noqa: F811
) -> None:
    """The auditor's plan-changed speaks of the auditor and its own [auditor] file, and lists the changed fields."""
    assert bounded.loaded.manifest is not None
    pin = PlanPin({"federation_id": "fedfair-demo", "training": {"rounds": 2}})
    manifest = dataclasses.replace(bounded.loaded.manifest, plan=pin)
    served = {"federation_id": "fedfair-demo", "training": {"rounds": 3}}
    reply = pb.PlanReply(settings=json.dumps(served).encode(), plan_digest="another")
    assert plan_change("auditor", manifest, "another", reply) is None  # the digest it joined under
    error = plan_change("auditor", manifest, "joined", reply)
    assert isinstance(error, PermanentFailureError) and error.failure is PLAN_CHANGED
    said = str(error)
    assert "not the one this auditor holds (pinned -> served: training.rounds: 2 -> 3)" in said
    assert "points [auditor] manifest at it and starts this auditor again" in said
    assert "collaborator" not in said
