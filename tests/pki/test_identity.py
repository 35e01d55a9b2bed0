"""Identity keys: ECDSA P-256 / SHA-256 signatures, public-key and certificate loading, pinning."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedfair.core.errors import FedfairError, IdentityError
from fedfair.pki.identity import (
    generate_identity_key,
    is_valid_signature,
    load_public_key,
    pinned_verifier,
    public_key_bytes,
    public_key_from_certificate,
    public_key_from_credential,
    sign,
)


def self_signed_certificate(key: ec.EllipticCurvePrivateKey, name: str) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )


def test_signature_verifies_only_the_signed_data_under_the_signing_key() -> None:
    key, other = generate_identity_key(), generate_identity_key()
    signature = sign(key, b"round 7 keys")
    assert is_valid_signature(key.public_key(), signature, b"round 7 keys")
    assert not is_valid_signature(key.public_key(), signature, b"round 8 keys")
    assert not is_valid_signature(other.public_key(), signature, b"round 7 keys")
    assert not is_valid_signature(key.public_key(), b"not a signature", b"round 7 keys")


def test_identity_keys_are_p256() -> None:
    assert isinstance(generate_identity_key().curve, ec.SECP256R1)


def test_public_key_round_trips_through_der() -> None:
    key = generate_identity_key()
    loaded = load_public_key(public_key_bytes(key))
    assert public_key_bytes(loaded) == public_key_bytes(key.public_key())


def test_other_curves_and_garbage_are_refused() -> None:
    p384 = ec.generate_private_key(ec.SECP384R1()).public_key()
    der = p384.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(IdentityError, match="P-256"):
        load_public_key(der)
    with pytest.raises(IdentityError):
        load_public_key(b"garbage")
    with pytest.raises(IdentityError):
        public_key_from_certificate(b"garbage")
    assert issubclass(IdentityError, FedfairError)


@pytest.mark.parametrize("encoding", [serialization.Encoding.PEM, serialization.Encoding.DER])
def test_public_key_is_read_from_a_certificate(encoding: serialization.Encoding) -> None:
    key = generate_identity_key()
    certificate = self_signed_certificate(key, "hospital-a").public_bytes(encoding)
    assert public_key_bytes(public_key_from_certificate(certificate)) == public_key_bytes(key)
    assert public_key_bytes(public_key_from_credential(certificate)) == public_key_bytes(key)


def test_pinned_verifier_accepts_only_the_pinned_key_for_the_name() -> None:
    alice, bob = generate_identity_key(), generate_identity_key()
    verify = pinned_verifier({"alice": alice.public_key(), "bob": bob.public_key()})
    assert public_key_bytes(verify("alice", public_key_bytes(alice))) == public_key_bytes(alice)
    certificate = self_signed_certificate(alice, "alice").public_bytes(serialization.Encoding.DER)
    assert public_key_bytes(verify("alice", certificate)) == public_key_bytes(alice)
    with pytest.raises(IdentityError, match="different key"):
        verify("alice", public_key_bytes(bob))
    with pytest.raises(IdentityError, match="no pinned"):
        verify("carol", public_key_bytes(alice))
