"""Roster updates a running federation takes: a manifest that re-keys sites, signed by the CA holder.

An update names the manifest it replaces and the federation's first one (its origin, which stays the
federation's identity: plan digest, checkpoints); it may change only pins, each replaced pin's old fingerprint
joining the revoked list. :class:`LiveManifest` is the manifest a running party holds: it re-reads its file,
takes a valid update, and refuses a forged one (not the CA holder's, or a broken chain), keeping what it held.

Why: docs/security.md, "Who may change the roster".
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ConfigError, ManifestError
from fedfair.pki.identity import is_valid_signature, sign
from fedfair.pki.store import write_file
from fedfair.secagg.credentials import RememberedVerifier
from fedfair.runtime.manifest import (
    Manifest,
    Update,
    federation_digest,
    load_manifest,
    manifest_digest,
    pinned_verifier,
)

logger = logging.getLogger("fedfair.manifest")

SIGNED_CONTEXT = b"fedfair manifest update v1\n"
"""What the CA holder's signature covers before the digests, so no other signed bytes pass for an update."""


def signed_message(origin: str, replaces: str, digest: str) -> bytes:
    """The bytes the CA holder signs: the chain (origin, predecessor) and the new manifest's digest."""
    return SIGNED_CONTEXT + f"{origin}\n{replaces}\n{digest}\n".encode()


def signed_update(previous: Manifest, new: Manifest, ca_key: ec.EllipticCurvePrivateKey) -> Manifest:
    """`new` as a signed update of `previous`, with the CA key `ca_key` (checked first by :func:`check_update`)."""
    origin, replaces = federation_digest(previous), manifest_digest(previous)
    signature = sign(ca_key, signed_message(origin, replaces, manifest_digest(new)))
    return dataclasses.replace(new, update=Update(replaces, origin, signature))


def write_update(path: Path, manifest: Manifest) -> None:
    """Write a signed update as TOML (atomically, never over an existing file)."""
    if manifest.update is None:
        raise ConfigError("the manifest to write carries no [update]; sign it with `signed_update` first")
    text = manifest.roster.text()
    update = manifest.update
    text += (
        f'\n[update]\nreplaces = "{update.replaces}"\norigin = "{update.origin}"\n'
        f'signature = "{base64.b64encode(update.signature).decode()}"\n'
    )
    write_file(path, text.encode(), 0o644)


def check_update(held: Manifest, candidate: Manifest, ca_certificate: x509.Certificate) -> None:
    """Refuse `candidate` as the successor of `held` unless the CA holder signed it and it only re-keys sites.

    Raises:
        ManifestError: naming what is wrong (unsigned, a signature not the CA holder's, a broken chain, or a
            change beyond pins) and the fix.
    """
    update = candidate.update
    where = f"the manifest update {candidate.source}"
    if update is None:
        raise ManifestError(
            f"{where} is not a signed update: a running federation takes only a manifest the CA holder signed "
            "that names the one it replaces (`fedfair pki revoke ... --sign CA_FOLDER`)"
        )
    key = ca_certificate.public_key()
    message = signed_message(update.origin, update.replaces, manifest_digest(candidate))
    if not isinstance(key, ec.EllipticCurvePublicKey) or not is_valid_signature(key, update.signature, message):
        raise ManifestError(
            f"{where} is not signed by the federation's CA holder (or was changed after signing): refused, "
            "the manifest in force stays; ask the CA holder to sign the update"
        )
    if update.replaces != manifest_digest(held) or update.origin != federation_digest(held):
        raise ManifestError(
            f"{where} replaces manifest {update.replaces} of federation {update.origin}, but the one in force is "
            f"{manifest_digest(held)} of federation {federation_digest(held)}: a broken chain, refused; sign "
            "an update of the manifest in force"
        )
    _check_only_pins_changed(held, candidate, where)


