"""The federation manifest: the roster the institutions agreed on, held by each of them.

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from fedfair.core.errors import ConfigError, ManifestError
from fedfair.pki.identity import CredentialVerifier
from fedfair.pki.names import FEDERATION_ID_RE, ROLES, validate_name
from fedfair.pki.roster import PARTICIPANTS, Pin, PlanPin, Roster, check_not_revoked, check_pins
from fedfair.pki.verification import (
    der_fingerprint,
    normalise_fingerprint,
    pinned_credential_verifier,
)
from fedfair.core.tables import Table, check_sections, field_names, parse_json_object, read_toml


SHA256_HEX = re.compile(r"[0-9a-f]{64}")

NO_MANIFEST_WARNING = (
    "no federation manifest: each round's roster is trusted to the federation's CA, whose holder could add "
    "parties of its own; agree on one with `fedfair pki manifest` and set [collaborator] manifest"
)
"""The one line a collaborator logs when it runs without a manifest."""


UNPINNED_PLAN_WARNING = (
    "the manifest pins no plan: the aggregator may change the model, the evaluation grid, the schema and the "
    "masking graph at will; pin the agreed plan with `fedfair plan pin` and share the new manifest"
)
"""The one line a collaborator or an auditor logs when its manifest has no [plan]."""


@dataclass(frozen=True)
class Update:
    """A manifest's [update]: it replaces the manifest whose digest is `replaces`, in the chain begun by `origin`.

    `signature` is the CA holder's (:mod:`fedfair.runtime.manifest_update` checks it).
    """

    replaces: str
    origin: str
    signature: bytes


@dataclass(frozen=True)
class Manifest:
    """The agreed roster: the federation, its aggregator and collaborators pinned by fingerprint, and its bounds."""

    federation_id: str
    aggregator: Pin
    collaborators: tuple[Pin, ...]
    """Sorted by name."""
    max_colluding: int
    """How many collaborators may collude with the aggregator (the plan's [secure_aggregation] max_colluding)."""
    min_round_size: int
    """The fewest parties a round may have (at least max_colluding + 2)."""
    source: Path
    plan: PlanPin | None = None
    """The pinned plan: the shared settings every collaborator must receive, or None (unpinned)."""
    revoked: tuple[str, ...] = ()
    """The SHA-256 fingerprints of the certificates revoked in this federation (sorted): never pinned again."""
    update: Update | None = None
    """Set when this manifest is a signed update of an earlier one, which a running federation takes."""
    auditors: tuple[Pin, ...] = ()
    """The auditor institutions (role "auditor", sorted by name): second verifiers a plan's input bound may name
    (fedfair.runtime.plan.input_bound); neither the aggregator nor collaborators."""

    @property
    def roster(self) -> Roster:
        """The content the institutions agreed on, without the file's source and [update]."""
        return Roster(
            self.federation_id,
            (self.aggregator, *self.collaborators, *self.auditors),
            self.max_colluding,
            self.min_round_size,
            self.plan,
            self.revoked,
        )

    @property
    def collaborator_names(self) -> frozenset[str]:
        """The names of every collaborator the manifest lists."""
        return frozenset(pin.name for pin in self.collaborators)

    def pin(self, name: str) -> Pin | None:
        """The pin of participant ``name`` (of any role), or None if the manifest does not list it."""
        return next((pin for pin in (self.aggregator, *self.collaborators, *self.auditors) if pin.name == name), None)

    def check_roster(self, parties: Sequence[str]) -> None:
        """Refuse a round's roster naming anyone the manifest does not list, or fewer than min_round_size parties."""
        strangers = sorted(set(parties) - self.collaborator_names)
        if strangers:
            raise ManifestError(
                f"the round's roster includes {', '.join(repr(name) for name in strangers)}, not a collaborator in "
                f"the manifest {self.source}; whoever holds the CA may have added parties of its own: refuse the round"
            )
        if len(set(parties)) != len(parties):
            raise ManifestError("the round's roster lists a party twice; refuse the round")
        if len(parties) < self.min_round_size:
            raise ManifestError(
                f"the round has {len(parties)} parties, fewer than min_round_size = {self.min_round_size} in the "
                f"manifest {self.source}; a round that small could expose one institution's input: refuse it"
            )


# ---------------------------------------------------------------- reading


def parse_manifest(data: Mapping[str, Any], source: Path) -> Manifest:
    """Validate a manifest already read from TOML (``source`` for messages)."""
    where = str(source)
    check_sections(where, data, ("federation", PARTICIPANTS, "plan", "update"))
    federation = Table.of(where, data, "federation", ("id", "max_colluding", "min_round_size", "revoked"))
    federation_id = federation.string("id", pattern=FEDERATION_ID_RE, expected="letters, digits, '.', '_' or '-'")
    max_colluding = federation.integer("max_colluding", 0, low=0)
    min_round_size = federation.integer("min_round_size", low=2)
    entries = data.get(PARTICIPANTS)
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{where}: no [[{PARTICIPANTS}]] tables; add one per participant with name, role and sha256 "
            "(`fedfair pki manifest` writes them from the certificates)"
        )
    pins = [_pin(where, index, entry) for index, entry in enumerate(entries, start=1)]
    revoked: tuple[str, ...] = ()
    if federation.given("revoked"):
        listed = federation.items("revoked", lambda item: isinstance(item, str), "a list of SHA-256 fingerprints")
        try:
            revoked = tuple(sorted({normalise_fingerprint(item) for item in listed}))
        except ConfigError as error:
            federation.fail(f"[federation] revoked: {error}")
    try:
        aggregator, collaborators = check_pins(pins, max_colluding, min_round_size)
        check_not_revoked(pins, revoked)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    plan = _plan_pin(where, data)
    auditors = tuple(sorted((pin for pin in pins if pin.role == "auditor"), key=lambda pin: pin.name))
    return Manifest(
        federation_id,
        aggregator,
        collaborators,
        max_colluding,
        min_round_size,
        source,
        plan,
        revoked,
        _update(where, data),
        auditors,
    )


