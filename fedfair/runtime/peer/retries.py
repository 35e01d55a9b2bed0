"""How a party dialling the aggregator tells a passing fault from a permanent one, and waits out the passing ones.

Transient failures are retried with jittered exponential back-off, one log line per retry, until
the outage has lasted ``[retry] max_wait_seconds``. Before the aggregator has answered once it is
tried every second at most, with one console line, until ``[retry] start_wait_seconds``, then
:data:`~fedfair.runtime.failures.NEVER_ANSWERED`. The wait ends early when the party (a collaborator, the
auditor) is asked to stop; nothing waits on a fixed sleep. A permanent failure raises
:class:`~fedfair.core.errors.PermanentFailureError` at once.

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import grpc
from cryptography import x509

from fedfair.core.errors import FailureError, PermanentFailureError
from fedfair.core.tables import Table
from fedfair.runtime.failures import (
    CERTIFICATE_EXPIRED,
    CERTIFICATE_NOT_FEDERATIONS,
    WRONG_CA_FILE,
    AGGREGATOR_BUSY,
    IDENTITY_IN_USE,
    AGGREGATOR_ERROR,
    AGGREGATOR_NAME_MISMATCH,
    AGGREGATOR_NOT_TRUSTED,
    AGGREGATOR_UNREACHABLE,
    CERTIFICATE_REFUSED,
    CERTIFICATE_REVOKED,
    CONNECTION_LOST,
    GAVE_UP,
    NAME_NOT_ALLOWED,
    NEVER_ANSWERED,
    TLS_FAILED,
)
from fedfair.runtime.observe.logs import LOG_FILE_ONLY
from fedfair.runtime.transport import TlsFiles
from fedfair.runtime.transport.security import REVOKED

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)
"""Codes that may be transient: the aggregator is down or slow, or still holds this collaborator's
previous stream (it allows two per name) until it notices the old connection is gone.
UNAVAILABLE is also what a failed TLS handshake gives: :func:`probe` tells the two apart."""

PROBE_SECONDS = 5.0
"""How long the diagnostic dial may take: a permanent failure is reported within this."""

STARTING_SECONDS = 60.0
"""A transient outage younger than this is logged at INFO: collaborators may start before their aggregator,
and one restarting with --resume is back within it. Past it every retry line is a WARNING."""

START_POLL_SECONDS = 1.0
"""The longest delay between two tries of an aggregator never reached yet: a refused dial costs nothing,
and a site started before its aggregator should join within about this long of it coming up."""

START_LOG_SECONDS = 30.0
"""While waiting for an aggregator never reached, it says what it tried this often (console and log file)."""

CONFIRM_SECONDS = 0.5
"""Pause before dialling again to confirm that the aggregator closes connections after the handshake."""

_HOSTNAME_MISMATCH_CODES = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame

_T = TypeVar("_T")


@dataclass(frozen=True)
class RetryPolicy:
    """Jittered exponential back-off bounded in time.

    Retry k waits uniform(0.5, 1) * min(cap, base * 2^k), and an outage ends the collaborator once it has lasted
    `max_wait_seconds` (or, when `attempts` is given, after that many retries in a row, whichever comes first).
    Until the aggregator has answered once, the delay is at most :data:`START_POLL_SECONDS` and the bound is
    `start_wait_seconds`.
    """

    max_wait_seconds: float = 900.0
    start_wait_seconds: float = 45.0
    base_seconds: float = 0.5
    cap_seconds: float = 15.0
    attempts: int | None = None

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before retry `attempt`: :meth:`delay_bound` jittered down by up to half."""
        return rng.uniform(0.5, 1.0) * self.delay_bound(attempt)

    def delay_bound(self, attempt: int) -> float:
        """The longest delay before retry `attempt` (the jitter takes it down to half)."""
        return min(self.cap_seconds, self.base_seconds * 2.0**attempt)


DEFAULT_RETRY_POLICY = RetryPolicy()

RETRY_KEYS = ("max_wait_seconds", "start_wait_seconds", "first_delay_seconds", "max_delay_seconds")
"""The keys of [retry]: RetryPolicy's bounds in time (an outage; an aggregator never reached), first and largest delay."""