def _check_only_pins_changed(held: Manifest, candidate: Manifest, where: str) -> None:
    """An update keeps everything but collaborators' and auditors' pins; a replaced pin's fingerprint is revoked."""
    kept = ("federation_id", "aggregator", "max_colluding", "min_round_size", "plan")
    changed = [field for field in kept if getattr(held, field) != getattr(candidate, field)]
    if held.collaborator_names != candidate.collaborator_names:
        changed.append("collaborators' names")
    if {pin.name for pin in held.auditors} != {pin.name for pin in candidate.auditors}:
        changed.append("auditors' names")
    if not set(held.revoked) <= set(candidate.revoked):
        changed.append("revoked (an entry was dropped)")
    if changed:
        raise ManifestError(
            f"{where} changes {', '.join(changed)}; a running federation takes only re-keyed sites: for any other "
            "change start a new federation (`fedfair plan renew`)"
        )
    for pin in (*held.collaborators, *held.auditors):
        new = candidate.pin(pin.name)
        if new is not None and new.sha256 != pin.sha256 and pin.sha256 not in candidate.revoked:
            raise ManifestError(f"{where} re-keys {pin.name!r} without revoking its old certificate {pin.sha256}")


class LiveManifest(RememberedVerifier):
    """The manifest a running party holds, taking signed updates from its file as they are put in place.

    As a :data:`~fedfair.pki.identity.CredentialVerifier` it checks peers' credentials in key agreement under
    the manifest in force, forgetting at each update what it accepted before. The aggregator polls its file at
    each round's start and names the manifest in the round's tasks; a site :meth:`settle` s on that name, so
    every party of a round checks peers under one roster, whenever the file lands. Thread-safe.
    """

    def __init__(self, manifest: Manifest, ca_certificate: x509.Certificate) -> None:
        super().__init__(pinned_verifier(manifest, ca_certificate))
        self.ca_certificate = ca_certificate
        self._manifest_lock = threading.Lock()
        self._manifest = manifest
        # Nothing seen yet: the first poll reads the file, which may already hold an update of `manifest`
        # (a site that re-dials after the update landed, with the manifest it read at start).
        self._seen: tuple[int, int] | None = None
        self._missed: set[str] = set()

    @property
    def current(self) -> Manifest:
        """The manifest in force."""
        with self._manifest_lock:
            return self._manifest

    def _stamp(self) -> tuple[int, int] | None:
        try:
            status = Path(self._manifest.source).stat()
        except OSError:
            return None
        return status.st_mtime_ns, status.st_size

    def poll(self) -> Manifest | None:
        """Take the file's manifest if it changed and is a valid update; return it, or None if nothing changed.

        A refused update is logged as an error naming why, and changes nothing (it is not read again until the
        file changes).
        """
        with self._manifest_lock:
            stamp = self._stamp()
            if stamp is None or stamp == self._seen:
                return None
            self._seen = stamp
            held = self._manifest
            try:
                candidate = load_manifest(held.source)
                if manifest_digest(candidate) == manifest_digest(held):
                    return None
                check_update(held, candidate, self.ca_certificate)
            except ConfigError as error:
                logger.error("manifest update refused: %s", error)
                return None
            self._manifest = candidate
            self.replace(pinned_verifier(candidate, self.ca_certificate))
        logger.warning(
            "manifest update %s taken (federation %s): revoked %s",
            manifest_digest(candidate),
            federation_digest(candidate),
            ", ".join(sorted(set(candidate.revoked) - set(held.revoked))) or "nothing new",
        )
        return candidate

    def settle(self, digest: str) -> bool:
        """Hold the manifest with sha256 `digest`, the one the aggregator's round runs under; True once held.

        The file is read only when the round names another manifest than the one held, so an update put in
        place mid-round waits for the round that names it. When the file does not hold it (yet), the error
        is logged once per digest, the manifest held stays in force, and the site sits such rounds out.
        """
        if not digest or digest == manifest_digest(self.current):
            return True
        self.poll()
        if digest == manifest_digest(self.current):
            return True
        if digest not in self._missed:
            self._missed.add(digest)
            logger.error(
                "the aggregator's round runs under manifest %s, but %s holds %s: put the CA-signed update in place "
                "of that file (this site sits out the rounds under it until then)",
                digest,
                self.current.source,
                manifest_digest(self.current),
            )
        return False
