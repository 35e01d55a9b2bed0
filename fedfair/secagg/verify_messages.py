"""The messages of the VERIFY stage (protocol v3): the aggregate the server claims, and the survivors' signed tags.

The server shows every survivor the sum it will apply (:class:`AggregateClaim`); each survivor answers
with its masked tags of its own input (:class:`AggregateTag`), and the server relays them all
(:class:`TagSet`). What the tags are and why they check the sum is :mod:`fedfair.secagg.verify`. Like
every message they carry a :class:`~fedfair.secagg.wire.Header` and the canonical encoding of
:mod:`fedfair.secagg.wire`; :func:`fedfair.secagg.messages.decode` parses them with the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from fedfair.core.errors import ProtocolError
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.verify import TAG_BYTES
from fedfair.secagg.wire import (
    SIGNATURE_LIMIT,
    Header,
    Stage,
    Wire,
    read_messages,
    read_vector,
    write_messages,
    write_vector,
)


@dataclass(frozen=True, eq=False)
class AggregateClaim(Wire):
    """What the server shows every survivor in the VERIFY stage: the unmasked sum it will apply (d + 1 words).

    The claim commits the server: each survivor's challenge is derived from its digest
    (:func:`fedfair.secagg.verify.aggregate_digest`), and every tag is signed over that digest.

    Where the round re-sums (:attr:`~fedfair.secagg.config.SecAggConfig.resummed`) it also carries what the
    server unmasked the sum from, for each survivor to do the same (:func:`fedfair.secagg.resum.check_resummed`):
    inputs, every survivor's masked input in the survivors' order; seeds, (survivor, its rebuilt self-mask seed);
    mask_keys, (dropped party, its rebuilt mask key) for each party of the masking set that a survivor masked
    with but that sent no input; signatures, the survivors' (party, consistency signature) on the view, as the
    unmask request carried them, so each survivor sees that t survivors signed the view it re-sums (a survivor's
    tag may then be missing, :func:`fedfair.secagg.resum.resum_decides`).

    Where the round is re-checked instead (:attr:`~fedfair.secagg.config.SecAggConfig.rechecked`, above
    RESUMMED_WORDS) each survivor is sent a claim of its own: carries, the 16-bit carries K of the sum
    (:func:`fedfair.secagg.recheck.carried_sum`), the same for every survivor; inputs, the masked inputs of the
    survivors it re-checks (:func:`fedfair.secagg.recheck.checked_peers`, in that order); seeds, mask_keys and
    signatures as above. All five are empty otherwise.
    """

    TYPE: ClassVar[int] = 12
    STAGE: ClassVar[Stage] = Stage.VERIFY

    header: Header
    vector: np.ndarray
    inputs: tuple[np.ndarray, ...] = ()
    seeds: tuple[tuple[int, bytes], ...] = ()
    mask_keys: tuple[tuple[int, bytes], ...] = ()
    signatures: tuple[tuple[int, bytes], ...] = ()
    carries: np.ndarray | None = None

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        write_vector(writer, self.vector)
        _write_material(writer, self)
        write_vector(writer, np.zeros(0, dtype=np.uint16) if self.carries is None else self.carries)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> AggregateClaim:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        vector, material = read_vector(reader), _read_material(reader)
        carries = read_vector(reader)
        return cls(header, vector, *material, carries=carries if carries.size else None)


class ResumMaterial(Protocol):
    """What a survivor re-sums a claimed sum from: the four fields a re-summed claim, or a fallback tag set, carries."""

    @property
    def inputs(self) -> tuple[np.ndarray, ...]:
        """Every survivor's masked input, in the survivors' order."""
        ...

    @property
    def seeds(self) -> tuple[tuple[int, bytes], ...]:
        """(survivor, its rebuilt self-mask seed)."""
        ...

    @property
    def mask_keys(self) -> tuple[tuple[int, bytes], ...]:
        """(dropped party, its rebuilt mask key), for each one a survivor masked with."""
        ...

    @property
    def signatures(self) -> tuple[tuple[int, bytes], ...]:
        """(survivor, its consistency signature on the view), as the unmask request carried them."""
        ...


Material = tuple[
    tuple[np.ndarray, ...], tuple[tuple[int, bytes], ...], tuple[tuple[int, bytes], ...], tuple[tuple[int, bytes], ...]
]
"""A :class:`ResumMaterial`'s fields in their order: inputs, seeds, mask_keys, signatures."""


