"""How the fuzzer mutates a message, from the wire schema alone: bytes flipped, cut, extended, replaced, fields set.

Byte-level mutations (:data:`BYTE_MUTATIONS`: bit flips, truncation, extension, random bytes, random protobuf wire
data) and a field-level one (:func:`field_mutation`: two scalar fields swapped, or one set to an extreme value), for
:class:`~attacks.fuzz.Campaign`. Like the rest of the hostile side, it imports the standard library only.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

EXTREME_INTEGERS = (0, 1, 2, 255, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1)


# ---------------------------------------------------------------- byte-level mutations


def bit_flips(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return bytes([rng.randrange(256)])
    mutated = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        position = rng.randrange(len(mutated) * 8)
        mutated[position // 8] ^= 1 << (position % 8)
    return bytes(mutated)


def truncation(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data))] if data else data


def extension(rng: random.Random, data: bytes) -> bytes:
    return data + rng.randbytes(rng.randint(1, 64))


def random_bytes(rng: random.Random, data: bytes) -> bytes:
    return rng.randbytes(rng.choice((0, 1, 7, 64, 512, 4096)))


def random_wire(rng: random.Random, data: bytes) -> bytes:
    """Random protobuf wire data: random field numbers and wire types (a few invalid ones), random values."""
    out = bytearray()
    for _ in range(rng.randint(1, 12)):
        field_number = rng.choice((1, 2, 3, 4, 5, rng.randint(6, 2**29 - 1)))
        wire_type = rng.choice((0, 0, 1, 2, 2, 5, 3, 4, 6, 7))
        out += _varint((field_number << 3) | wire_type)
        if wire_type == 0:
            out += _varint(rng.choice((*EXTREME_INTEGERS, rng.getrandbits(64))))
        elif wire_type == 1:
            out += rng.randbytes(8)
        elif wire_type == 5:
            out += rng.randbytes(4)
        elif wire_type == 2:
            body = rng.randbytes(rng.randint(0, 40)) if rng.random() < 0.7 else data
            declared = len(body) if rng.random() < 0.8 else rng.choice((len(body) + 100, 2**31, 2**63))
            out += _varint(declared) + body
    return bytes(out)


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


BYTE_MUTATIONS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "bit_flip": bit_flips,
    "truncate": truncation,
    "extend": extension,
    "random_bytes": random_bytes,
    "random_protobuf": random_wire,
}


# ---------------------------------------------------------------- field-level mutations


def _scalar_fields(message: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths (message, field descriptor) to every scalar field, set or not, nested messages included."""
    found: list[tuple[Any, ...]] = []
    for descriptor in message.DESCRIPTOR.fields:
        if descriptor.message_type is not None:
            found += _scalar_fields(getattr(message, descriptor.name), (*prefix, descriptor.name))
        else:
            found.append((*prefix, descriptor.name, message, descriptor))
    return found


def _extreme(rng: random.Random, descriptor: Any, current: Any) -> Any:
    kind = descriptor.cpp_type
    if kind in (descriptor.CPPTYPE_UINT32, descriptor.CPPTYPE_UINT64):
        limit = 2**32 - 1 if kind == descriptor.CPPTYPE_UINT32 else 2**64 - 1
        return min(limit, rng.choice((*EXTREME_INTEGERS, int(current) + 1, max(int(current) - 1, 0))))
    if kind == descriptor.CPPTYPE_ENUM:
        return rng.choice((0, 1, 2, 7, 8, 15, 16, 99, 2**31 - 1, -1))
    if kind == descriptor.CPPTYPE_DOUBLE:
        return rng.choice((float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 5e-324))
    if kind == descriptor.CPPTYPE_STRING and descriptor.type == descriptor.TYPE_STRING:
        return rng.choice(("", "x" * 70_000, "fedfair-launch\x00", "../../etc/passwd", "ффф" * 10, "%s%n"))
    if kind == descriptor.CPPTYPE_STRING:
        return rng.choice((b"", rng.randbytes(rng.randint(1, 3000)), bytes(2_000_000)))
    return current


def field_mutation(rng: random.Random, message: Any) -> Any:
    """Swap two scalar fields of compatible kinds, or set one to an extreme value (possibly several times)."""
    mutated = type(message)()
    mutated.CopyFrom(message)
    for _ in range(rng.randint(1, 3)):
        fields = _scalar_fields(mutated)
        first = rng.choice(fields)
        holder, descriptor = first[-2], first[-1]
        partners = [
            other for other in fields if other[-1].cpp_type == descriptor.cpp_type and other[-1] is not descriptor
        ]
        try:
            if partners and rng.random() < 0.5:
                other = rng.choice(partners)
                a, b = getattr(holder, descriptor.name), getattr(other[-2], other[-1].name)
                setattr(holder, descriptor.name, b)
                setattr(other[-2], other[-1].name, a)
            else:
                setattr(holder, descriptor.name, _extreme(rng, descriptor, getattr(holder, descriptor.name)))
        except (ValueError, TypeError):
            continue  # a value the field cannot hold in this runtime (e.g. -1 for an open enum): skip it
    return mutated
