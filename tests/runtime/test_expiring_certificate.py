"""A site whose client certificate expires mid-run is a leaver by another cause: the federation goes on without it.

Real processes over loopback mutual TLS. site-c's certificate (signed by the federation's CA with the project's
own helpers) is valid for a minute past the start; site-c takes part in round 1 and is then paused (SIGSTOP) until
that minute is over, so the expiry lands mid-run on any machine. Once its notAfter passes, the aggregator refuses its calls
(the certificate's window is re-checked at every call, ``transport.security.PeerAuthenticator``), site-c stops with
``certificate-expired`` naming its certificate file, and every round applies: a round it left after masking is
re-summed by the sites that stayed (docs/security.md, "Verified aggregation").
"""

from __future__ import annotations

import datetime as dt
import signal
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.runtime.aggregator.checkpoint import read_round_log
from tests.runtime.harness import Processes, new_workspace

NAMES = ("site-a", "site-b", "site-c")
ROUNDS = 6
VALID_SECONDS = 60.0
"""How long site-c's certificate outlives the test's start: the processes start (torch) and round 1 runs in it."""
ROUND_TIMEOUT_SECONDS = 15.0
"""How long each later round waits for the paused site-c before going on without it. The rounds after round 1
therefore last at least (ROUNDS - 1) x 15 s > VALID_SECONDS, so the run outlives the expiry on any machine; with
5 s, a loaded machine's slow start left too little of the minute, and the federation ended before site-c woke."""


def short_lived(certs: Path, name: str, seconds: float) -> dt.datetime:
    """Re-sign `name`'s certificate in `certs` for its own key, valid until `seconds` from now; return its notAfter."""
    ca_certificate, ca_key = pki.load_certificate(certs / "ca.crt"), pki.load_private_key(certs / "ca.key")
    key = pki.load_private_key(certs / f"{name}.key")
    # A day's validity (the least a certificate is signed for) that began a day less `seconds` ago.
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=1) + dt.timedelta(seconds=seconds)
    certificate = pki.sign_request(
        pki.create_request(name, key), ca_certificate, ca_key, "collaborator", days=1, not_before=start
    )
    (certs / f"{name}.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return certificate.not_valid_after_utc


@pytest.mark.slow
def test_a_certificate_that_expires_mid_run_costs_no_round(tmp_path: Path, processes: Processes) -> None:
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": ROUNDS, "local_steps": 1},
        quorum={"min_collaborators": 2, "round_timeout_seconds": ROUND_TIMEOUT_SECONDS},
    )
    expires = short_lived(workspace.certs, "site-c", VALID_SECONDS)
    aggregator = processes.aggregator(workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES}
    # Once site-c has taken part in round 1 it is paused while the run goes on, until its notAfter has passed: the
    # certificate expires mid-run whatever the machine's speed (an expiry at a set second would land anywhere).
    while not any("site-c" in record["contributors"] for record in read_round_log(workspace.output)):
        assert dt.datetime.now(dt.UTC) < expires, "site-c's certificate expired before round 1: " + processes.tail()
        assert aggregator.process.poll() is None, processes.tail()
        time.sleep(0.05)
    sites["site-c"].process.send_signal(signal.SIGSTOP)
    time.sleep(max(0.0, (expires - dt.datetime.now(dt.UTC)).total_seconds()) + 1.0)
    sites["site-c"].process.send_signal(signal.SIGCONT)
    assert sites["site-c"].wait(120) not in (0, None), processes.tail()
    assert aggregator.wait(240) == 0, processes.tail()
    for name in NAMES[:2]:
        assert sites[name].wait(60) == 0, processes.tail()

    said = [line for line in processes.log.getvalue().splitlines() if "certificate-expired" in line]
    assert said and "site-c.crt" in said[0] and "expired on" in said[0], processes.tail()
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * ROUNDS, log
    with_c = [record["round"] for record in log if "site-c" in record["contributors"]]
    # Mid-run: site-c took part, then every later round went on without it.
    assert with_c and with_c == list(range(1, len(with_c) + 1)) and len(with_c) < ROUNDS, with_c
