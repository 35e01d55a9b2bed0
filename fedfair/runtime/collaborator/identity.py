"""Who this collaborator is: its TLS files, its certified name and its manifest pin, checked before it dials.

:func:`check_identity` reads what is local and fails at once, aggregator up or down, on a
file that cannot be used, a configured name its certificate does not carry, or a
certificate the manifest does not pin (:mod:`fedfair.runtime.collaborator.client`).
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

from fedfair import pki
from fedfair.core.errors import ConfigError, PermanentFailureError
from fedfair.pki.identity import CredentialVerifier
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.peer.retries import Target, mismatched_ca
from fedfair.runtime.failures import LOCAL_CERTIFICATES, LOCAL_MANIFEST
from fedfair.runtime.manifest import check_certificate
from fedfair.runtime.manifest_update import LiveManifest
from fedfair.runtime.transport import check_tls_files


@dataclass(frozen=True)
class Identity:
    """This institution's checked credentials.

    The name its certificate carries, its key and certificate (DER), and how it checks a peer's certificate.
    """

    certified: str
    key: EllipticCurvePrivateKey
    credential: bytes
    verify: CredentialVerifier


def check_identity(config: CollaboratorConfig) -> Identity:
    """Check the TLS files and the manifest pin of `config`; raises PermanentFailureError with the fix."""
    files = config.certificates
    try:
        certified = check_tls_files(files, "collaborator")
    except ConfigError as error:
        # A certificate that does not verify against ca.crt: the aggregator's tells which of the two is wrong.
        target = Target(config.aggregator, files, config.aggregator_name)
        raise mismatched_ca(target, "collaborator") or PermanentFailureError(
            LOCAL_CERTIFICATES, reason=error, config=config.source
        ) from None
    if certified != config.name:
        raise PermanentFailureError(
            LOCAL_CERTIFICATES,
            reason=f"name = {config.name!r} but {files.cert} certifies {certified!r}; the aggregator "
            "knows this institution by its certificate, so make them the same",
            config=config.source,
        )
    identity_key = pki.load_private_key(files.key)
    credential = pki.load_certificate(files.cert).public_bytes(serialization.Encoding.DER)
    ca_certificate = pki.load_certificate(files.ca)
    verify: CredentialVerifier
    if config.manifest is not None:
        # Peers are checked against the pinned fingerprints, not only the CA: a twin minted
        # by whoever holds the CA key is refused like a stranger.
        try:
            check_certificate(config.manifest, config.name, credential)
        except ConfigError as error:
            raise PermanentFailureError(LOCAL_MANIFEST, reason=error) from None
        # The manifest a site holds takes a signed update put in place of its file while it runs.
        verify = LiveManifest(config.manifest, ca_certificate)
    else:
        verify = pki.credential_verifier(ca_certificate, "collaborator")
    return Identity(certified, identity_key, credential, verify)
