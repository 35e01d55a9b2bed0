"""The verifier that lets a party check each peer's certificate in full once per federation rather
than once per round, and only within its validity window."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair import pki
from fedfair.core.errors import IdentityError
from fedfair.secagg.credentials import RememberedVerifier, remembered


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pki")
    pki.init_ca(folder)
    for name in ("alpha", "beta"):
        pki.issue(folder, "collaborator", name)
    return folder


def credential(folder: Path, name: str) -> bytes:
    return pki.load_certificate(folder / f"{name}.crt").public_bytes(serialization.Encoding.DER)


class Counting:
    """The federation's real verifier, counting how often it runs."""

    def __init__(self, folder: Path) -> None:
        self.verify = pki.credential_verifier(pki.load_certificate(folder / "ca.crt"))
        self.calls = 0

    def __call__(self, name: str, credential: bytes) -> ec.EllipticCurvePublicKey:
        self.calls += 1
        return self.verify(name, credential)


def test_a_credential_is_checked_in_full_once_and_again_outside_its_window(federation: Path) -> None:
    counting = Counting(federation)
    now = [dt.datetime.now(dt.UTC)]
    verify = RememberedVerifier(counting, clock=lambda: now[0])
    alpha = credential(federation, "alpha")
    first = verify("alpha", alpha)
    assert verify("alpha", alpha).public_numbers() == first.public_numbers()
    assert counting.calls == 1
    # Past the certificate's expiry the remembered answer is not used: the full check runs again.
    now[0] = pki.load_certificate(federation / "alpha.crt").not_valid_after_utc + dt.timedelta(seconds=1)
    verify("alpha", alpha)  # the wrapped verifier reads the real clock, so it still passes here
    assert counting.calls == 2


def test_a_refused_credential_is_never_remembered(federation: Path) -> None:
    counting = Counting(federation)
    verify = RememberedVerifier(counting)
    alpha = credential(federation, "alpha")
    for _ in range(2):
        # alpha's certificate relayed under beta's name: refused every time, in full.
        with pytest.raises(IdentityError, match="another party"):
            verify("beta", alpha)
    assert counting.calls == 2
    verify("alpha", alpha)
    with pytest.raises(IdentityError):
        verify("beta", alpha)  # remembered for alpha, not for the pair (beta, the same bytes)
    assert counting.calls == 4


def test_remembered_wraps_once(federation: Path) -> None:
    verify = remembered(Counting(federation))
    assert remembered(verify) is verify
