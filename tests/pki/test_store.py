"""The certificates folder: the CA, the request-and-sign flow, key modes, and errors that name the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ConfigError
from fedfair.pki import store
from fedfair.pki.certificates import check_request
from fedfair.pki.verification import name_from_certificate, verify_certificate
from tests.pki.helpers import mode


def test_init_makes_a_p256_ca_with_a_private_key(ca_dir: Path) -> None:
    certificate = store.load_certificate(ca_dir / "ca.crt")
    assert mode(ca_dir / "ca.key") == 0o600
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    assert certificate.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    public_key = certificate.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey) and isinstance(public_key.curve, ec.SECP256R1)
    assert isinstance(certificate.signature_hash_algorithm, hashes.SHA256)
    with pytest.raises(ConfigError, match="already has a CA"):
        store.init_ca(ca_dir)


def test_request_and_sign_flow_keeps_the_key_at_the_institution(ca_dir: Path, tmp_path: Path) -> None:
    institution = tmp_path / "hospital"
    key_path, csr_path = store.request_certificate(institution, "hospital-a")
    assert mode(key_path) == 0o600 and key_path.parent == institution
    assert check_request(store.load_request(csr_path)) == "hospital-a"

    cert_path = store.sign_certificate(ca_dir, csr_path, "collaborator")
    assert cert_path == ca_dir / "hospital-a.crt"
    assert not (ca_dir / "hospital-a.key").exists()  # only the request travelled
    certificate = store.load_certificate(cert_path)
    ca_certificate = store.load_certificate(ca_dir / "ca.crt")
    assert verify_certificate(certificate, ca_certificate, "collaborator") == "hospital-a"
    assert name_from_certificate(certificate) == "hospital-a"
    # The certificate certifies the institution's own key.
    assert certificate.public_key() == store.load_private_key(key_path).public_key()

    with pytest.raises(ConfigError, match="already exists"):
        store.sign_certificate(ca_dir, csr_path, "collaborator")
    assert store.sign_certificate(ca_dir, csr_path, "collaborator", overwrite=True) == cert_path
    with pytest.raises(ConfigError, match="already exists"):
        store.request_certificate(institution, "hospital-a")


def test_keys_readable_by_others_are_refused(ca_dir: Path) -> None:
    key_path = ca_dir / "ca.key"
    os.chmod(key_path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        store.load_private_key(key_path)


def test_missing_files_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        store.load_certificate(tmp_path / "nope.crt")
    with pytest.raises(ConfigError, match="pki init"):
        store.issue(tmp_path, "collaborator", "hospital-a")
    assert not (tmp_path / "hospital-a.key").exists()  # no stray key without a CA
    with pytest.raises(ConfigError, match="unknown role"):
        store.issue(tmp_path, "admin", "hospital-a")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"days": 0}, "--days must be at least 1"),
        ({"days": -3}, "--days must be at least 1"),
        ({"hosts": ["bad host!"]}, "invalid participant name"),
    ],
)
def test_a_refused_issue_leaves_no_file_behind(ca_dir: Path, flags: dict[str, object], message: str) -> None:
    before = sorted(path.name for path in ca_dir.iterdir())
    with pytest.raises(ConfigError, match=message):
        store.issue(ca_dir, "aggregator", "aggregator", **flags)  # type: ignore[arg-type]
    # No key, no request, no certificate, no temporary file: the folder is as it was.
    assert sorted(path.name for path in ca_dir.iterdir()) == before
    # The same name can then be issued at once, with valid flags.
    assert store.issue(ca_dir, "aggregator", "aggregator").exists()
    with pytest.raises(ConfigError, match="already exists"):
        store.issue(ca_dir, "aggregator", "aggregator")


def test_writes_are_atomic_with_exact_modes_and_leave_no_temporary_files(ca_dir: Path, tmp_path: Path) -> None:
    previous = os.umask(0o077)  # a strict umask must not change the modes the store writes
    try:
        folder = tmp_path / "site"
        key_path, csr_path = store.request_certificate(folder, "hospital-a", "collaborator")
        cert_path = store.sign_certificate(ca_dir, csr_path, out=folder / "hospital-a.crt")
    finally:
        os.umask(previous)
    assert mode(key_path) == 0o600 and mode(csr_path) == 0o644 and mode(cert_path) == 0o644
    assert sorted(path.name for path in folder.iterdir()) == ["hospital-a.crt", "hospital-a.csr", "hospital-a.key"]
    assert not (ca_dir / "hospital-a.crt").exists()  # --out put it where the CA holder asked
    store.write_file(cert_path, cert_path.read_bytes(), 0o644, overwrite=True)
    assert not [path for path in folder.iterdir() if path.name.startswith(".")]
