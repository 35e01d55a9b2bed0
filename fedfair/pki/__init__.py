"""The federation's public-key infrastructure: one CA, one certificate per participant.

A certificate carries the participant's name in the subject common name and as a
DNS subject alternative name, and its role in the extended key usage: server
authentication for the aggregator, client authentication for collaborators. The
transport takes a peer's identity from this certificate alone, and secure
aggregation trusts a peer's signed keys through the same certificates.

The names below are re-exported so that callers can write ``from fedfair.pki import X``.
"""

from __future__ import annotations

from fedfair.core.errors import CertificateError
from fedfair.pki.certificates import create_request, sign_request
from fedfair.pki.names import validate_name
from fedfair.pki.store import (
    ca_paths,
    init_ca,
    issue,
    load_certificate,
    load_private_key,
    participant_paths,
)
from fedfair.pki.verification import (
    credential_verifier,
    fingerprint,
    name_from_certificate,
    normalise_fingerprint,
    pinned_credential_verifier,
    verify_certificate,
)

__all__ = [
    "CertificateError",
    "ca_paths",
    "create_request",
    "credential_verifier",
    "fingerprint",
    "init_ca",
    "issue",
    "load_certificate",
    "load_private_key",
    "name_from_certificate",
    "normalise_fingerprint",
    "participant_paths",
    "pinned_credential_verifier",
    "sign_request",
    "validate_name",
    "verify_certificate",
]
