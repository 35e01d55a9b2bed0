"""Secure-aggregation payloads crafted by the attacker from the protocol's published encoding.

The payloads inside Submit/Fetch are opaque bytes to the gRPC schema; their encoding is
documented in ``fedfair/secagg/messages.py`` and ``fedfair/secagg/codec.py`` (protocol
v3: magic ``FSA3``, a message type byte, a header (federation id, round, stage,
session id), then the fields: integers big-endian, byte strings with a u64 length).
This module re-implements exactly what the attacks need from that description, with
``cryptography`` for the keys and signatures; it imports nothing of fedfair.

Every crafted message has a *control*: the same construction with honest values
(a genuine, signed advertisement) that the aggregator must accept. A refusal of a
forged variant only counts when its control was accepted, so a stale encoding here
shows up as a failed row, never as a false pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

MAGIC = b"FSA3"
DOMAIN = "fedfair/secagg/v2/"
DEALING_DOMAIN = "fedfair/secagg/v3/"
"""The labels of the dealing (v3); every other label kept its v2 format and name."""

# Message type bytes and the protocol's own stage numbers (not the gRPC Stage enum).
ADVERTISE_KEYS, KEY_DIRECTORY, SHARE_KEYS, SHARE_CHECK = 1, 2, 3, 8
STAGE_ADVERTISE, STAGE_SHARE, STAGE_CHECK = 1, 2, 3


class Writer:
    """The protocol's canonical encoding: fixed-width big-endian integers, u64-length-prefixed bytes."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def u8(self, value: int) -> Writer:
        self._parts.append(struct.pack(">B", value))
        return self

    def u32(self, value: int) -> Writer:
        self._parts.append(struct.pack(">I", value))
        return self

    def u64(self, value: int) -> Writer:
        self._parts.append(struct.pack(">Q", value))
        return self

    def f64(self, value: float) -> Writer:
        self._parts.append(struct.pack(">d", value))
        return self

    def blob(self, value: bytes) -> Writer:
        self._parts.append(struct.pack(">Q", len(value)) + value)
        return self

    def text(self, value: str) -> Writer:
        return self.blob(value.encode())

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    """Reads what :class:`Writer` writes; raises ValueError on truncated input."""

    def __init__(self, data: bytes) -> None:
        self._data, self._offset = data, 0

    def _take(self, size: int) -> bytes:
        if self._offset + size > len(self._data):
            raise ValueError("truncated secure-aggregation message")
        chunk = self._data[self._offset : self._offset + size]
        self._offset += size
        return chunk

    def u8(self) -> int:
        return int(self._take(1)[0])

    def u32(self) -> int:
        return int(struct.unpack(">I", self._take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self._take(8))[0])

    def blob(self) -> bytes:
        return self._take(self.u64())

    def text(self) -> str:
        return self.blob().decode()


def header(writer: Writer, federation_id: str, session_round: int, stage: int, session: bytes) -> Writer:
    return writer.text(federation_id).u64(session_round).u8(stage).blob(session)


def sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    """ECDSA P-256 / SHA-256, DER: the signature the protocol uses with identity keys."""
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


def load_identity_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    """The attacker's own identity key (the key of its certificate), from PEM."""
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError("identity keys are ECDSA keys")
    return key


def certificate_der(pem: bytes) -> bytes:
    """A PEM certificate as the DER bytes an advertisement carries as its credential."""
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


def raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# ---------------------------------------------------------------- the round's public parameters


