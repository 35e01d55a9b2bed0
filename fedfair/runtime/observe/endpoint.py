"""A party's monitoring endpoint: Prometheus metrics and pages over HTTP, on loopback unless guarded.

``[monitoring]`` (in the aggregator's plan or a collaborator's config) names the address and, off loopback,
a bearer token's file (``Authorization: Bearer TOKEN``, what Prometheus's ``authorization.credentials_file``
sends) or mutual TLS (a server certificate and the CA of the clients it admits). ``/metrics`` is the
standard text format from a ``prometheus_client`` registry whose collectors read the party's own files at
each scrape; the other paths are the pages a party serves (the aggregator's status page). Deployment only:
never part of a plan's digest.

Why: docs/operations.md, "Monitoring".
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from fedfair.core.errors import ConfigError
from fedfair.core.tables import ADDRESS_RE, Table
from fedfair.runtime.observe.unserved import UnservedConnections

logger = logging.getLogger("fedfair.monitoring")

SECTION = "monitoring"
KEYS = ("address", "token_file", "cert_file", "key_file", "client_ca_file", "final_scrape_seconds")
DEFAULT_ADDRESS = "127.0.0.1:9464"
"""Loopback, on the port range Prometheus's exporters use; the aggregator and a site on one machine give
each its own port."""

DEFAULT_FINAL_SCRAPE_SECONDS = 15.0
"""How long a finished party keeps serving for one more scrape: Prometheus's usual scrape interval, so the
final round's figures reach it."""

METRICS_PATH = "/metrics"

IDLE_SECONDS = 10.0
"""How long a connection may stay silent in each read of its request (or TLS handshake) before it is closed:
a scrape takes milliseconds, and each silent connection holds a thread until then."""

Page = Callable[[], tuple[str, bytes]]
"""A page a party serves beside its metrics: called per request, returns (content type, body)."""

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True)
class MonitoringSettings:
    """Where a party's endpoint listens (``host:port``; port 0: any free one) and its token's file, if any."""

    address: str = DEFAULT_ADDRESS
    token_file: Path | None = None
    final_scrape_seconds: float = DEFAULT_FINAL_SCRAPE_SECONDS
    """The longest a finished party waits for one more scrape of its metrics before it stops serving."""
    cert_file: Path | None = None
    """With `key_file`: serve HTTPS with this certificate (PEM)."""
    key_file: Path | None = None
    client_ca_file: Path | None = None
    """Admit only clients whose certificate this CA (PEM) signed: mutual TLS (needs `cert_file`)."""

    @property
    def host(self) -> str:
        """The host part, IPv6 brackets removed."""
        return self.address.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        """The port part (0: the system picks a free one)."""
        return int(self.address.rpartition(":")[2])

    def problem(self) -> str | None:
        """Why these settings may not be served, or None: an endpoint off loopback needs a token."""
        if (self.cert_file is None) != (self.key_file is None):
            return "[monitoring] cert_file and key_file go together (HTTPS needs both); give both or neither"
        if self.client_ca_file is not None and self.cert_file is None:
            return "[monitoring] client_ca_file asks for mutual TLS, which needs cert_file and key_file too"
        if self.token_file is None and self.client_ca_file is None and not is_loopback(self.host):
            return (
                f"[monitoring] address = {self.address!r} is not a loopback address, so anyone who reaches it "
                "could read the federation's metrics; set [monitoring] token_file to a file holding a secret "
                "token (Prometheus sends it with authorization.credentials_file), or cert_file, key_file and "
                "client_ca_file for mutual TLS, or bind to 127.0.0.1"
            )
        return None


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only: ``localhost`` or an address in 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # any other name may resolve anywhere


