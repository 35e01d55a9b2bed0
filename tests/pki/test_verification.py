"""Checking certificates: another CA, the validity window, and the verifier secure aggregation uses."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fedfair.core.errors import CertificateError, ConfigError, IdentityError
from fedfair.pki import identity, store
from fedfair.pki.certificates import create_request, generate_private_key, sign_request
from fedfair.pki.verification import (
    credential_verifier,
    der_fingerprint,
    fingerprint,
    normalise_fingerprint,
    pinned_credential_verifier,
    verify_certificate,
)


def test_verify_refuses_a_certificate_from_another_ca(ca_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    store.init_ca(other)
    foreign = store.load_certificate(store.issue(other, "collaborator", "hospital-a"))
    ca_certificate = store.load_certificate(ca_dir / "ca.crt")
    with pytest.raises(CertificateError, match="does not verify"):
        verify_certificate(foreign, ca_certificate, "collaborator")


def test_verify_names_a_certificate_outside_its_validity_window(ca_dir: Path) -> None:
    """An expired certificate is refused as expired, with its date; one not yet valid names its start."""
    ca_certificate = store.load_certificate(ca_dir / "ca.crt")
    ca_key = store.load_private_key(ca_dir / "ca.key")
    request = create_request("hospital-a", generate_private_key())
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    expired = sign_request(request, ca_certificate, ca_key, "collaborator", days=5, not_before=past)
    ended = f"{past + dt.timedelta(days=5):%Y-%m-%d}"
    with pytest.raises(CertificateError, match=f"the certificate of hospital-a expired on {ended}"):
        verify_certificate(expired, ca_certificate, "collaborator")
    fresh = sign_request(request, ca_certificate, ca_key, "collaborator", days=30)
    assert verify_certificate(fresh, ca_certificate, "collaborator") == "hospital-a"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=31)
    with pytest.raises(CertificateError, match="hospital-a expired on "):
        verify_certificate(fresh, ca_certificate, "collaborator", now=later)
    future = sign_request(request, ca_certificate, ca_key, "collaborator", not_before=later)
    with pytest.raises(CertificateError, match=f"hospital-a is not valid before {later:%Y-%m-%d}"):
        verify_certificate(future, ca_certificate, "collaborator")


def test_credential_verifier_for_secure_aggregation(ca_dir: Path, tmp_path: Path) -> None:
    verify = credential_verifier(store.load_certificate(ca_dir / "ca.crt"))
    pem = (store.issue(ca_dir, "collaborator", "hospital-a")).read_bytes()
    key = store.load_private_key(ca_dir / "hospital-a.key")
    public = verify("hospital-a", pem)
    assert identity.is_valid_signature(public, identity.sign(key, b"keys"), b"keys")
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    assert verify("hospital-a", der) == public
    with pytest.raises(IdentityError, match="another party"):
        verify("hospital-b", pem)
    with pytest.raises(IdentityError):
        verify("hospital-a", identity.public_key_bytes(key))  # a bare key is not a certificate
    other = tmp_path / "other"
    store.init_ca(other)
    with pytest.raises(IdentityError, match="does not verify"):
        verify("hospital-a", store.issue(other, "collaborator", "hospital-a").read_bytes())


def test_a_pinned_verifier_refuses_a_twin_the_same_ca_minted(ca_dir: Path) -> None:
    ca_certificate = store.load_certificate(ca_dir / "ca.crt")
    ca_key = store.load_private_key(ca_dir / "ca.key")
    genuine = store.load_certificate(store.issue(ca_dir, "collaborator", "hospital-a"))
    # Whoever holds the CA mints a second certificate for the same name, with a key of its own.
    twin = sign_request(create_request("hospital-a", generate_private_key()), ca_certificate, ca_key, "collaborator")
    stranger = store.load_certificate(store.issue(ca_dir, "collaborator", "mallory"))
    pem, der = serialization.Encoding.PEM, serialization.Encoding.DER
    # The CA alone vouches for all three.
    ca_only = credential_verifier(ca_certificate)
    ca_only("hospital-a", twin.public_bytes(der))
    ca_only("mallory", stranger.public_bytes(der))

    pinned = pinned_credential_verifier(ca_certificate, {"hospital-a": fingerprint(genuine).upper().replace(":", "")})
    key = pinned("hospital-a", genuine.public_bytes(der))
    assert key == genuine.public_key() == pinned("hospital-a", genuine.public_bytes(pem))
    with pytest.raises(IdentityError, match="not the one the manifest pins for it"):
        pinned("hospital-a", twin.public_bytes(der))
    with pytest.raises(IdentityError, match="'mallory' is not in the federation's manifest"):
        pinned("mallory", stranger.public_bytes(der))
    # The pin never replaces the CA's checks: the genuine certificate under another name is still refused.
    with pytest.raises(IdentityError, match="another party"):
        pinned_credential_verifier(ca_certificate, {"hospital-b": fingerprint(genuine)})(
            "hospital-b", genuine.public_bytes(der)
        )


def test_fingerprints_are_of_the_der_in_one_written_form(ca_dir: Path) -> None:
    certificate = store.load_certificate(ca_dir / "ca.crt")
    written = fingerprint(certificate)
    assert der_fingerprint(certificate.public_bytes(serialization.Encoding.DER)) == written
    assert len(written) == 95 and written == written.lower()
    assert normalise_fingerprint(written.upper()) == normalise_fingerprint(written.replace(":", "")) == written
    for bad in ("", "ab:cd", written[:-1] + "g", written + ":00"):
        with pytest.raises(ConfigError, match="is not a SHA-256 fingerprint"):
            normalise_fingerprint(bad)
