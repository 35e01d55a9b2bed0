"""The federation's roster as the institutions pin it: who takes part, with which certificate.

Whoever holds the CA can issue a certificate for any name, so certificates alone
cannot stop the CA holder (in practice, often the aggregator's operator) from adding
parties of its own to a round, or a twin of an institution with a key of its own.
The institutions therefore agree out of band on a *manifest*: the federation id, the
collusion bound, the fewest parties a round may have, and for every participant its
name, role and the SHA-256 fingerprint of its certificate. Each institution keeps its
own copy and refuses any party or certificate that the manifest does not pin.

Why: docs/design.md, "Inside the PKI".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from fedfair.core.errors import ConfigError
from fedfair.pki.names import check_role, validate_federation_id, validate_name
from fedfair.pki.store import ca_paths, load_certificate, write_file
from fedfair.pki.verification import (
    fingerprint,
    name_from_certificate,
    normalise_fingerprint,
    role_of_certificate,
    verify_certificate,
)

PARTICIPANTS = "participants"
"""The manifest's array of tables, one per participant."""


@dataclass(frozen=True)
class Pin:
    """One participant as the manifest pins it: its name, its role and its certificate's fingerprint."""

    name: str
    role: str
    sha256: str
    """SHA-256 of the certificate's DER, colon-separated lower-case hex (as `fedfair pki show` prints it)."""

    def __post_init__(self) -> None:
        validate_name(self.name)
        check_role(self.role)
        if normalise_fingerprint(self.sha256) != self.sha256:
            raise ConfigError(
                f"the fingerprint of {self.name!r} must be written as colon-separated lower-case hex; "
                "use pki.verification.normalise_fingerprint"
            )


@dataclass(frozen=True)
class PlanPin:
    """The plan's shared settings as the institutions agreed on them: a JSON object and its digest."""

    settings: Mapping[str, Any]
    sha256: str = ""
    """:func:`settings_digest` of ``settings``; computed when left empty, checked when given."""

    def __post_init__(self) -> None:
        digest = settings_digest(self.settings)
        if not self.sha256:
            object.__setattr__(self, "sha256", digest)
        elif self.sha256 != digest:
            raise ConfigError(
                f"[plan] sha256 = {self.sha256} is not the digest of its settings ({digest}): the file was edited "
                "by hand or damaged; write it again with `fedfair plan pin`"
            )


def canonical_json(value: Any) -> bytes:
    """The one byte form of a JSON value that digests are taken over: sorted keys, no spaces, ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def settings_digest(settings: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a plan's shared settings in canonical JSON: layout and key order do not count."""
    return hashlib.sha256(canonical_json(settings)).hexdigest()


def pin_certificate(certificate: x509.Certificate, ca_certificate: x509.Certificate) -> Pin:
    """The pin of a certificate this CA issued (checked for its own role, valid now)."""
    role = role_of_certificate(certificate)
    if role is None:
        raise ConfigError(
            f"the certificate of {name_from_certificate(certificate)!r} names no single role; "
            "reissue it with `fedfair pki sign`"
        )
    return Pin(verify_certificate(certificate, ca_certificate, role), role, fingerprint(certificate))


def pins_from_folders(folders: Sequence[Path], ca_certificate: x509.Certificate | None = None) -> list[Pin]:
    """The pins of every NAME.crt in ``folders``, each verified under the federation's CA.

    ``ca_certificate`` None takes the ca.crt the folders hold (they must agree). Two
    certificates for one name are refused: the manifest must pin exactly one, and the
    institutions must say which.
    """
    if ca_certificate is None:
        found = {load_certificate(path) for folder in folders if (path := ca_paths(Path(folder))[0]).exists()}
        if len(found) != 1:
            problem = "none of the folders holds a ca.crt" if not found else "the folders hold different ca.crt files"
            raise ConfigError(f"{problem}; give the federation's CA certificate with --ca FILE")
        (ca_certificate,) = found
    pins: dict[str, tuple[Pin, Path]] = {}
    for folder in folders:
        paths = sorted(path for path in Path(folder).glob("*.crt") if path != ca_paths(Path(folder))[0])
        for path in paths:
            try:
                pin = pin_certificate(load_certificate(path), ca_certificate)
            except ConfigError as error:
                raise ConfigError(f"{path}: {error}") from None
            if pin.name in pins and pins[pin.name][0] != pin:
                raise ConfigError(
                    f"{path} and {pins[pin.name][1]} are two certificates for {pin.name!r}; "
                    "keep only the one the institution holds the key of"
                )
            pins[pin.name] = (pin, path)
    return [pin for pin, _ in pins.values()]


