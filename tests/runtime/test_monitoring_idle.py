"""Idle and broken connections to a monitoring endpoint: closed after a bounded wait, one log line per burst.

Real sockets on loopback (issue 79: 100 silent connections printed 100 tracebacks, 100 KB of stderr).
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fedfair import pki
from fedfair.runtime.observe.endpoint import Endpoint, MonitoringSettings, serve_monitoring
from fedfair.runtime.observe.unserved import UnservedConnections
from tests.runtime.test_monitoring import get

IDLE = 1.0
SILENT = 40
SLACK = 20.0
"""Seconds a closing may lag the idle bound on a loaded 2-core machine (a thread's wake-up, not the bound)."""


def closing_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fedfair.monitoring" and "closed" in r.getMessage()]


def port_of(endpoint: Endpoint) -> int:
    return int(endpoint.url.rpartition(":")[2])


def seconds_until_closed(connection: socket.socket, opened: float) -> float:
    """Seconds from `opened` until the server closed `connection` (it sends nothing before closing)."""
    connection.settimeout(IDLE + SLACK)
    assert connection.recv(1) == b""  # an orderly close; a timeout here fails the test with socket's error
    return time.monotonic() - opened


def test_silent_connections_are_closed_after_the_bound_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="fedfair.monitoring")
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    endpoint = serve_monitoring(MonitoringSettings("127.0.0.1:0", token_file), CollectorRegistry(), idle_seconds=IDLE)
    try:
        opened = time.monotonic()
        silent = [socket.create_connection(("127.0.0.1", port_of(endpoint))) for _ in range(SILENT)]
        halfway = socket.create_connection(("127.0.0.1", port_of(endpoint)))
        halfway.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # stalls in its headers, before the token check
        for connection in [*silent, halfway]:
            assert IDLE <= seconds_until_closed(connection, opened) <= IDLE + SLACK
            connection.close()
        # The endpoint still serves, and still checks the token.
        assert get(endpoint.url + "/metrics")[0] == 401
        assert get(endpoint.url + "/metrics", "s3cret-token")[0] == 200
        assert len(closing_lines(caplog)) <= 1  # the burst is gathered, not said per connection
    finally:
        endpoint.stop()
    [line] = closing_lines(caplog)
    expected = rf"closed {SILENT + 1} idle or broken monitoring connections in the last \d+\.\d s without a request "
    assert re.fullmatch(expected + rf"\(silent for {IDLE:g} s: {SILENT + 1}\)", line), line
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err[:2000]


def test_failed_handshakes_and_silent_tls_connections_print_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="fedfair.monitoring")
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
    endpoint = serve_monitoring(settings, CollectorRegistry(), idle_seconds=IDLE)

    def handshake(client: Path) -> ssl.SSLSocket:
        context = ssl.create_default_context(cafile=certs / "ca.crt")
        context.load_cert_chain(client / "prometheus.crt", client / "prometheus.key")
        raw = socket.create_connection(("127.0.0.1", port_of(endpoint)), timeout=IDLE + SLACK)
        return context.wrap_socket(raw, server_hostname="127.0.0.1")

    try:
        opened = time.monotonic()
        silent = [socket.create_connection(("127.0.0.1", port_of(endpoint))) for _ in range(3)]
        for _ in range(2):
            with pytest.raises(OSError):  # refused: a certificate another CA signed (TLS 1.3 says so on a read)
                with handshake(strangers) as stranger:
                    stranger.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    stranger.recv(1)
        for connection in silent:
            assert IDLE <= seconds_until_closed(connection, opened) <= IDLE + SLACK
            connection.close()
        with handshake(certs) as admitted:  # still serves the client its CA signed
            admitted.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert admitted.recv(12) == b"HTTP/1.0 200"
    finally:
        endpoint.stop()
    [line] = closing_lines(caplog)
    assert line.startswith("closed 5 idle or broken monitoring connections") and f"silent for {IDLE:g} s: 3" in line
    assert "TLS handshake or record refused: 2" in line
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err[:2000]


def test_a_burst_is_said_once_when_its_window_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fedfair.monitoring")
    window = 0.5
    unserved = UnservedConnections(logging.getLogger("fedfair.monitoring"), window)
    for reason in ("silent for 10 s",) * 5 + ("dropped by the client",):
        unserved.closed(reason)
    assert closing_lines(caplog) == []  # gathered until the window ends
    deadline = time.monotonic() + window + SLACK
    while not closing_lines(caplog) and time.monotonic() < deadline:
        time.sleep(0.05)
    [line] = closing_lines(caplog)
    assert line.startswith("closed 6 idle or broken monitoring connections in the last")
    assert line.endswith("(silent for 10 s: 5, dropped by the client: 1)")
    unserved.closed("dropped by the client")  # a later burst: its own line
    unserved.flush()
    unserved.flush()  # nothing more to say
    assert len(closing_lines(caplog)) == 2 and closing_lines(caplog)[1].startswith("closed 1 idle or broken")
    assert "connection in the last" in closing_lines(caplog)[1]  # singular
    with pytest.raises(ValueError, match="positive number of seconds"):
        UnservedConnections(logging.getLogger("fedfair.monitoring"), 0.0)
