"""Participant names: valid DNS names that double as file names, refused at every entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.pki import identity, store
from fedfair.pki.certificates import sign_request
from fedfair.pki.names import validate_name
from tests.pki.helpers import request_with_key


@pytest.mark.parametrize("name", ["Hospital-A", "hospital_a", "-hospital", "hospital a", "", "ca", "a" * 64, "x..y"])
def test_bad_names_are_refused(ca_dir: Path, name: str) -> None:
    with pytest.raises(ConfigError):
        validate_name(name)
    request = request_with_key(name or "x", identity.generate_identity_key()) if name else None
    if request is not None:
        ca_certificate = store.load_certificate(ca_dir / "ca.crt")
        with pytest.raises(ConfigError):
            sign_request(request, ca_certificate, store.load_private_key(ca_dir / "ca.key"), "collaborator")


def test_good_names_are_accepted() -> None:
    for name in ("hospital-a", "a", "agg.example.org", "site-01", "0bank"):
        assert validate_name(name) == name
