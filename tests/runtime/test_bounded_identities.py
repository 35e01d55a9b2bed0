"""The certificates an aggregator relays in a bounded round: each peer's as it was admitted, while still admitted.

A bounded round's parameters carry every party's certificate (its parties check each against their manifests);
the aggregator takes its peers' from its authenticator (:meth:`PeerAuthenticator.admitted`), never one the pins in
force no longer admit, a revoked one or one out of its window, and its own from its TLS files.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from fedfair.core.errors import ConfigError, RoundAbortedError
from fedfair.pki import fingerprint, load_certificate
from fedfair.runtime.aggregator.round_identities import NOISE_SECRET_NAME, aggregator_identities, relayed_identities
from fedfair.runtime.contract import TRAINING
from tests.runtime.wire_stages import BOUNDED_TRAINING
from fedfair.runtime.transport.security import PeerAuthenticator
from tests.runtime.test_input_bound import AUDITOR, declared, federation  # noqa: F401 (the fixture)
from tests.runtime.test_manifest import COLLABORATORS, aggregator_plan_with


class Context:
    """A servicer context whose caller presented `pem` in its TLS handshake."""

    def __init__(self, pem: bytes) -> None:
        self.pem = pem

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"transport_security_type": [b"ssl"], "x509_pem_cert": [self.pem]}


def pem(folder: Path, name: str) -> bytes:
    return (folder / "ca" / f"{name}.crt").read_bytes()


def caller(folder: Path, name: str) -> Any:
    """A context of `name`'s call (the authenticator reads nothing of a context but its TLS handshake)."""
    return Context(pem(folder, name))


def der(folder: Path, name: str) -> bytes:
    return load_certificate(folder / "ca" / f"{name}.crt").public_bytes(serialization.Encoding.DER)


def test_a_peers_certificate_is_relayed_only_while_the_pins_admit_it(federation: Path) -> None:  # noqa: F811
    now = dt.datetime.now(dt.UTC)
    clock = [now]
    authenticator = PeerAuthenticator(
        load_certificate(federation / "ca" / "ca.crt"), COLLABORATORS, clock=lambda: clock[0]
    )
    assert authenticator.admitted("hospital-a") is None  # never connected
    assert authenticator.identify(caller(federation, "hospital-a")) == "hospital-a"
    assert authenticator.admitted("hospital-a") == der(federation, "hospital-a")
    assert authenticator.admitted("hospital-b") is None
    pinned = fingerprint(load_certificate(federation / "ca" / "hospital-a.crt"))
    authenticator.repin({"hospital-a": "00:" * 31 + "00"}, ())
    assert authenticator.admitted("hospital-a") is None  # a manifest update re-keyed it
    authenticator.repin({"hospital-a": pinned}, (pinned,))
    assert authenticator.admitted("hospital-a") is None  # revoked
    authenticator.repin({"hospital-a": pinned}, ())
    assert authenticator.admitted("hospital-a") == der(federation, "hospital-a")
    clock[0] = now + dt.timedelta(days=10_000)
    assert authenticator.admitted("hospital-a") is None  # expired


def test_the_aggregator_relays_its_own_its_peers_and_the_auditors_or_aborts_naming_who_is_missing(
    federation: Path,  # noqa: F811
) -> None:
    loaded = declared(
        aggregator_plan_with(
            federation, aggregator={"certs": str(federation / "ca"), "output": str(federation / "output")}
        )
    )
    ca = load_certificate(federation / "ca" / "ca.crt")
    sites = PeerAuthenticator(ca, COLLABORATORS)
    auditor = PeerAuthenticator(ca, (AUDITOR,), "auditor")
    for name in COLLABORATORS[:2]:
        sites.identify(caller(federation, name))
    auditor.identify(caller(federation, AUDITOR))
    held = aggregator_identities(loaded, (sites, auditor))
    assert held is not None and (held.name, held.auditor) == ("aggregator", AUDITOR)
    roster = COLLABORATORS[:2]
    relayed = dict(relayed_identities(held, BOUNDED_TRAINING, roster))
    assert relayed == {name: der(federation, name).hex() for name in (*roster, "aggregator", AUDITOR)}
    assert relayed_identities(held, TRAINING, roster) == ()  # the masked round relays none
    with pytest.raises(RoundAbortedError, match="'hospital-c' has not connected with a certificate the manifest pins"):
        relayed_identities(held, BOUNDED_TRAINING, COLLABORATORS)
    assert aggregator_identities(aggregator_plan_with(federation), (sites, auditor)) is None  # the plan bounds nothing


def test_the_aggregators_noise_secret_is_kept_in_its_output_folder_not_derived_from_its_key(
    federation: Path,  # noqa: F811
) -> None:
    """Found by the issue 93 red team: the aggregator's noise key derived from its identity key, so a round run again
    after a renewal of that key was noised afresh, and the auditor, sent both verdict records, could average the two
    draws (0.502 of the charged variance left, in process). The key now derives from a secret in the output folder,
    beside the checkpoint a round run again resumes from, and no identity key enters it (`noise_key_of`)."""
    loaded = declared(
        aggregator_plan_with(
            federation, aggregator={"certs": str(federation / "ca"), "output": str(federation / "output")}
        )
    )
    authenticators = (PeerAuthenticator(load_certificate(federation / "ca" / "ca.crt"), COLLABORATORS), None)
    held = aggregator_identities(loaded, authenticators)
    assert held is not None
    secret = loaded.aggregator.output / NOISE_SECRET_NAME
    assert secret.read_bytes() == held.noise_secret and secret.stat().st_mode & 0o777 == 0o600
    restarted = aggregator_identities(loaded, authenticators)
    assert restarted is not None and restarted.noise_secret == held.noise_secret
    elsewhere = dataclasses.replace(loaded.aggregator, output=federation / "another-output")
    other = aggregator_identities(dataclasses.replace(loaded, aggregator=elsewhere), authenticators)
    assert other is not None and other.noise_secret != held.noise_secret
    secret.write_bytes(b"short")
    with pytest.raises(
        ConfigError, match=re.escape(f"{secret}: not a 32-byte secret; it is written by the aggregator")
    ):
        aggregator_identities(loaded, authenticators)
