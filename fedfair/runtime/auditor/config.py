"""The auditor's own settings: who it is, where the aggregator is, its files, its manifest, its folder.

Read from ``auditor.toml`` (``[auditor]`` and ``[certificates]``, with the same checked tables as a collaborator's
file, relative paths relative to the file's folder) or built from ``fedfair auditor start``'s flags. The manifest is
required: it is what pins the auditor's own certificate, the aggregator's, and every site's whose key the auditor
checks proofs against. Everything local is checked before the process dials anyone (:func:`check_auditor_identity`).

Why: docs/security.md, "Bounded inputs (two verifiers)".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
from cryptography import x509

from fedfair import pki
from fedfair.core.errors import ConfigError, ManifestError
from fedfair.core.tables import ADDRESS_RE, Table, check_sections, read_toml
from fedfair.pki.names import validate_name
from fedfair.runtime.peer.retries import DEFAULT_RETRY_POLICY, RetryPolicy, retry_policy
from fedfair.runtime.peer.watchdog import DEFAULT_IDLE_TIMEOUT_SECONDS, idle_timeout
from fedfair.runtime.manifest import (
    UNPINNED_PLAN_WARNING,
    Manifest,
    check_certificate,
    load_manifest,
    pinned_auditor,
)
from fedfair.runtime.transport import TlsFiles, check_tls_files

logger = logging.getLogger("fedfair.auditor")

ROLE = "auditor"
"""The certificate role an auditor dials with (``fedfair pki request --role auditor``)."""


@dataclass(frozen=True)
class AuditorConfig:
    """One auditor institution's settings.

    name: its participant name (its certificate's); aggregator: the aggregator's address (host:port), whose certificate
    must carry the manifest's aggregator name; certificates: its TLS files; manifest: the federation's, which must list
    it with role "auditor"; folder: where its log and its totals (totals.json) are kept; source: the file it was read
    from (None: flags).
    """

    name: str
    aggregator: str
    certificates: TlsFiles
    manifest: Manifest
    folder: Path
    source: Path | None = None
    idle_timeout_seconds: float = DEFAULT_IDLE_TIMEOUT_SECONDS
    """Seconds without progress before the auditor gives up on its aggregator, as a collaborator does."""
    retry: RetryPolicy = DEFAULT_RETRY_POLICY
    """How long a lost aggregator is waited for ([retry], the keys of a collaborator's)."""

    @property
    def aggregator_name(self) -> str:
        """The name the aggregator's certificate must carry: the manifest's aggregator."""
        return self.manifest.aggregator.name

    @property
    def where(self) -> str:
        """How its settings are named in an error: the file, or the command line."""
        return str(self.source) if self.source is not None else "fedfair auditor start"


def load_auditor_config(path: Path | str) -> AuditorConfig:
    """Read and check ``auditor.toml``; a ConfigError naming the key and the fix."""
    source, data = read_toml(path)
    return parse_auditor_config(data, source)


def parse_auditor_config(data: dict[str, Any], source: Path) -> AuditorConfig:
    """Check an ``auditor.toml`` already read: every key known, the manifest loaded, each path resolved."""
    where, base = str(source), source.parent
    check_sections(where, data, ("auditor", "certificates", "retry"))
    me = Table.of(where, data, "auditor", ("name", "aggregator", "manifest", "folder", "idle_timeout_seconds"))
    name = me.name("name", validate_name)
    certificates = TlsFiles.from_section(where, data, base, name)
    try:
        manifest = load_manifest(me.path("manifest", base))
    except ConfigError as error:
        me.fail(f"[auditor] manifest: {error}")
    return AuditorConfig(
        name=name,
        aggregator=me.address("aggregator"),
        certificates=certificates,
        manifest=manifest,
        folder=me.path("folder", base, "."),
        source=source,
        idle_timeout_seconds=idle_timeout(me),
        retry=retry_policy(where, data),
    )


def auditor_config_from_flags(
    *, cert: Path, key: Path, ca: Path | None, manifest: Path, aggregator: str, folder: Path
) -> AuditorConfig:
    """The settings ``fedfair auditor start`` gives as flags: the name is the certificate's, ca.crt beside it."""
    files = TlsFiles(ca=ca if ca is not None else cert.parent / "ca.crt", cert=cert, key=key)
    for flag, path in (("--cert", files.cert), ("--key", files.key), ("--ca", files.ca), ("--manifest", manifest)):
        if not path.is_file():
            raise ConfigError(f"{flag} {path}: no such file; give the auditor's own {flag.lstrip('-')} file")
    if ADDRESS_RE.fullmatch(aggregator) is None:
        raise ConfigError(f'--aggregator {aggregator!r}: expected host:port, e.g. "aggregator.example.org:50051"')
    name = pki.name_from_certificate(pki.load_certificate(files.cert))
    return AuditorConfig(name, aggregator, files, load_manifest(manifest), folder)


@dataclass(frozen=True)
class AuditorIdentity:
    """The auditor's checked credentials: its identity key (its TLS key, which the manifest pins) and the CA."""

    key: EllipticCurvePrivateKey
    ca_certificate: x509.Certificate


def check_auditor_identity(config: AuditorConfig) -> AuditorIdentity:
    """Check what is local before dialling: the files, the role, the name, the manifest's pin and pinned plan.

    Raises:
        ConfigError: naming the file or the manifest entry and the fix.
    """
    where = config.where
    try:
        certified = check_tls_files(config.certificates, ROLE)
    except ConfigError as error:
        # The README's steps say where each file comes from: ca.crt is the CA holder's, not the request's.
        fix = "[certificates] in it" if config.source is not None else "--cert, --key and --ca"
        raise ConfigError(
            f"{where}: the auditor's TLS files are unusable: {error}. Fix: correct {fix}: ca.crt is the one the CA "
            'holder sends back, and the certificate is for the role "auditor" (`fedfair pki request --role '
            "auditor`, signed by the CA holder; steps 2 and 3 of the README.md `fedfair init` wrote)"
        ) from None
    if certified != config.name:
        raise ConfigError(
            f"{where}: name = {config.name!r} but {config.certificates.cert} certifies {certified!r}; the aggregator "
            "knows the auditor by its certificate, so make them the same"
        )
    manifest = config.manifest
    pin = manifest.pin(config.name)
    if pin is None or pin.role != ROLE:
        listed = "does not list it" if pin is None else f"lists it as the {pin.role}"
        raise ConfigError(
            f"{where}: the manifest {manifest.source} {listed}; an auditor takes part only in a federation whose "
            'manifest lists it with role = "auditor": use that federation\'s manifest'
        )
    credential = pki.load_certificate(config.certificates.cert).public_bytes(serialization.Encoding.DER)
    try:
        check_certificate(manifest, config.name, credential)
    except ManifestError as error:
        # An auditor's file names no federation, so another federation's manifest that lists an auditor of the same
        # name is caught only here: say so beside the renewed or misissued certificate the pin's message suspects.
        setting = "[auditor] manifest" if config.source is not None else "--manifest"
        raise ManifestError(
            f"{where}: {error}; or {setting} names another federation's manifest (this one is federation "
            f"{manifest.federation_id!r}): name the manifest of the federation this auditor serves"
        ) from None
    if manifest.plan is None:
        # As a site's: without the pinned plan the aggregator alone says which bound this auditor checks.
        logger.warning("%s: %s", manifest.source, UNPINNED_PLAN_WARNING)
    named = pinned_auditor(manifest)
    if manifest.plan is not None and named != config.name:
        said = "names no auditor" if named is None else f"names {named!r} as its auditor"
        raise ConfigError(
            f"{where}: the plan the manifest {manifest.source} pins {said}, not {config.name!r}; an auditor verifies "
            'only for a plan that names it ([secure_aggregation] input_bound = "two_verifiers", auditor = NAME)'
        )
    return AuditorIdentity(pki.load_private_key(config.certificates.key), pki.load_certificate(config.certificates.ca))
