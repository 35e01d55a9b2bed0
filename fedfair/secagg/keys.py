"""Key agreement, key derivation and share encryption for one secure-aggregation round.

Each party makes two fresh X25519 key pairs per round: a *cipher* pair, whose
agreement with a peer keys the AES-256-GCM encryption of the Shamir shares sent to
that peer, and a *mask* pair, whose agreement keys the pairwise mask. Shared
secrets never key anything directly: HKDF-SHA256 derives a 32-byte key with the
session id as salt and, as info, a fixed domain label, the purpose and the two
party ids (smaller first, so both ends derive the same key). Distinct purposes and
sessions therefore never share a key, which is what lets the PRG use a fixed
counter block.

Identity signatures over the advertised keys live in :mod:`fedfair.pki.identity`.
"""

from __future__ import annotations

import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedfair.core.errors import AuthenticationError

DOMAIN = b"fedfair/secagg/v2/"
"""Prefix of every HKDF info and associated-data string: separates fedfair's keys
from any other protocol that might reuse the same secrets."""

KEY_BYTES = 32
_NONCE_BYTES = 12
_PROBE = X25519PrivateKey.generate()
"""A key that never leaves this process, used only by :func:`check_public_key`."""


def generate_key_pair() -> X25519PrivateKey:
    """A fresh X25519 private key (one per purpose per round)."""
    return X25519PrivateKey.generate()


def public_bytes(private_key: X25519PrivateKey) -> bytes:
    """The 32-byte raw public key to advertise."""
    return private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_bytes(private_key: X25519PrivateKey) -> bytes:
    """The 32-byte raw private key (what the mask key's Shamir shares hide)."""
    return private_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def load_private(raw: bytes) -> X25519PrivateKey:
    """Rebuild a private key from its raw bytes (after Shamir reconstruction)."""
    return X25519PrivateKey.from_private_bytes(raw)


def agree(private_key: X25519PrivateKey, peer_public: bytes) -> bytes:
    """The X25519 shared secret with a peer's raw public key.

    Refuses malformed keys and low-order points (which OpenSSL rejects because they give
    an all-zero secret an attacker could predict).
    """
    try:
        return private_key.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError:
        raise AuthenticationError("a peer's X25519 public key is malformed or of low order") from None


def check_public_key(public: bytes) -> None:
    """Refuse a raw X25519 public key that no agreement could use (malformed or low order).

    A low-order point makes every agreement all-zero whatever the private key, so one
    agreement with a throwaway key tells. The server checks every advertisement this way, so
    it can refuse such a key at once; a party checks the keys it agrees with by that agreement
    itself, and only the others by this probe.
    """
    agree(_PROBE, public)


def hkdf(secret: bytes, salt: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 with a 32-byte output."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(secret)


def _pair(a: int, b: int) -> bytes:
    return struct.pack(">II", min(a, b), max(a, b))


def share_encryption_key(cipher_secret: bytes, session_id: bytes, me: int, peer: int) -> bytes:
    """AES-256-GCM key (32 bytes) for the shares exchanged between ``me`` and ``peer`` in this session.

    ``cipher_secret`` is the :func:`agree` secret of their cipher keys; the key is the same at both ends.
    """
    return hkdf(cipher_secret, session_id, DOMAIN + b"share-encryption" + _pair(me, peer))


def pair_mask_key(mask_secret: bytes, session_id: bytes, me: int, peer: int) -> bytes:
    """PRG key (32 bytes) of the pairwise mask between ``me`` and ``peer``, identical at both ends.

    ``mask_secret`` is the :func:`agree` secret of their mask keys.
    """
    return hkdf(mask_secret, session_id, DOMAIN + b"pair-mask" + _pair(me, peer))


def pair_tag_key(mask_secret: bytes, session_id: bytes, me: int, peer: int) -> bytes:
    """Key (32 bytes) of the pairwise masks of ``me`` and ``peer``'s verification tags, identical at both ends.

    From the same :func:`agree` secret as :func:`pair_mask_key` under another purpose, so the two never share a key.
    """
    return hkdf(mask_secret, session_id, DOMAIN + b"verify-tag-mask" + _pair(me, peer))


def self_mask_key(seed: bytes, session_id: bytes, owner: int) -> bytes:
    """PRG key of ``owner``'s self mask, from its secret seed."""
    return hkdf(seed, session_id, DOMAIN + b"self-mask" + struct.pack(">I", owner))


def share_associated_data(session_id: bytes, sender: int, recipient: int) -> bytes:
    """What the share ciphertext is bound to: session, direction and both parties.

    Labelled v3, the format of the sealed plaintext (v2's carried a dealer signature inside).
    """
    return b"fedfair/secagg/v3/shares" + session_id + struct.pack(">II", sender, recipient)


def seal(key: bytes, plaintext: bytes, associated_data: bytes) -> bytes:
    """AES-256-GCM encryption with a random 96-bit nonce, returned as nonce | ciphertext | tag."""
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated_data)


def open_sealed(key: bytes, sealed: bytes, associated_data: bytes) -> bytes:
    """Decrypt :func:`seal` output; raises :class:`AuthenticationError` if anything was altered."""
    if len(sealed) < _NONCE_BYTES + 16:
        raise AuthenticationError("encrypted shares are truncated")
    try:
        return AESGCM(key).decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], associated_data)
    except InvalidTag:
        raise AuthenticationError(
            "encrypted shares fail authentication (wrong key, session, sender or recipient, or tampered)"
        ) from None
