"""Mutual TLS for the federation: credentials from the certs folder, identity from certificates.

The aggregator serves only with ``require_client_auth=True`` and the federation's CA
as the sole root; a collaborator connects only with its own certificate and the same
CA. There is no insecure mode. A peer's identity is the name in the certificate it
presented during the handshake (checked again here against the CA and the role),
never a field of any message, and a name outside the plan's allow-list gets the
same generic PERMISSION_DENIED as any other refusal.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.core.errors import ConfigError, Refusal, RefusedError
from fedfair.core.tables import Table
from fedfair.runtime.transport.stage_gate import NOT_PERMITTED
from fedfair.runtime.transport.chunks import MAX_MESSAGE_BYTES

KEEPALIVE_MS = 60_000  # the collaborator pings a quiet long-lived task stream this often
KEEPALIVE_TIMEOUT_MS = 20_000


@dataclass(frozen=True)
class TlsFiles:
    """The three files a participant needs: the federation's CA, its certificate and key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_folder(cls, directory: Path | str, name: str) -> TlsFiles:
        """ca.crt, NAME.crt and NAME.key in one folder (the layout ``fedfair pki`` writes)."""
        directory = Path(directory)
        cert, key, _ = pki.participant_paths(directory, name)
        return cls(ca=pki.ca_paths(directory)[0], cert=cert, key=key)

    @classmethod
    def from_section(cls, where: str, data: Mapping[str, Any], base: Path, name: str) -> TlsFiles:
        """A config file's [certificates] section (dir, ca, cert, key), each path relative to `base` or to dir.

        Raises:
            ConfigError: an unknown key or a value that is not a path, naming the file and the key.
        """
        tls = Table.of(where, data, "certificates", ("dir", "ca", "cert", "key"))
        folder = tls.path("dir", base, "certs")
        return cls(
            ca=tls.path("ca", folder, "ca.crt"),
            cert=tls.path("cert", folder, f"{name}.crt"),
            key=tls.path("key", folder, f"{name}.key"),
        )


def _load_own(files: TlsFiles, role: str) -> tuple[bytes, bytes, bytes, str]:
    """Read and check the files: the certificate is from this CA, for this role, and matches the key."""
    ca_certificate = pki.load_certificate(files.ca)
    certificate = pki.load_certificate(files.cert)
    key = pki.load_private_key(files.key)
    name = pki.verify_certificate(certificate, ca_certificate, role)
    if certificate.public_key() != key.public_key():
        raise ConfigError(
            f"{files.key} does not belong to {files.cert}; use the key made with that certificate's request"
        )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pem = serialization.Encoding.PEM
    return ca_certificate.public_bytes(pem), certificate.public_bytes(pem), key_pem, name


def check_tls_files(files: TlsFiles, role: str) -> str:
    """Check a participant's own files before serving or dialling; return the certified name.

    The collaborator compares it with its configured name, the aggregator with its plan's.
    """
    return _load_own(files, role)[3]


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """The aggregator's credentials: its server certificate, client certificates required.

    A caller without a certificate from the federation's CA fails in the TLS handshake,
    inside gRPC's core: it never reaches a servicer, so it cannot hold a worker thread.
    """
    ca_pem, cert_pem, key_pem, _ = _load_own(files, "aggregator")
    return grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True)


def channel_credentials(files: TlsFiles, role: str = "collaborator") -> grpc.ChannelCredentials:
    """A client's credentials: the federation's CA as the only root, its certificate for `role` (or an auditor's)."""
    ca_pem, cert_pem, key_pem, _ = _load_own(files, role)
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem)


def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """GRPC server options: bounded messages, tolerance for the collaborators' keepalive pings, and no port sharing.

    gRPC sets SO_REUSEPORT by default, so a second aggregator on the same port would also
    listen and the kernel would split the collaborators' connections between the two;
    without it the second one's bind fails at once.
    """
    return [
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
    ]


RECONNECT_MS = 1000
"""The longest delay gRPC waits before it dials a lost or never-reached aggregator again."""


def channel_options(
    max_message_bytes: int = MAX_MESSAGE_BYTES, *, aggregator_name: str | None = None
) -> list[tuple[str, int | str]]:
    """GRPC channel options.

    Bounded messages, keepalive, a short reconnect back-off, and (optionally) the aggregator's certificate
    name to verify instead of the host in the address (e.g. when dialling an IP).

    gRPC's own reconnect back-off grows to two minutes; the collaborator's retries
    (:mod:`fedfair.runtime.peer.retries`) already pace and bound the waiting, so the
    channel's is kept at most :data:`RECONNECT_MS`: a site started before its aggregator then
    joins within about a second of it coming up instead of after the channel's next scheduled try.
    """
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_MS // 4),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_MS // 4),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_MS),
    ]
    if aggregator_name is not None:
        options.append(("grpc.ssl_target_name_override", pki.validate_name(aggregator_name)))
    return options


def secure_channel(
    address: str,
    files: TlsFiles,
    *,
    aggregator_name: str | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    role: str = "collaborator",
) -> grpc.Channel:
    """A client's mutual-TLS channel to the aggregator: a collaborator's, or with `role` "auditor" the auditor's."""
    return grpc.secure_channel(
        address,
        channel_credentials(files, role),
        options=channel_options(max_message_bytes, aggregator_name=aggregator_name),
    )


def _peer_pem(context: grpc.ServicerContext) -> bytes | None:
    """The PEM of the certificate the caller presented in the TLS handshake, or None."""
    # The stubs type each value as bytes; gRPC gives a list of them (one per property value).
    auth = cast(Mapping[str, list[bytes]], context.auth_context())
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    pems = auth.get("x509_pem_cert") or []
    return pems[0] if len(pems) == 1 else None