def parse_monitoring(where: str, data: Mapping[str, Any], base: Path) -> MonitoringSettings | None:
    """The file's ``[monitoring]`` section (None when it has none); relative paths are relative to `base`."""
    if SECTION not in data:
        return None
    table = Table.of(where, data, SECTION, KEYS)
    address = table.string("address", DEFAULT_ADDRESS, expected='host:port, e.g. "127.0.0.1:9464"')
    match = ADDRESS_RE.fullmatch(address)
    if match is None or not 0 <= int(match.group(2)) <= 65535:
        table.bad("address", address, 'host:port with a port in 0..65535 (0: any free port), e.g. "127.0.0.1:9464"')
    token_file, cert_file, key_file, client_ca_file = (
        table.path(key, base) if table.given(key) else None
        for key in ("token_file", "cert_file", "key_file", "client_ca_file")
    )
    final = table.number(
        "final_scrape_seconds",
        DEFAULT_FINAL_SCRAPE_SECONDS,
        check=lambda x: 0 <= x <= 3600,
        expected="seconds in [0, 3600] (how long a finished party waits for one more scrape)",
    )
    settings = MonitoringSettings(address, token_file, float(final), cert_file, key_file, client_ca_file)
    problem = settings.problem()
    if problem is not None:
        table.fail(problem)
    return settings


def read_token(path: Path) -> str:
    """The token in `path` (surrounding whitespace dropped); a ConfigError when it is missing or empty."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"[monitoring] token_file {path} cannot be read ({error}); write a secret token into it "
            "(e.g. `openssl rand -hex 32 > FILE`)"
        ) from None
    if not token:
        raise ConfigError(f"[monitoring] token_file {path} is empty; write a secret token into it")
    return token


def guarded(app: WsgiApp, token: str | None) -> WsgiApp:
    """`app`, answering 401 to any request whose ``Authorization`` is not ``Bearer`` `token` (None: open)."""
    if token is None:
        return app
    expected = f"Bearer {token}".encode()

    def check(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
        if not hmac.compare_digest(given, expected):  # constant time: the token is not guessed byte by byte
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
            return [b"a bearer token is required (Authorization: Bearer TOKEN)\n"]
        return app(environ, start_response)

    return check


class Scrapes:
    """How many times the metrics were served, and a wait for the next time."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def served(self) -> None:
        """Count one more scrape."""
        with self._changed:
            self.count += 1
            self._changed.notify_all()

    def wait_beyond(self, count: int, timeout: float) -> bool:
        """Wait until more than `count` scrapes were served, at most `timeout` seconds; whether they were."""
        with self._changed:
            return self._changed.wait_for(lambda: self.count > count, timeout)