@dataclass(frozen=True)
class RoundInfo:
    """The round parameters the aggregator relays at ADVERTISE (JSON), and what follows from them."""

    federation_id: str
    kind: str
    round: int
    parties: tuple[str, ...]
    dimension: int
    encoding: dict[str, Any]
    threshold: int | None
    neighbours: int | None
    max_colluding: int
    graph_roster: tuple[str, ...]
    graph_seed: bytes
    context: bytes = b""
    """The digest of the model every party was sent (the parameters' "model", hex), bound into the session."""

    @classmethod
    def parse(cls, federation_id: str, payload: bytes) -> RoundInfo:
        document = json.loads(payload)
        return cls(
            federation_id=federation_id,
            kind=str(document["kind"]),
            round=int(document["round"]),
            parties=tuple(document["parties"]),
            dimension=int(document["dimension"]),
            encoding=dict(document["encoding"]),
            threshold=document.get("threshold"),
            neighbours=document.get("neighbours"),
            max_colluding=int(document.get("max_colluding") or 0),
            graph_roster=tuple(sorted(document["graph_roster"])),
            graph_seed=bytes.fromhex(document.get("graph_seed") or ""),
            context=bytes.fromhex(document.get("model") or ""),
        )

    @property
    def session_round(self) -> int:
        """Training round r is secure-aggregation session 2r, its evaluation 2r + 1."""
        return 2 * self.round + (1 if self.kind == "evaluate" else 0)

    @property
    def complete(self) -> bool:
        return self.neighbours is None or self.neighbours >= len(self.graph_roster) - 1

    @property
    def holders(self) -> int:
        return len(self.parties) if self.complete else int(self.neighbours or 0) + 1

    @property
    def t(self) -> int:
        """The threshold in force: the announced one, or the smallest the protocol's rule allows."""
        if self.threshold is not None:
            return int(self.threshold)
        return max((self.holders + self.max_colluding) // 2 + 1, self.max_colluding + 2)

    def party_id(self, name: str) -> int:
        return self.parties.index(name) + 1

    def config_digest(self) -> bytes:
        writer = Writer().text(DOMAIN + "config").text(self.federation_id).u64(self.session_round)
        writer.u32(len(self.parties))
        for name in self.parties:
            writer.text(name)
        writer.u64(self.dimension).u32(self.t).u32(0 if self.complete else self.holders - 1)
        writer.u32(self.max_colluding)
        if not self.complete:
            writer.blob(self.graph_seed)
        encoding = self.encoding
        writer.f64(float(encoding["clip"])).f64(float(encoding["max_weight"]))
        writer.u32(int(encoding["fractional_bits"])).u32(int(encoding["modulus_bits"]))
        if self.context:  # left out when empty (the statistics aggregation), as the protocol does
            writer.blob(self.context)
        return hashlib.sha256(writer.getvalue()).digest()


# ---------------------------------------------------------------- ADVERTISE


@dataclass(frozen=True)
class Advertisement:
    """One party's advertised keys, as the key directory lists them."""

    sender: int
    cipher_public_key: bytes
    mask_public_key: bytes
    seed_commitment: bytes
    credential: bytes
    signature: bytes


@dataclass
class RoundKeys:
    """The attacker's own fresh secrets for one round."""

    cipher: X25519PrivateKey
    mask: X25519PrivateKey
    seed: bytes

    @classmethod
    def fresh(cls) -> RoundKeys:
        return cls(X25519PrivateKey.generate(), X25519PrivateKey.generate(), os.urandom(32))


def seed_commitment(digest: bytes, party: int, seed: bytes) -> bytes:
    writer = Writer().text(DOMAIN + "seed-commitment").blob(digest).u32(party).blob(seed)
    return hashlib.sha256(writer.getvalue()).digest()


def advertisement(
    info: RoundInfo,
    sender: int,
    keys: RoundKeys,
    credential: bytes,
    signer: ec.EllipticCurvePrivateKey | None,
    *,
    signed_over: RoundInfo | None = None,
) -> bytes:
    """An AdvertiseKeys message naming ``sender``. ``signer`` None leaves the signature empty
    (unsigned); ``signed_over`` (if given) are the round parameters the signature and the seed
    commitment are bound to instead of this round's."""
    digest = (signed_over or info).config_digest()
    cipher, mask = raw_public(keys.cipher), raw_public(keys.mask)
    commitment = seed_commitment(digest, sender, keys.seed)
    signed = (
        Writer().text(DOMAIN + "advertise").blob(digest).u32(sender).blob(cipher).blob(mask).blob(commitment).getvalue()
    )
    signature = b"" if signer is None else sign(signer, signed)
    writer = header(
        Writer().blob(MAGIC).u8(ADVERTISE_KEYS), info.federation_id, info.session_round, STAGE_ADVERTISE, b""
    )
    writer.u32(sender)
    writer.blob(cipher).blob(mask).blob(commitment).blob(credential).blob(signature)
    return writer.getvalue()


def parse_key_directory(payload: bytes) -> list[Advertisement]:
    """The advertisements listed in a KeyDirectory (the SHARE stage's input)."""
    reader = Reader(payload)
    if reader.blob() != MAGIC or reader.u8() != KEY_DIRECTORY:
        raise ValueError("not a v2 key directory")
    _read_header(reader)
    listed = []
    for _ in range(reader.u32()):
        _read_header(reader)
        sender = reader.u32()
        listed.append(Advertisement(sender, reader.blob(), reader.blob(), reader.blob(), reader.blob(), reader.blob()))
    return listed


def _read_header(reader: Reader) -> tuple[str, int, int, bytes]:
    return reader.text(), reader.u64(), reader.u8(), reader.blob()


def session_id(digest: bytes, advertisements: list[Advertisement]) -> bytes:
    writer = Writer().text(DOMAIN + "session").blob(digest).u32(len(advertisements))
    for entry in sorted(advertisements, key=lambda a: a.sender):
        writer.u32(entry.sender).blob(entry.cipher_public_key).blob(entry.mask_public_key).blob(entry.seed_commitment)
    return hashlib.sha256(writer.getvalue()).digest()


# ---------------------------------------------------------------- SHARE


def share_keys(
    info: RoundInfo,
    session: bytes,
    sender: int,
    recipients: list[int],
    signer: ec.EllipticCurvePrivateKey,
    ciphertext_for: Callable[[int], bytes],
) -> bytes:
    """A ShareKeys message whose entries carry ``ciphertext_for(recipient)`` (and made-up share commitments),
    all under the sender's one signature over its dealing, as the protocol requires (so a recipient can
    prove what it was sent)."""
    writer = header(Writer().blob(MAGIC).u8(SHARE_KEYS), info.federation_id, info.session_round, STAGE_SHARE, session)
    writer.u32(sender).u32(len(recipients))
    digests = []
    for recipient in sorted(recipients):
        ciphertext, seed_commitment, key_commitment = ciphertext_for(recipient), os.urandom(32), os.urandom(32)
        writer.u32(sender).u32(recipient).blob(ciphertext).blob(seed_commitment).blob(key_commitment)
        line = Writer().text(DEALING_DOMAIN + "dealing-line").blob(session).u32(sender).u32(recipient)
        line.blob(ciphertext).blob(seed_commitment).blob(key_commitment)
        digests.append(hashlib.sha256(line.getvalue()).digest())
    signed = Writer().text(DEALING_DOMAIN + "dealing").blob(session).u32(sender).u32(len(recipients))
    for recipient in sorted(recipients):
        signed.u32(recipient)
    writer.blob(sign(signer, signed.blob(b"".join(digests)).getvalue()))
    return writer.getvalue()


# ---------------------------------------------------------------- CHECK


def share_check(
    info: RoundInfo, session: bytes, sender: int, accused: list[int], signer: ec.EllipticCurvePrivateKey
) -> bytes:
    """A signed ShareCheck naming `accused` as the senders whose shares failed."""
    ids = Writer().u32(len(accused))
    for party in sorted(accused):
        ids.u32(party)
    signed = Writer().text(DOMAIN + "share-check").blob(session).u32(sender).getvalue() + ids.getvalue()
    writer = header(Writer().blob(MAGIC).u8(SHARE_CHECK), info.federation_id, info.session_round, STAGE_CHECK, session)
    return (
        writer.getvalue()
        + Writer().u32(sender).getvalue()
        + ids.getvalue()
        + Writer().blob(sign(signer, signed)).getvalue()
    )