def peer_certificate(context: grpc.ServicerContext) -> x509.Certificate | None:
    """The certificate the caller presented in the TLS handshake, or None."""
    pem = _peer_pem(context)
    if pem is None:
        return None
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None


REVOKED = (
    "not permitted: this certificate was revoked in the federation's manifest; the institution's new certificate "
    "(`fedfair pki request`, signed by the CA holder) takes its place"
)
"""What the holder of a revoked certificate hears (it holds that certificate: nothing is revealed)."""


VERIFIED_CERTIFICATES = 1024
"""How many verified peer certificates a :class:`PeerAuthenticator` remembers (oldest forgotten first)."""


@dataclass(frozen=True)
class _Verified:
    """A peer certificate that passed :func:`fedfair.pki.verify_certificate`: its name and validity window."""

    name: str
    not_before: dt.datetime
    not_after: dt.datetime


class PeerAuthenticator:
    """Turns a servicer context into a permitted participant name, or a generic refusal.

    Every RPC is identified, and a full certificate check (RFC 5280 path validation, role,
    key) costs over a millisecond, several times an RPC's own cost. What it checks is a
    function of the certificate's bytes and the CA alone, except the validity window; so a
    certificate that passed is remembered by its exact bytes, and each later call re-checks
    only its window (an expired one is checked in full again, and refused) and the allow-list.
    """

    def __init__(
        self,
        ca_certificate: x509.Certificate,
        allowed_names: Iterable[str],
        role: str = "collaborator",
        *,
        pins: Mapping[str, str] | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ):
        """Allow `allowed_names` certified by `ca_certificate` for `role`.

        With `pins` (name -> SHA-256 fingerprint, a manifest's), a name's certificate is accepted only if it is
        the pinned one: a certificate the manifest no longer pins (revoked, or a twin the CA minted) is refused
        at the handshake even though the CA signed it.
        """
        self.ca_certificate = ca_certificate
        self.allowed_names = frozenset(allowed_names)
        self.role = role
        self.pins = None if pins is None else {name: pki.normalise_fingerprint(value) for name, value in pins.items()}
        self.revoked: frozenset[str] = frozenset()
        self._clock = clock
        self._verified: dict[bytes, _Verified] = {}
        self._admitted: dict[str, x509.Certificate] = {}
        """Name -> the certificate it was last admitted with (:meth:`admitted`)."""
        self._lock = threading.Lock()

    def repin(self, pins: Mapping[str, str], revoked: Iterable[str]) -> None:
        """Hold the pins of a manifest update from now on: every connected peer is checked in full at its next call.

        A certificate in `revoked` is refused with :data:`REVOKED`, which names the revocation.
        """
        with self._lock:
            self.pins = {name: pki.normalise_fingerprint(value) for name, value in pins.items()}
            self.revoked = frozenset(pki.normalise_fingerprint(value) for value in revoked)
            self._verified.clear()

    def identify(self, context: grpc.ServicerContext) -> str:
        """The caller's name from its certificate; raise RefusedError (NOT_PERMITTED) otherwise."""
        pem = _peer_pem(context)
        if pem is None:
            raise RefusedError(Refusal.NOT_PERMITTED, NOT_PERMITTED)
        name = self._remembered(pem) or self._verify(pem)
        if name not in self.allowed_names:
            raise RefusedError(Refusal.NOT_PERMITTED, NOT_PERMITTED)
        return name

    def admitted(self, name: str) -> bytes | None:
        """The certificate (DER) `name` was last admitted with, if the pins in force still admit it and it is valid.

        What a round that relays its parties' certificates (the bounded sum) sends: each party checks it again.
        """
        with self._lock:
            certificate = self._admitted.get(name)
            pins, revoked = self.pins, self.revoked
        if certificate is None or pki.fingerprint(certificate) in revoked:
            return None
        if pins is not None and pins.get(name) != pki.fingerprint(certificate):
            return None
        if not certificate.not_valid_before_utc <= self._clock() <= certificate.not_valid_after_utc:
            return None
        return certificate.public_bytes(serialization.Encoding.DER)

    def _remembered(self, pem: bytes) -> str | None:
        """The name of a certificate verified before and still within its validity window, else None."""
        with self._lock:
            verified = self._verified.get(pem)
        if verified is None or not verified.not_before <= self._clock() <= verified.not_after:
            return None
        return verified.name

    def _verify(self, pem: bytes) -> str:
        """The full check of a certificate; remember it if it passes."""
        try:
            certificate = x509.load_pem_x509_certificate(pem)
            name = pki.verify_certificate(certificate, self.ca_certificate, self.role, now=self._clock())
        except (ValueError, ConfigError):
            raise RefusedError(Refusal.NOT_PERMITTED, NOT_PERMITTED) from None
        with self._lock:
            pins, revoked = self.pins, self.revoked
        if pki.fingerprint(certificate) in revoked:
            raise RefusedError(Refusal.NOT_PERMITTED, REVOKED)
        if pins is not None and pins.get(name) != pki.fingerprint(certificate):
            raise RefusedError(Refusal.NOT_PERMITTED, NOT_PERMITTED)
        with self._lock:
            if pem not in self._verified and len(self._verified) >= VERIFIED_CERTIFICATES:
                del self._verified[next(iter(self._verified))]
            self._verified[pem] = _Verified(name, certificate.not_valid_before_utc, certificate.not_valid_after_utc)
            self._admitted[name] = certificate
        return name