def retry_policy(source: str, data: Mapping[str, object]) -> RetryPolicy:
    """[retry] of a collaborator's or the auditor's file: how long an unreachable aggregator is waited for.

    Also the back-off's first and largest delay; the defaults stand where a key or the section is left out.
    """
    t = Table.of(source, data, "retry", RETRY_KEYS)
    d = DEFAULT_RETRY_POLICY
    max_wait = t.number("max_wait_seconds", d.max_wait_seconds, check=lambda x: x > 0, expected="seconds > 0")
    start_wait = t.number("start_wait_seconds", d.start_wait_seconds, check=lambda x: x > 0, expected="seconds > 0")
    first = t.number("first_delay_seconds", d.base_seconds, check=lambda x: x > 0, expected="seconds > 0")
    largest = t.number("max_delay_seconds", d.cap_seconds, check=lambda x: x > 0, expected="seconds > 0")
    if largest < first:
        t.fail(f"[retry] max_delay_seconds = {largest:g} is below first_delay_seconds = {first:g}; raise it")
    return RetryPolicy(
        max_wait_seconds=max_wait, start_wait_seconds=start_wait, base_seconds=first, cap_seconds=largest
    )


@dataclass(frozen=True)
class Target:
    """The aggregator as a party dials it: the address, the party's own TLS files, the expected name."""

    address: str
    files: TlsFiles
    aggregator_name: str | None

    def host_and_port(self) -> tuple[str, int]:
        """The address split for a socket: the host without IPv6 brackets, and the port as an int."""
        host, _, port = self.address.rpartition(":")
        return host.strip("[]"), int(port)


def probe(target: Target, timeout: float = PROBE_SECONDS) -> FailureError | None:
    """Dial the aggregator once with Python's TLS and say what stops a connection; None if nothing does.

    gRPC reports every failed handshake as UNAVAILABLE with the TLS library's text; this
    dial reads the cause from structured errors instead: the verification code of the
    aggregator's certificate, or the alert the aggregator sends after refusing ours.
    """
    address = target.address
    host, port = target.host_and_port()
    try:
        connection = socket.create_connection((host, port), timeout=timeout)
    except OSError as error:
        return FailureError(AGGREGATOR_UNREACHABLE, address=address, reason=_os_reason(error))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(target.files.ca))
    context.load_cert_chain(str(target.files.cert), str(target.files.key))
    context.set_alpn_protocols(["h2"])
    with connection:
        try:
            with context.wrap_socket(connection, server_hostname=target.aggregator_name or host) as tls:
                # TLS 1.3 refuses a client certificate only after the handshake: the aggregator then
                # closes the connection instead of answering the HTTP/2 preface with its settings.
                tls.sendall(_HTTP2_PREFACE)
                if not tls.recv(1):
                    return PermanentFailureError(
                        CERTIFICATE_REFUSED, address=address, reason="it closed the connection after the handshake"
                    )
        except ssl.SSLCertVerificationError as error:
            if error.verify_code in _HOSTNAME_MISMATCH_CODES:
                return PermanentFailureError(
                    AGGREGATOR_NAME_MISMATCH, address=address, name=target.aggregator_name or host
                )
            return PermanentFailureError(
                AGGREGATOR_NOT_TRUSTED, address=address, ca=target.files.ca, reason=error.verify_message
            )
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as error:
            return FailureError(CONNECTION_LOST, address=address, reason=f"closed during the TLS handshake: {error}")
        except ssl.SSLError as error:
            reason = (error.reason or str(error)).lower().replace("_", " ")
            if "alert" in reason:
                return PermanentFailureError(CERTIFICATE_REFUSED, address=address, reason=reason)
            return PermanentFailureError(TLS_FAILED, address=address, reason=reason)
        except OSError as error:  # reset or timed out after the handshake: the aggregator is going away
            return FailureError(CONNECTION_LOST, address=address, reason=_os_reason(error))
    return None


def mismatched_ca(target: Target, role: str, timeout: float = PROBE_SECONDS) -> PermanentFailureError | None:
    """Which file is wrong when this party's certificate (for `role`) does not verify against its ca.crt; None: unknown.

    Either ca.crt is not the federation's (a wrong CA file) or the certificate is not from the federation's CA
    (a rogue or stray one). The aggregator's certificate tells them apart: read without verifying (nothing is
    sent), it verifies against a ca.crt that is the federation's, and shares its issuer with a certificate from
    the federation's CA. None when the aggregator cannot be reached or neither holds.
    """
    from cryptography import x509  # not loaded by a party whose files are right

    from fedfair import pki
    from fedfair.core.errors import ConfigError

    try:
        ca, own = pki.load_certificate(target.files.ca), pki.load_certificate(target.files.cert)
        pki.verify_certificate(own, ca, role)
    except pki.CertificateError:
        pass  # the mismatch this tells apart
    except ConfigError:
        return None  # a file missing or unreadable: the local check's own message says which
    else:
        return None
    host, port = target.host_and_port()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as connection,
            context.wrap_socket(connection, server_hostname=target.aggregator_name or host) as tls,
        ):
            presented = tls.getpeercert(binary_form=True)
    except (OSError, ValueError):  # ssl.SSLError is an OSError: unreachable, or no handshake to read
        return None
    if presented is None:
        return None
    aggregator = x509.load_der_x509_certificate(presented)
    try:
        pki.verify_certificate(aggregator, ca, "aggregator")
    except pki.CertificateError:
        if aggregator.issuer == own.issuer:
            issuer = own.issuer.rfc4514_string()
            return PermanentFailureError(WRONG_CA_FILE, ca=target.files.ca, address=target.address, issuer=issuer)
        return None
    return PermanentFailureError(
        CERTIFICATE_NOT_FEDERATIONS, cert=target.files.cert, ca=target.files.ca, address=target.address
    )