def check_pins(pins: Iterable[Pin], max_colluding: int, min_round_size: int) -> tuple[Pin, tuple[Pin, ...]]:
    """Check a manifest's participants and bounds; return (the aggregator, the collaborators sorted by name).

    Names and fingerprints are unique, there is exactly one aggregator, and the
    bounds are consistent: a round of p parties, up to ``max_colluding`` of which
    collude with the aggregator, must keep at least two honest inputs in its sum, or
    the colluders could subtract theirs and see one institution's input alone; so
    ``min_round_size >= max_colluding + 2``, and no larger than the collaborators listed.
    """
    pins = list(pins)
    for what, values in (("name", [pin.name for pin in pins]), ("fingerprint", [pin.sha256 for pin in pins])):
        repeated = sorted({value for value in values if values.count(value) > 1})
        if repeated:
            raise ConfigError(f"the manifest lists the {what} {repeated[0]} twice; list each participant once")
    aggregators = [pin for pin in pins if pin.role == "aggregator"]
    if len(aggregators) != 1:
        raise ConfigError(
            f'the manifest must list exactly one participant with role = "aggregator", found {len(aggregators)}'
        )
    collaborators = tuple(sorted((pin for pin in pins if pin.role == "collaborator"), key=lambda pin: pin.name))
    if not isinstance(max_colluding, int) or isinstance(max_colluding, bool) or max_colluding < 0:
        raise ConfigError(f"max_colluding must be an integer >= 0, got {max_colluding!r}")
    if not isinstance(min_round_size, int) or isinstance(min_round_size, bool):
        raise ConfigError(f"min_round_size must be an integer, got {min_round_size!r}")
    if min_round_size < max_colluding + 2:
        raise ConfigError(
            f"min_round_size = {min_round_size} is below max_colluding + 2 = {max_colluding + 2}: a round that small "
            "could leave one institution's input alone beside the colluders'; raise min_round_size"
        )
    if min_round_size > len(collaborators):
        raise ConfigError(
            f"min_round_size = {min_round_size} exceeds the {len(collaborators)} collaborators listed; "
            "lower it or list every collaborator"
        )
    return aggregators[0], collaborators


@dataclass(frozen=True)
class Roster:
    """A manifest's content: the federation id, its participants' pins, its bounds, the pinned plan, the revocations.

    What the institutions agree on, and all that its digest covers; the file adds comments and layout.
    """

    federation_id: str
    pins: tuple[Pin, ...]
    max_colluding: int
    min_round_size: int
    plan: PlanPin | None = None
    revoked: tuple[str, ...] = ()
    """SHA-256 fingerprints of the certificates revoked in this federation, in any order."""

    def _document(self) -> dict[str, object]:
        """The content as plain values, participants sorted by name (the order is not content).

        The plan counts by its digest, which covers its settings; the revoked fingerprints, sorted, only
        where there are some (so a manifest without revocations keeps the digest it always had).
        """
        federation: dict[str, object] = {
            "id": self.federation_id,
            "max_colluding": self.max_colluding,
            "min_round_size": self.min_round_size,
        }
        if revoked := sorted(set(self.revoked)):
            federation["revoked"] = revoked
        document: dict[str, object] = {
            "federation": federation,
            PARTICIPANTS: [asdict(pin) for pin in sorted(self.pins, key=lambda pin: pin.name)],
        }
        if self.plan is not None:
            document["plan"] = {"sha256": self.plan.sha256}
        return document

    def digest(self) -> str:
        """SHA-256 (hex) of the canonical content: equal digests mean the same agreement.

        Comments, layout and the order of participants do not count, so institutions can
        compare one line over the phone rather than a file.
        """
        return hashlib.sha256(canonical_json(self._document())).hexdigest()

    def text(self) -> str:
        """The manifest as TOML, after the checks of :func:`check_pins` and :func:`check_not_revoked`.

        Its digest is in a comment.
        """
        revoked = sorted(set(self.revoked))
        validate_federation_id(self.federation_id)
        check_pins(self.pins, self.max_colluding, self.min_round_size)
        check_not_revoked(self.pins, revoked)
        # Every value is a checked name, role, hex fingerprint or federation id: JSON quoting is TOML quoting.
        lines = [
            "# fedfair federation manifest: agreed by every institution out of band, one copy each.",
            f"# sha256 of its content: {self.digest()}",
            "# Compare that line, or every fingerprint below, with the other institutions before using it.",
            "",
            "[federation]",
            f"id = {json.dumps(self.federation_id)}",
            f"max_colluding = {self.max_colluding}       # collaborators that may collude with the aggregator",
            f"min_round_size = {self.min_round_size}      # the fewest parties a round may have",
        ]
        if revoked:
            lines += [
                "# Certificates revoked in this federation (sha256): never pinned again, whoever presents them.",
                f"revoked = {json.dumps(revoked)}",
            ]
        for pin in sorted(self.pins, key=lambda pin: (pin.role != "aggregator", pin.name)):
            lines += [
                "",
                f"[[{PARTICIPANTS}]]",
                f"name = {json.dumps(pin.name)}",
                f"role = {json.dumps(pin.role)}",
                f"sha256 = {json.dumps(pin.sha256)}",
            ]
        if self.plan is not None:
            # ASCII JSON in a literal multi-line string is read back byte for byte, as long as it holds no '''.
            settings = json.dumps(self.plan.settings, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False)
            if "'''" in settings:
                raise ConfigError(
                    "the plan's settings hold three single quotes in a row, which a manifest cannot carry"
                )
            lines += [
                "",
                "[plan]",
                "# The settings every collaborator receives, pinned: a collaborator refuses any other plan.",
                "# Changing them takes a new manifest (`fedfair plan pin`); `fedfair plan diff OLD NEW` shows the "
                "change.",
                f"sha256 = {json.dumps(self.plan.sha256)}",
                f"settings = '''\n{settings}\n'''",
            ]
        return "\n".join(lines) + "\n"


def write_manifest(path: Path, roster: Roster) -> str:
    """Write the roster's manifest to ``path`` (atomically, never over an existing file); return its digest."""
    write_file(path, roster.text().encode(), 0o644)
    return roster.digest()


def check_not_revoked(pins: Iterable[Pin], revoked: Iterable[str]) -> None:
    """Refuse to pin a certificate the federation revoked (ConfigError naming it and the fix)."""
    gone = set(revoked)
    for pin in pins:
        if pin.sha256 in gone:
            raise ConfigError(
                f"the certificate of {pin.name!r} (sha256 {pin.sha256}) was revoked in this federation; pin its "
                "replacement: a new key and certificate (`fedfair pki request`, then `fedfair pki sign`)"
            )
