"""Participant names and roles: what a certificate may be issued to, and for what.

A participant name is at once the certificate's common name, a DNS name in its
subject alternative names and the stem of its files (``NAME.key``, ``NAME.crt``),
so it must be a valid lower-case DNS name that cannot collide with the CA's own
files. A role is what the participant does in the federation: one aggregator,
many collaborators, and an auditor where the plan's input bound asks for a second verifier
(fedfair.runtime.plan.input_bound). A federation id names the federation itself in the plan, in
every message binding and in the manifest the institutions agree on.
"""

from __future__ import annotations

import re

from fedfair.core.errors import ConfigError

ROLES = ("aggregator", "collaborator", "auditor")
# Names double as DNS names (in the SAN) and file names: lower-case DNS labels joined by dots.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_RESERVED_NAMES = frozenset({"ca"})
FEDERATION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A federation id: letters, digits, '.', '_' or '-', starting with a letter or digit, at most 128."""


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid participant name, else raise ConfigError."""
    if not isinstance(name, str) or len(name) > 253 or not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"invalid participant name {name!r}; use lower-case letters, digits and hyphens"
            " (dots between labels), e.g. 'hospital-a'"
        )
    if name in _RESERVED_NAMES:
        raise ConfigError(f"the name {name!r} is reserved for the CA's own files; choose another name")
    return name


def check_role(role: str) -> str:
    """Return ``role`` if it is one of :data:`ROLES`, else raise ConfigError."""
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; choose one of: {', '.join(ROLES)}")
    return role


def validate_federation_id(federation_id: str) -> str:
    """Return ``federation_id`` if it matches :data:`FEDERATION_ID_RE`, else raise ConfigError."""
    if not isinstance(federation_id, str) or not FEDERATION_ID_RE.fullmatch(federation_id):
        raise ConfigError(
            f"invalid federation id {federation_id!r}; use letters, digits, '.', '_' or '-' (at most 128),"
            " e.g. 'fedfair-demo'"
        )
    return federation_id