def _os_reason(error: OSError) -> str:
    if isinstance(error, TimeoutError | socket.timeout):
        return "no answer in time"
    return (error.strerror or str(error)).lower()


def not_permitted(error: grpc.RpcError, name: str) -> PermanentFailureError:
    """A PERMISSION_DENIED: a revoked certificate when the aggregator says so, else a name it does not allow."""
    if error.details() == REVOKED:
        return PermanentFailureError(CERTIFICATE_REVOKED, name=name)
    return PermanentFailureError(NAME_NOT_ALLOWED, name=name)


def certificate_expired(files: TlsFiles) -> PermanentFailureError | None:
    """CERTIFICATE_EXPIRED naming this party's certificate once its notAfter has passed; else None."""
    try:
        not_after = x509.load_pem_x509_certificate(files.cert.read_bytes()).not_valid_after_utc
    except (OSError, ValueError):
        return None  # unreadable now: the handshake's own diagnosis says why
    if dt.datetime.now(dt.UTC) <= not_after:
        return None
    return PermanentFailureError(CERTIFICATE_EXPIRED, cert=files.cert, expired=f"{not_after:%Y-%m-%d %H:%M:%S}")


def classify(error: grpc.RpcError, what: str, target: Target, certified_name: str, role: str) -> FailureError:
    """The failure class of an RPC a party of `role` made; permanent ones as :class:`PermanentFailureError`.

    An UNAVAILABLE is diagnosed by :func:`probe`: it is a failed handshake as often as a down aggregator.
    """
    code = error.code()
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAVAILABLE):
        # Mid-run an expired certificate is refused per call (PERMISSION_DENIED), and at a new handshake.
        expired = certificate_expired(target.files)
        if expired is not None:
            return expired
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return not_permitted(error, certified_name)
    if code == grpc.StatusCode.UNAVAILABLE:
        diagnosed = probe(target)
        if diagnosed is not None and diagnosed.failure is CERTIFICATE_REFUSED:
            # An aggregator shutting down also closes a fresh connection: only a second refusal is one.
            time.sleep(CONFIRM_SECONDS)
            diagnosed = probe(target)
        if diagnosed is not None:
            return diagnosed
        return FailureError(CONNECTION_LOST, address=target.address, reason=f"unavailable while {what}")
    return refusal(error, what, target.address, role=role)