def _tag_field(reader: Reader, what: str) -> bytes:
    """The next blob, which must be a tags field (TAG_BYTES: CHECKS 256-bit integers); ProtocolError naming ``what``."""
    try:
        return reader.fixed(TAG_BYTES)
    except ProtocolError as error:
        raise ProtocolError(f"{error} ({what})") from None


def _write_material(writer: Writer, material: ResumMaterial) -> None:
    """Append the re-sum material: the inputs, then the seeds, the mask keys and the signatures as (party, bytes)."""
    writer.u32(len(material.inputs))
    for vector in material.inputs:
        write_vector(writer, vector)
    for pairs in (material.seeds, material.mask_keys, material.signatures):
        writer.pairs(pairs)


def _read_material(reader: Reader) -> Material:
    """The re-sum material :func:`_write_material` wrote; ProtocolError on malformed bytes."""
    inputs = tuple(read_vector(reader) for _ in range(reader.u32()))
    seeds = reader.pairs(SECRET_LIMIT)
    mask_keys = reader.pairs(SECRET_LIMIT)
    return inputs, seeds, mask_keys, reader.pairs(SIGNATURE_LIMIT)


@dataclass(frozen=True)
class AggregateTag(Wire):
    """A survivor's masked tags of its own input under the claim's challenge, signed over the claim's digest.

    tags: :data:`fedfair.secagg.verify.TAG_BYTES` bytes, the :data:`fedfair.secagg.verify.CHECKS` masked tags
    (each a 256-bit integer, big-endian); signature: the sender's identity signature over
    :func:`fedfair.secagg.verify.tag_payload`; values: where the round is re-checked, (peer, the CHECKS values
    <r^c, z_peer> encoded as tags are) for each survivor the sender re-checks, in order
    (:func:`fedfair.secagg.recheck.peer_values`), covered by the signature too; empty otherwise.
    """

    TYPE: ClassVar[int] = 13
    STAGE: ClassVar[Stage] = Stage.VERIFY

    header: Header
    sender: int
    tags: bytes
    signature: bytes
    values: tuple[tuple[int, bytes], ...] = ()

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.u32(self.sender).blob(self.tags).blob(self.signature).pairs(self.values)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> AggregateTag:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes.

        The one place a tag's lengths are checked: its tags field and every reported value are exactly
        :data:`~fedfair.secagg.verify.TAG_BYTES` long, so no reader of a parsed tag meets a field it cannot decode.
        A field of another length is refused naming the sender the tag claims (it may be signed by it: a site
        alone can send one).
        """
        sender = reader.u32()
        tags = _tag_field(reader, f"party {sender}'s tags field")
        signature = reader.blob(SIGNATURE_LIMIT)
        values = []
        for _ in range(reader.u32()):
            peer = reader.u32()
            values.append((peer, _tag_field(reader, f"party {sender}'s re-checked value of party {peer}")))
        return cls(header, sender, tags, signature, tuple(values))


@dataclass(frozen=True, eq=False)
class TagSet(Wire):
    """Every survivor's tag that arrived, as the server relays them to every survivor (in increasing order).

    Where a survivor's tag is missing in a round whose claim carried no re-sum material (above
    :data:`~fedfair.secagg.config.RESUMMED_WORDS`, on the complete graph), the tag set carries it instead, for that
    round only: inputs, seeds, mask_keys and signatures as :class:`AggregateClaim` has them. Each survivor then
    re-sums the sum it tagged (:func:`fedfair.secagg.resum.resum_decides`). All four are empty otherwise.
    """

    TYPE: ClassVar[int] = 14
    STAGE: ClassVar[Stage] = Stage.VERIFY

    header: Header
    tags: tuple[AggregateTag, ...]
    inputs: tuple[np.ndarray, ...] = ()
    seeds: tuple[tuple[int, bytes], ...] = ()
    mask_keys: tuple[tuple[int, bytes], ...] = ()
    signatures: tuple[tuple[int, bytes], ...] = ()

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        write_messages(writer, self.tags)
        _write_material(writer, self)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> TagSet:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, read_messages(reader, AggregateTag.read), *_read_material(reader))


SECRET_LIMIT = 64
"""The longest rebuilt secret a claim carries (a seed or a raw X25519 key: 32 bytes)."""