def _update(where: str, data: Mapping[str, Any]) -> Update | None:
    """The manifest's [update]: the digests it replaces and descends from, and the CA holder's signature."""
    if "update" not in data:
        return None
    table = Table.of(where, data, "update", ("replaces", "origin", "signature"))
    replaces = table.string("replaces", pattern=SHA256_HEX, expected="64 lower-case hex digits")
    origin = table.string("origin", pattern=SHA256_HEX, expected="64 lower-case hex digits")
    try:
        signature = base64.b64decode(table.string("signature", expected="base64"), validate=True)
    except binascii.Error:
        table.fail("[update] signature is not base64; write the update again with `fedfair pki revoke --sign`")
    return Update(replaces, origin, signature)


def _plan_pin(where: str, data: Mapping[str, Any]) -> PlanPin | None:
    """The manifest's [plan]: its settings (a JSON object) and their digest, which must agree."""
    if "plan" not in data:
        return None
    table = Table.of(where, data, "plan", ("sha256", "settings"))
    digest = table.string("sha256", pattern=SHA256_HEX, expected="64 lower-case hex digits")
    settings = parse_json_object(
        table.string("settings", expected="the plan's settings as a JSON object"),
        f"{where}: [plan] settings",
        "write the manifest again with `fedfair plan pin`",
    )
    try:
        return PlanPin(settings, digest)
    except ConfigError as error:
        table.fail(str(error))


def _pin(where: str, index: int, entry: object) -> Pin:
    """The participant in the ``index``-th [[participants]] table."""
    table = Table(where, PARTICIPANTS, entry, field_names(Pin), entry=index)
    name = table.name("name", validate_name)
    role = table.string("role", choices=ROLES)
    fingerprint = table.string("sha256", expected="a SHA-256 fingerprint (64 hex digits, colons allowed)")
    try:
        return Pin(name, role, normalise_fingerprint(fingerprint))
    except ConfigError as error:
        table.fail(f"{table.where} sha256 of {name!r}: {error}")


def load_manifest(path: Path | str) -> Manifest:
    """Read and validate a manifest file; every error names the file, the field and the fix."""
    if not Path(path).is_file():
        raise ConfigError(
            f"manifest {path} not found; put there the copy the institutions agreed on "
            "(`fedfair pki manifest` builds one from the issued certificates)"
        )
    source, data = read_toml(path)
    return parse_manifest(data, source)


def manifest_digest(manifest: Manifest) -> str:
    """SHA-256 (hex) of the manifest's content, what the institutions compare (comments and order do not count)."""
    return manifest.roster.digest()


def federation_digest(manifest: Manifest) -> str:
    """The digest that names the federation: its first manifest's, which every signed update carries on."""
    return manifest_digest(manifest) if manifest.update is None else manifest.update.origin


