"""One live process per identity, and a quiet console, as deployed: real processes over loopback mutual TLS.

A collaborator started twice must not take part twice (both would train and upload, and secure
aggregation would void the rounds): the aggregator refuses the second task stream, naming the
site and where it and the running process came from; the refused process exits non-zero at once;
the running one is untouched, and the federation applies every round. Meanwhile the aggregator's
console shows a progress bar instead of per-round lines (those go to its log file), and a caller
that is no TLS client at all leaves no line of gRPC's own on it.

The aggregator and both processes of site-a are processes; site-b and site-c, which only have to take
part, are `Collaborator`s in threads of the test (two process start-ups spared).
"""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fedfair.runtime.output_folder import FINAL_SUMMARY_NAME
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from tests.runtime.harness import Processes, new_workspace

pytestmark = pytest.mark.slow
NAMES = ["site-a", "site-b", "site-c"]


def wait_for(condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s")


def test_a_second_process_of_a_connected_site_is_refused_and_exits_non_zero(
    tmp_path: Path, processes: Processes
) -> None:
    rounds = 8
    # A quorum of every site: the rounds wait for site-c, which starts only after the duplicate was refused.
    workspace = new_workspace(
        tmp_path, NAMES, training={"rounds": rounds}, quorum={"min_collaborators": 3}, aggregator={"report": True}
    )
    aggregator = processes.aggregator(workspace)
    first = processes.collaborator(workspace, "site-a")
    others = {name: Collaborator(load_collaborator_config(workspace.configs[name])) for name in NAMES[1:]}
    with ThreadPoolExecutor(max_workers=len(others), thread_name_prefix="test-collaborator") as pool:
        try:
            statuses = {"site-b": pool.submit(others["site-b"].run)}
            wait_for(lambda: any("site-a connected" in line for line in aggregator.lines), 120)

            wait_for(lambda: any("site-a: joined federation" in line for line in first.lines), 60)
            second = processes.collaborator(workspace, "site-a")
            assert second.wait(120) == 2, processes.tail()
            said = "\n".join(second.lines)
            assert "identity-in-use" in said and "'site-a' is already connected from 127.0.0.1:" in said, said
            # The auditor meets the same refusal: the fix names either kind of process.
            assert "run one process per institution (a site's collaborator, or the auditor)" in said, said
            # Refused before it ever said it joined: the aggregator never took its task stream.
            assert "joined" not in said and "identity-in-use" in second.lines[-1], said
            refusal = [line for line in aggregator.lines if "refused WaitForTasks from 'site-a'" in line]
            assert refusal and "ALREADY_EXISTS" in refusal[0], refusal
            assert "second process (from 127.0.0.1:" in refusal[0], refusal
            assert first.process.poll() is None, "the running process must be untouched"

            host, port = workspace.address.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10) as stranger:
                stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")  # no TLS: the handshake fails in gRPC's core
                stranger.recv(1024)

            statuses["site-c"] = pool.submit(others["site-c"].run)
            processes.finish(aggregator)
            assert {name: status.result(timeout=60) for name, status in statuses.items()} == dict.fromkeys(NAMES[1:], 0)
        finally:
            for collaborator in others.values():
                collaborator.stop()
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * rounds
    assert all(record["contributors"] == NAMES for record in log)
    summary = json.loads((workspace.output / FINAL_SUMMARY_NAME).read_text())
    assert summary["applied_rounds"] == rounds and summary["aborted_rounds"] == 0
    # One closing line per process, the last: the outcome, and what it kept where (each file there).
    closing = aggregator.lines[-1]
    assert (
        f" INFO finished: {rounds} of {rounds} rounds applied, 0 aborted; held-out evaluation: worst-group risk "
        in (closing)
        and f", round {rounds})" in closing
    )
    kept = "the model bundle model_bundle.pt, the report report.html, the round log rounds.jsonl"
    assert closing.endswith(f"; kept in {workspace.output}: {kept}"), closing
    assert all((workspace.output / name).is_file() for name in ("model_bundle.pt", "report.html", "rounds.jsonl"))
    federation = summary["federation_id"]
    bundles = {name: path.parent / f"{name}.{federation}.model_bundle.pt" for name, path in workspace.configs.items()}
    assert all(bundle.is_file() for bundle in bundles.values())
    counted = f"by its own record, its model holds this institution's update in {rounds} of {rounds} rounds"
    assert first.lines[-1].endswith(
        f" INFO site-a: the federation has finished; {counted}; the model bundle is in {bundles['site-a']}, checked "
        f"against the output model this collaborator evaluated (use it: fedfair predict --model {bundles['site-a']} "
        "--data TABLE --out PREDICTIONS.csv)"
    ), first.lines[-1]
    for child in (aggregator, first):  # the 100% line once, before the closing line
        complete = [number for number, line in enumerate(child.lines) if f"{rounds}/{rounds} rounds (100%)" in line]
        assert len(complete) == 1 and complete[0] < len(child.lines) - 1, "\n".join(child.lines)

    # The console: connections, the progress and the closing line; per-round lines only in the log file.
    console = "\n".join(aggregator.lines)
    assert "round 1 applied" not in console and f"aggregator: {rounds}/{rounds} rounds (100%)" in console
    assert "Handshake failed" not in console and ".cc:" not in console, console
    logged = (workspace.output / "aggregator.log").read_text()
    assert all(f"round {number} applied" in logged for number in range(1, rounds + 1))
