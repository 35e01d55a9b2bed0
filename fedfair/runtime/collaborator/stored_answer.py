"""One answer's bits stored on disk: written before anything of them is sent, read back whole or a piece at a time.

The record (:mod:`fedfair.runtime.collaborator.input_record`) names each file's digest; a file whose bytes
differ from it is not these bits. The words of a secure answer are read back a piece at a time to tag them in a
verified round, so that no copy of them is held in memory beside the claimed sum.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedfair.core.errors import Refusal, RefusedError
from fedfair.core.files import atomic_write
from fedfair.runtime.collaborator.archives import HEADERS, read_header, write_archive

_HASHED_BYTES = 1 << 20
"""Bytes of a kept file hashed per read while its words are checked against the record."""


@dataclass(frozen=True)
class StoredAnswer:
    """The bits of one answer, kept so that the same request gets exactly them again.

    vector: as sent without secure aggregation (the model's float type), None for no contribution or for a
    secure one encoded from its pieces (its words alone are sent); weight: its weight; encoded: under secure
    aggregation, the fixed-point words before masking (noise included, if any).
    """

    vector: np.ndarray | None
    weight: float
    encoded: np.ndarray | None = None


def write_answer(path: Path, kept: StoredAnswer) -> str:
    """Write `kept` to `path` atomically, straight from its arrays (views: no copy of the input is made).

    Returns the file's SHA-256 (hex), as read back: what the record names.
    """
    arrays: dict[str, np.ndarray] = {"weight": np.array(kept.weight, dtype=np.float64)}
    if kept.vector is not None:
        arrays["vector"] = np.asarray(kept.vector)
    if kept.encoded is not None:
        arrays["encoded"] = np.asarray(kept.encoded)
    atomic_write(path, lambda stream: write_archive(stream, arrays))
    with path.open("rb") as written:
        return hashlib.file_digest(written, "sha256").hexdigest()


def read_answer(path: Path, digest: str) -> StoredAnswer | None:
    """The bits kept in `path`, or None if it is lost or its bytes are not those of SHA-256 `digest`."""
    try:
        payload = path.read_bytes()
    except OSError:
        return None
    if hashlib.sha256(payload).hexdigest() != digest:
        return None  # a kill between the payload and the record, or a changed file: not these bits
    with HEADERS, np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
        vector = arrays["vector"] if "vector" in arrays else None
        encoded = arrays["encoded"] if "encoded" in arrays else None
        weight = float(arrays["weight"])
    for array in (vector, encoded):
        if array is not None:
            array.setflags(write=False)
    return StoredAnswer(vector, weight, encoded)


def answer_words(path: Path, digest: str, span: int) -> Iterator[np.ndarray]:
    """The encoded words kept in `path`, `span` at a time, once its bytes are checked against SHA-256 `digest`.

    One open file, hashed whole first, then read: a file replaced meanwhile is not read.

    Raises:
        RefusedError: reason :attr:`Refusal.WITHDRAWN`, the file lost, changed, or holding no words.
    """
    lost = RefusedError(Refusal.WITHDRAWN, f"the kept words in {path} changed or were lost; they cannot be tagged")
    try:
        with path.open("rb") as stream:
            hashed = hashlib.sha256()
            while chunk := stream.read(_HASHED_BYTES):
                hashed.update(chunk)
            if hashed.hexdigest() != digest:
                raise lost
            stream.seek(0)
            with zipfile.ZipFile(stream) as archive, archive.open("encoded.npy") as member:
                (size,), dtype = read_header(member)
                for start in range(0, size, span):
                    wanted = min(span, size - start) * dtype.itemsize
                    data = member.read(wanted)
                    if len(data) != wanted:
                        raise lost
                    yield np.frombuffer(data, dtype=dtype)  # read-only, over the bytes read: no copy
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        raise lost from None