def revoked(
    manifest: Manifest, name: str, replacement: Pin | None = None, min_round_size: int | None = None
) -> Manifest:
    """`manifest` with collaborator or auditor `name`'s certificate revoked: its pin removed, or replaced by `replacement`.

    Its fingerprint joins the manifest's revoked ones, which no later manifest made from this one pins again.

    Whatever the manifest no longer pins is refused at the aggregator's handshake and in every peer's key
    agreement. A replacement (the same institution, a new key) keeps the roster and so the pinned plan; a
    removal changes the roster the plan must name, so the result pins no plan (pin the edited plan on it).
    `min_round_size` lowers the bound where the roster left is smaller than it.

    Raises:
        ConfigError: `name` is neither a collaborator nor an auditor of the manifest, the replacement is for
            another name or role or is the revoked certificate itself, the roster left breaks the manifest's
            bounds, or `name` is the auditor the pinned plan's input bound names and no replacement is given.
    """
    pin = manifest.pin(name)
    if pin is None or pin.role == "aggregator":
        raise ConfigError(
            f"{name!r} is not a collaborator or an auditor in the manifest {manifest.source}; check the name"
        )
    if replacement is not None:
        if replacement.name != name or replacement.role != pin.role:
            raise ConfigError(
                f"the replacement certificate is for {replacement.role} {replacement.name!r}, not {pin.role} {name!r}"
            )
        if replacement.sha256 == pin.sha256:
            raise ConfigError(f"the replacement for {name!r} is the certificate being revoked; issue a new one")
    elif pin.role == "auditor" and pinned_auditor(manifest) == name:
        raise ConfigError(
            f"{name!r} is the auditor the pinned plan's [secure_aggregation] input bound names as its second "
            f"verifier; removing it leaves that plan without one: give its replacement certificate (--replace "
            "NEW.crt: the same institution, a new key), or start a new federation with another auditor or none "
            "(`fedfair plan renew`)"
        )
    group = manifest.collaborators if pin.role == "collaborator" else manifest.auditors
    kept = (*(other for other in group if other.name != name), *(() if replacement is None else (replacement,)))
    kept = tuple(sorted(kept, key=lambda other: other.name))
    collaborators = kept if pin.role == "collaborator" else manifest.collaborators
    auditors = kept if pin.role == "auditor" else manifest.auditors
    bound = manifest.min_round_size if min_round_size is None else min_round_size
    try:
        check_pins((manifest.aggregator, *collaborators, *auditors), manifest.max_colluding, bound)
    except ConfigError as error:
        raise ConfigError(f"without {name!r}: {error} (--min-round-size)") from None
    plan = manifest.plan if replacement is not None else None
    revoked = tuple(sorted({*manifest.revoked, pin.sha256}))
    return dataclasses.replace(
        manifest,
        collaborators=collaborators,
        auditors=auditors,
        min_round_size=bound,
        plan=plan,
        revoked=revoked,
        update=None,
    )


def pinned_auditor(manifest: Manifest) -> str | None:
    """The auditor the manifest's pinned plan names ([secure_aggregation] auditor), or None."""
    section = manifest.plan.settings.get("secure_aggregation") if manifest.plan is not None else None
    auditor = section.get("auditor") if isinstance(section, Mapping) else None
    return auditor if isinstance(auditor, str) else None


# ---------------------------------------------------------------- certificates


def pinned_verifier(manifest: Manifest, ca_certificate: x509.Certificate) -> CredentialVerifier:
    """The CredentialVerifier for secure aggregation under a manifest.

    A relayed credential is accepted only if the CA issued it as a collaborator
    certificate to that name, valid now, AND its SHA-256 fingerprint is the one the
    manifest pins for the name: a second certificate the CA minted for the same name
    (a twin with another key), or any name the manifest does not list, is refused.
    """
    return pinned_credential_verifier(
        ca_certificate, {pin.name: pin.sha256 for pin in manifest.collaborators}, "collaborator", manifest.revoked
    )


def check_certificate(manifest: Manifest, name: str, der: bytes) -> None:
    """Refuse the certificate ``der`` (DER) for participant ``name`` unless it is the one the manifest pins."""
    pin = manifest.pin(name)
    if pin is None:
        raise ManifestError(f"{name!r} is not a participant in the manifest {manifest.source}; check the name")
    presented = der_fingerprint(der)
    if presented != pin.sha256:
        raise ManifestError(
            f"the certificate of {name!r} (sha256 {presented}) is not the one the manifest {manifest.source} pins "
            f"({pin.sha256}); if it was renewed, agree on a new manifest, otherwise the CA has issued another "
            "certificate for this name: do not use it"
        )


def check_aggregator_certificate(manifest: Manifest, der: bytes) -> None:
    """Refuse an aggregator whose TLS certificate (DER) is not the one the manifest pins."""
    check_certificate(manifest, manifest.aggregator.name, der)


def check_federation(manifest: Manifest, federation_id: str, where: str) -> None:
    """The federation id is the manifest's."""
    if federation_id != manifest.federation_id:
        raise ManifestError(
            f"{where}: federation {federation_id!r}, but the manifest {manifest.source} is for "
            f"{manifest.federation_id!r}; use the manifest of this federation"
        )
