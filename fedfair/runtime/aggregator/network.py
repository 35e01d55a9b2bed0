"""The aggregator's gRPC server: the Federation service over mutual TLS, and what its threads share."""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
from cryptography import x509

from fedfair import pki
from fedfair.core.errors import ConfigError
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.past_rounds import PastRounds
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.aggregator.servicer import Servicer, federation_server
from fedfair.runtime.manifest import manifest_digest
from fedfair.runtime.manifest_update import LiveManifest
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, shared_settings
from fedfair.runtime.contract import aggregations
from fedfair.runtime.transport import (
    JOIN,
    PeerAuthenticator,
    StageGate,
    TlsFiles,
    check_tls_files,
    server_credentials,
    server_options,
)

REVOKED_STREAMS_SECONDS = 5.0
"""How long a manifest update waits for the task streams of revoked certificates to end."""

SERVER_KEEPALIVE = [("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 10_000)]


@dataclass
class Network:
    """The running gRPC server and what its threads share with the round loop."""

    server: grpc.Server
    port: int
    board: Board
    gate: StageGate
    ca_certificate: x509.Certificate
    authenticator: PeerAuthenticator
    manifest: LiveManifest | None
    """The manifest in force, taking signed updates while the federation runs (None: no manifest)."""
    auditor: PeerAuthenticator | None = None
    """Admits the plan's auditor ([secure_aggregation] auditor, pinned by the manifest); None when it names none."""

    def take_manifest_update(self) -> None:
        """Take a signed update put in place of the manifest's file (:mod:`fedfair.runtime.manifest_update`).

        The certificates it revokes are refused from each peer's next call on; a task stream one of them holds
        ends with that refusal.
        """
        if self.manifest is None:
            return
        held = self.manifest.current
        update = self.manifest.poll()
        if update is None:
            return
        self.board.manifest_digest = manifest_digest(update)
        self.authenticator.repin({pin.name: pin.sha256 for pin in update.collaborators}, update.revoked)
        if self.auditor is not None:
            self.auditor.repin({pin.name: pin.sha256 for pin in update.auditors}, update.revoked)
        self.board.wake_streams()
        # Every stream of a re-keyed name was opened with the revoked certificate (the new one was not
        # admitted before): wait for them to end, so the round about to start does not count them.
        rekeyed = {pin.name for pin in held.collaborators if update.pin(pin.name) != pin}
        deadline = time.monotonic() + REVOKED_STREAMS_SECONDS
        while rekeyed & self.board.connected() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        """Wake every waiting stream, then stop the server, waiting up to 2 s for in-flight RPCs."""
        self.board.close()
        self.server.stop(grace=2.0).wait()


def serve(plan: AggregatorPlan, digest: str, address: str | None = None, events: EventLog | None = None) -> Network:
    """Start the mTLS gRPC server for `plan` (on `address` if given, else the plan's); return it.

    The port is never shared (no SO_REUSEPORT, see
    :func:`fedfair.runtime.transport.server_options`): a port already taken fails here, at once.
    """
    files = TlsFiles.in_folder(plan.aggregator.certs, plan.aggregator.name)
    certified = check_tls_files(files, "aggregator")
    if certified != plan.aggregator.name:
        raise ConfigError(
            f"{files.cert} certifies '{certified}', not the plan's aggregator name '{plan.aggregator.name}'; "
            "set [aggregator] name or issue the right certificate"
        )
    ca_certificate = pki.load_certificate(files.ca)
    board = Board(digest, events=events)
    board.past_rounds = PastRounds(plan.aggregator.output)
    gate = StageGate(plan.federation_id, name=aggregations(plan.secure_aggregation).name)
    gate.open(0, JOIN)
    # Under a manifest only the pinned certificate of each name gets in: one it no longer pins is revoked.
    authenticator = PeerAuthenticator(ca_certificate, plan.collaborators)
    manifest = None if plan.manifest is None else LiveManifest(plan.manifest, ca_certificate)
    if plan.manifest is not None:
        board.manifest_digest = manifest_digest(plan.manifest)
        authenticator.repin({pin.name: pin.sha256 for pin in plan.manifest.collaborators}, plan.manifest.revoked)
    auditor = auditor_authenticator(plan, ca_certificate)
    if auditor is not None:
        board.verifiers = auditor.allowed_names
    training = aggregations(plan.secure_aggregation).training
    servicer = Servicer(
        board, gate, authenticator, shared_settings(plan), events=events, auditor=auditor, training=training
    )
    # Every admitted name at its limits: the collaborators, and the auditor's task stream, fetches and uploads.
    names = len(plan.collaborators) + (0 if auditor is None else 1)
    grpc_server = federation_server(servicer, names, server_options() + SERVER_KEEPALIVE)
    target = address or plan.aggregator.address
    try:
        port = grpc_server.add_secure_port(target, server_credentials(files))
    except RuntimeError:
        port = 0
    if port == 0:
        raise ConfigError(
            f"cannot listen on {target}: the port is in use (another aggregator? `ss -ltnp` names the process) "
            "or the host is not an address of this machine; stop the other process or choose another "
            "--address"
        )
    grpc_server.start()
    return Network(grpc_server, port, board, gate, ca_certificate, authenticator, manifest, auditor)


def auditor_authenticator(plan: AggregatorPlan, ca_certificate: x509.Certificate) -> PeerAuthenticator | None:
    """What admits the plan's auditor: its name alone, for the role "auditor", with the manifest's pin; or None.

    The plan names an auditor only with a manifest that pins it (the plan's load checks both).
    """
    auditor = plan.secure_aggregation.auditor
    if auditor is None or plan.manifest is None:
        return None
    admits = PeerAuthenticator(ca_certificate, (auditor,), "auditor")
    admits.repin({pin.name: pin.sha256 for pin in plan.manifest.auditors}, plan.manifest.revoked)
    return admits