class Backoff:
    """One party's retries: classify each failure, stop on a permanent one, wait out the others.

    `stop` (set from another thread) cuts a wait short. `role` is the party's ("collaborator", "auditor"): its lines
    log as ``fedfair.<role>`` and name it and its config file's section ([collaborator], [auditor]).
    """

    def __init__(
        self,
        policy: RetryPolicy,
        name: str,
        stop: threading.Event,
        target: Target,
        certified_name: str,
        *,
        role: str,
    ) -> None:
        self.policy = policy
        self.role = role
        self.logger = logging.getLogger(f"fedfair.{role}")
        self.name = name
        self.stop = stop
        self.target = target
        self.certified_name = certified_name
        self.random = random.Random()
        self.reached = False
        """Whether the aggregator has answered this party once (it is then waited for as a lost one)."""
        self.pause: Callable[[float], bool] = stop.wait
        """How every retry waits out its delay: `stop.wait`, which a stop cuts short. One place, so the delays
        chosen can be read (by wrapping it) without timing the waits."""
        self._next_start_line = 0.0
        self.started: float | None = None
        """When the operator's wait for a first answer began (time.monotonic()): under `collaborator start`, the
        process's start (:func:`~fedfair.runtime.process_facts.process_started`), since imports and the table take seconds of the operator's
        wait on a busy machine; None counts from the first dial."""

    def classify(self, error: grpc.RpcError, what: str) -> FailureError:
        """`error` as a failure class; raises at once when it is permanent."""
        failure = classify(error, what, self.target, self.certified_name, self.role)
        if not failure.failure.transient:
            raise failure
        return failure

    def retry(self, attempt: int, since: float, failure: FailureError, what: str) -> None:
        """Wait before retry number `attempt` of an outage that began at `since` (time.monotonic()).

        Raises:
            FailureError: once the outage has outlasted the policy: `failure` itself when its class
                ``waits``, else one of :data:`GAVE_UP`.
        """
        policy = self.policy
        elapsed = time.monotonic() - since
        if not self.reached:
            self.wait_for_start(attempt, elapsed if self.started is None else time.monotonic() - self.started, failure)
            return
        if elapsed >= policy.max_wait_seconds or (policy.attempts is not None and attempt >= policy.attempts):
            if failure.failure.waits:
                raise failure
            raise FailureError(
                GAVE_UP,
                address=self.target.address,
                what=what,
                seconds=elapsed,
                reason=failure.failure.id,
            )
        # An aggregator not up yet, or restarting, is usual: a WARNING only once the outage lasts.
        quiet = failure.failure.transient and elapsed < STARTING_SECONDS
        self.wait(attempt, str(failure).split(". Fix: ")[0] if attempt else str(failure), quiet=quiet)

    def wait_for_start(self, attempt: int, elapsed: float, failure: FailureError) -> None:
        """Wait for an aggregator that never answered: a short delay, one console line, then few file lines.

        `elapsed` is the seconds since :attr:`started` (or since the first dial).

        Raises:
            FailureError: :data:`NEVER_ANSWERED` once `start_wait_seconds` have passed (or `attempts` retries).
        """
        policy = self.policy
        if elapsed >= policy.start_wait_seconds or (policy.attempts is not None and attempt >= policy.attempts):
            raise PermanentFailureError(
                NEVER_ANSWERED,
                address=self.target.address,
                seconds=elapsed,
                reason=str(failure).split(". Fix: ")[0],
                role=self.role,
            )
        delay = self.random.uniform(0.5, 1.0) * min(START_POLL_SECONDS, policy.delay_bound(attempt))
        if attempt == 0 or elapsed >= self._next_start_line:
            # On the console too: a wrong port is otherwise silent until the wait's end.
            self._next_start_line = elapsed + START_LOG_SECONDS
            self.logger.info(
                "%s: no answer yet from the aggregator at %s after %.0f s (%s); trying every second, %.0f s in all "
                "(then it stops: check the aggregator runs and [%s] aggregator names its host and port)",
                self.name,
                self.target.address,
                elapsed,
                str(failure).split(". Fix: ")[0],
                policy.start_wait_seconds,
                self.role,
            )
        self.pause(delay)

    def wait(self, attempt: int, why: str, *, quiet: bool = False) -> None:
        """One log line, then the jittered delay of retry `attempt` (cut short by `stop`).

        The line is a WARNING unless `quiet`; a quiet line is INFO, and after the first retry it goes to
        the log file only (:data:`~fedfair.runtime.observe.logs.LOG_FILE_ONLY`): the console says once that it
        waits, not every few seconds while an aggregator starts.
        """
        delay = self.policy.delay(attempt, self.random)
        level, extra = (logging.INFO, LOG_FILE_ONLY if attempt else None) if quiet else (logging.WARNING, None)
        self.logger.log(level, "%s: %s; retry %d in %.1f s", self.name, why, attempt + 1, delay, extra=extra)
        self.pause(delay)

    def call(self, what: str, call: Callable[[], _T], refuse: Callable[[_T], FailureError | None] | None = None) -> _T:
        """Return `call()`, retried with back-off while its failure is transient.

        It is also retried while `refuse(result)` returns a failure of a class that ``waits``.

        Raises:
            FailureError: a permanent failure at once, or (see :meth:`retry`) once the wait outlasts the policy.
        """
        attempt, since = 0, time.monotonic()
        while True:
            try:
                result = call()
                self.reached = True
                failure = None if refuse is None else refuse(result)
                if failure is None:
                    return result
            except grpc.RpcError as error:
                failure = self.classify(error, what)
            if self.stop.is_set():
                raise failure from None
            self.retry(attempt, since, failure, what)
            attempt += 1


def refusal(error: grpc.RpcError, what: str, address: str = "its address", *, role: str) -> FailureError:
    """A gRPC failure of a party of `role` as its class from its status code alone (no diagnostic dial)."""
    code = error.code()
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return not_permitted(error, f"this {role}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return FailureError(AGGREGATOR_BUSY, address=address)
    if code == grpc.StatusCode.ALREADY_EXISTS:  # another process holds this institution's identity
        return PermanentFailureError(IDENTITY_IN_USE, details=error.details())
    if code in RETRYABLE:
        return FailureError(AGGREGATOR_UNREACHABLE, address=address, reason=f"{code.name.lower()} while {what}")
    return PermanentFailureError(AGGREGATOR_ERROR, code=code.name, what=what)