def routed(metrics: WsgiApp, pages: Mapping[str, Page], scrapes: Scrapes | None = None) -> WsgiApp:
    """One app: `metrics` at :data:`METRICS_PATH` (counted in `scrapes`), each of `pages` at its path, else 404."""

    def route(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO") or "/")
        if path == METRICS_PATH:
            answer = list(metrics(environ, start_response))  # collected now: a scrape counts once it is answered
            if scrapes is not None:
                scrapes.served()
            return answer
        page = pages.get(path)
        if page is None:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"no page {path}; see {METRICS_PATH} or {', '.join(sorted(pages)) or 'nothing else'}\n".encode()]
        content_type, body = page()
        start_response("200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))])
        return [body]

    return route


class _Server(ThreadingMixIn, WSGIServer):
    """One thread per request, never joined at close (a slow scraper cannot hold the party's exit).

    Its handlers close a connection silent for `idle_seconds` and count it in `unserved`.
    """

    daemon_threads = True
    request_queue_size = 128
    """Connections the kernel holds for accept (socketserver's default, 5, dropped a burst's SYNs: each
    7th of 100 quick connections, a scrape among them, waited 1 s for its retransmission)."""
    idle_seconds: float
    unserved: UnservedConnections


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    """No line per request on stderr: the console is the progress bar's (fedfair.runtime.observe.logs).

    A connection that stays silent, fails the TLS handshake or is dropped before its answer is closed and
    counted (one line per burst, :mod:`fedfair.runtime.observe.unserved`), not a traceback on stderr.
    """

    server: _Server

    def setup(self) -> None:
        """Set up the streams, each read of the request bounded by the server's `idle_seconds`."""
        super().setup()
        self.connection.settimeout(self.server.idle_seconds)

    def handle(self) -> None:
        """Serve the request; a connection the client left idle or broken is closed and counted."""
        try:
            super().handle()
        except TimeoutError:  # raised by a read of the request or the TLS handshake (ssl's timeouts too)
            reason = f"silent for {self.server.idle_seconds:g} s"
        except ssl.SSLError:
            reason = "TLS handshake or record refused"
        except ConnectionError:
            reason = "dropped by the client"
        else:
            return
        self.server.unserved.closed(reason)  # wsgiref serves one request per connection: it closes next

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base class's signature
        """Log nothing."""


def tls_context(settings: MonitoringSettings) -> ssl.SSLContext:
    """The server side of HTTPS per `settings` (TLS 1.2 at least; client certificates when a client CA is given).

    Raises:
        ConfigError: a certificate, key or CA file cannot be loaded, naming it.
    """
    cert, key = settings.cert_file, settings.key_file
    if cert is None or key is None:
        raise ConfigError("[monitoring] cert_file and key_file go together (HTTPS needs both); give both or neither")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
        if settings.client_ca_file is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(settings.client_ca_file)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(
            f"[monitoring] cert_file, key_file or client_ca_file cannot be loaded ({error}); give PEM files "
            "(`fedfair pki` writes them)"
        ) from None
    return context


@dataclass
class Endpoint:
    """A serving endpoint: its URL (the bound port) and how to stop it."""

    server: _Server
    thread: threading.Thread
    url: str
    scrapes: Scrapes
    settings: MonitoringSettings

    def final_scrape(self) -> bool:
        """Keep serving until the metrics are scraped once more (at most ``final_scrape_seconds``); whether they were.

        Called once the party's work is done, so the last figures reach Prometheus before the process ends.
        """
        return self.scrapes.wait_beyond(self.scrapes.count, self.settings.final_scrape_seconds)

    def stop(self) -> None:
        """Stop serving, close the socket and log the connections closed unserved since the last line (idempotent)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5.0)
        self.server.unserved.flush()


def serve_monitoring(
    settings: MonitoringSettings,
    registry: Any,
    pages: Mapping[str, Page] | None = None,
    *,
    idle_seconds: float = IDLE_SECONDS,
) -> Endpoint:
    """Serve `registry` (a ``prometheus_client`` CollectorRegistry) and `pages` per `settings` in a daemon thread.

    A connection silent for `idle_seconds` in any read of its request is closed, before any token check.

    Raises:
        ConfigError: the settings may not be served (:meth:`MonitoringSettings.problem`), the token file is
            unreadable, or the address cannot be bound (naming it and the fix).
    """
    from prometheus_client import make_wsgi_app  # the HTTP stack only for a party that serves metrics

    problem = settings.problem()
    if problem is not None:
        raise ConfigError(problem)
    if not idle_seconds > 0:
        raise ValueError(f"idle_seconds = {idle_seconds!r}: give a positive number of seconds")
    token = read_token(settings.token_file) if settings.token_file is not None else None
    scrapes = Scrapes()
    app = guarded(routed(make_wsgi_app(registry), pages or {}, scrapes), token)
    server_class = _Server6 if ":" in settings.host else _Server
    try:
        server = make_server(settings.host, settings.port, app, server_class, _Quiet)
    except OSError as error:
        raise ConfigError(
            f"the monitoring endpoint cannot listen on {settings.address} ({error}); choose another "
            "[monitoring] address (port 0 takes any free one)"
        ) from None
    assert isinstance(server, _Server)  # make_server builds the class it is given
    server.idle_seconds = idle_seconds
    server.unserved = UnservedConnections(logger)
    if settings.cert_file is not None:
        # The handshake happens in each request's thread (on its first read), not in the accepting one,
        # where a client that connects and stays silent would hold every other scrape up.
        server.socket = tls_context(settings).wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    port = server.server_address[1]
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    thread = threading.Thread(target=server.serve_forever, name="fedfair-monitoring", daemon=True)
    thread.start()
    scheme = "http" if settings.cert_file is None else "https"
    endpoint = Endpoint(server, thread, f"{scheme}://{host}:{port}", scrapes, settings)
    guards = [word for word, on in (("token", token), ("client certificate", settings.client_ca_file)) if on]
    logger.info("monitoring on %s%s (%s)", endpoint.url, METRICS_PATH, " and ".join(guards) or "open: loopback")
    return endpoint
