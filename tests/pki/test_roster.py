"""The roster the institutions pin: pins from issued certificates, the manifest's checks, digest and text."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.pki import store
from fedfair.pki.roster import (
    Pin,
    Roster,
    check_pins,
    pins_from_folders,
)
from fedfair.pki.verification import fingerprint


@pytest.fixture()
def issued(ca_dir: Path) -> Path:
    """The CA's folder with an aggregator and three collaborators issued."""
    store.issue(ca_dir, "aggregator", "aggregator")
    for name in ("hospital-a", "hospital-b", "hospital-c"):
        store.issue(ca_dir, "collaborator", name)
    return ca_dir


def test_pins_come_from_the_certificates_each_verified_under_the_ca(issued: Path, tmp_path: Path) -> None:
    pins = {pin.name: pin for pin in pins_from_folders([issued])}
    assert sorted(pins) == ["aggregator", "hospital-a", "hospital-b", "hospital-c"]
    assert pins["aggregator"].role == "aggregator" and pins["hospital-a"].role == "collaborator"
    assert pins["hospital-a"].sha256 == fingerprint(store.load_certificate(issued / "hospital-a.crt"))
    # A folder without ca.crt needs the CA named; one from another CA is refused, naming the file.
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "hospital-a.crt").write_bytes((issued / "hospital-a.crt").read_bytes())
    with pytest.raises(ConfigError, match="none of the folders holds a ca.crt; give .* --ca FILE"):
        pins_from_folders([bare])
    assert pins_from_folders([bare], store.load_certificate(issued / "ca.crt")) == [pins["hospital-a"]]
    other = tmp_path / "other"
    store.init_ca(other)
    with pytest.raises(ConfigError, match="the folders hold different ca.crt files"):
        pins_from_folders([issued, other])
    store.issue(other, "collaborator", "hospital-d")
    with pytest.raises(ConfigError, match=r"hospital-d.crt: the certificate does not verify"):
        pins_from_folders([other], store.load_certificate(issued / "ca.crt"))


def test_two_certificates_for_one_name_are_refused(issued: Path, tmp_path: Path) -> None:
    # The CA minted a twin for hospital-a in another folder: the manifest must pin one, and says which.
    twin_folder = tmp_path / "twin"
    _, csr = store.request_certificate(twin_folder, "hospital-a", "collaborator")
    store.sign_certificate(issued, csr, out=twin_folder / "hospital-a.crt")
    with pytest.raises(ConfigError, match="are two certificates for 'hospital-a'"):
        pins_from_folders([issued, twin_folder])


def pin(name: str, role: str = "collaborator", byte: int = 0) -> Pin:
    return Pin(name, role, bytes([byte] * 32).hex(":"))


PINS = [
    pin("aggregator", "aggregator", 1),
    pin("hospital-a", byte=2),
    pin("hospital-b", byte=3),
    pin("hospital-c", byte=4),
]


@pytest.mark.parametrize(
    ("pins", "max_colluding", "min_round_size", "message"),
    [
        ([*PINS, pin("hospital-a", byte=9)], 0, 2, "lists the name hospital-a twice"),
        ([*PINS, pin("hospital-d", byte=2)], 0, 2, "lists the fingerprint .* twice"),
        (PINS[1:], 0, 2, 'exactly one participant with role = "aggregator", found 0'),
        ([*PINS, pin("backup", "aggregator", 8)], 0, 2, "found 2"),
        (PINS, -1, 2, "max_colluding must be an integer >= 0"),
        (PINS, 0, 1, "min_round_size = 1 is below max_colluding \\+ 2 = 2"),
        (PINS, 1, 2, "min_round_size = 2 is below max_colluding \\+ 2 = 3"),
        (PINS, 0, 4, "min_round_size = 4 exceeds the 3 collaborators"),
    ],
)
def test_check_pins_refuses_an_inconsistent_roster(
    pins: list[Pin], max_colluding: int, min_round_size: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_pins(pins, max_colluding, min_round_size)


def test_a_pin_is_checked_when_made() -> None:
    with pytest.raises(ConfigError, match="invalid participant name"):
        pin("Hospital A")
    with pytest.raises(ConfigError, match="unknown role"):
        pin("hospital-a", "admin")
    with pytest.raises(ConfigError, match="colon-separated lower-case hex"):
        Pin("hospital-a", "collaborator", "AB" * 32)


def test_the_manifest_text_holds_the_roster_and_its_digest_ignores_order() -> None:
    aggregator, collaborators = check_pins(PINS, 1, 3)
    assert aggregator == PINS[0] and [pin.name for pin in collaborators] == ["hospital-a", "hospital-b", "hospital-c"]
    text = Roster("fedfair-demo", tuple(reversed(PINS)), 1, 3).text()
    document = tomllib.loads(text)
    assert document["federation"] == {"id": "fedfair-demo", "max_colluding": 1, "min_round_size": 3}
    assert [Pin(**entry) for entry in document["participants"]] == PINS  # the aggregator first, then by name
    digest = Roster("fedfair-demo", tuple(PINS), 1, 3).digest()
    assert f"# sha256 of its content: {digest}" in text
    assert Roster("fedfair-demo", tuple(reversed(PINS)), 1, 3).digest() == digest
    for changed in (
        Roster("other", tuple(PINS), 1, 3).digest(),
        Roster("fedfair-demo", tuple(PINS), 0, 3).digest(),
        Roster("fedfair-demo", tuple(PINS), 1, 2).digest(),
        Roster("fedfair-demo", (*PINS[:3], pin("hospital-c", byte=7)), 1, 3).digest(),
    ):
        assert changed != digest
    with pytest.raises(ConfigError, match="invalid federation id"):
        Roster("bad id!", tuple(PINS), 0, 2).text()
