"""Model-sized arrays into .npz files a slice at a time: what the collaborator's records write, never copied whole.

``np.savez`` hands a zip member each array in copies of up to 16 MiB, and an array that is not in memory (a
model kept in a record's file, an average still to be formed) would have to be made whole first. Here a 1-D
array is written as views of its own memory, and anything that yields its values in slices as those slices.
The files are what ``np.savez`` writes (uncompressed members), so ``np.load`` reads them as before. A member a
record rewrites unchanged (:class:`Member`) is copied from the file it replaces as its bytes stand: neither read back
as values nor checksummed again.
"""

from __future__ import annotations

import struct
import threading
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

SLICE_BYTES = 1 << 20
"""Bytes of an in-memory array handed to the file per write: a view, so what it costs is the call."""

HEADERS = threading.RLock()
"""Held while numpy parses .npy headers (:func:`read_header`, ``np.load``'s members). numpy reads a header with
``ast.literal_eval``, and CPython 3.11 shares the AST constructor's recursion count between threads (gh-106905):
sites running as threads of one process that parse at once fail with ``SystemError: AST constructor recursion
depth mismatch``. Seen at the end of a threads-mode federation, three sites reading their records together."""


class Sliced(Protocol):
    """Values that are not held whole: how many, their type, and the values a slice at a time."""

    @property
    def dtype(self) -> np.dtype[Any]:
        """The values' type."""
        ...

    @property
    def size(self) -> int:
        """How many values."""
        ...

    def slices(self) -> Iterator[np.ndarray]:
        """The values, a slice at a time, from the first."""
        ...


@dataclass(frozen=True)
class Member:
    """The array an archive at `path` holds as `name`, to be written into another as it stands (:func:`write_archive`).

    What a record rewrites unchanged: its model of the last save, which was read back a slice at a time and
    checksummed twice (the zip's CRC-32 checked as read, then formed again as written) at each save, about 12 MB
    of each kind at d = 10^6 where a site's whole round costs about 0.1 CPU-s.
    """

    path: Path
    name: str


def write_archive(stream: IO[bytes], arrays: Mapping[str, np.ndarray | Sliced | Member]) -> None:
    """Write `arrays` into `stream` as ``np.savez`` would: 1-D arrays and sliced values without a whole copy.

    A :class:`Member` is copied byte for byte from its archive (which must be another file than `stream`'s), with
    the CRC-32 and sizes that archive states for it.

    Raises:
        ValueError: a member to copy is not a plain stored (uncompressed, unencrypted) one, or is cut short.
    """
    with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as archive, ExitStack() as sources:
        opened: dict[Path, IO[bytes]] = {}
        for name, values in arrays.items():
            if isinstance(values, Member):
                if values.path not in opened:
                    opened[values.path] = sources.enter_context(open(values.path, "rb"))
                _copy_member(archive, opened[values.path], f"{values.name}.npy", f"{name}.npy")
                continue
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                if isinstance(values, np.ndarray) and (values.ndim != 1 or not values.flags.c_contiguous):
                    np.lib.format.write_array(member, values, allow_pickle=False)  # a scalar, or a small table
                    continue
                header = {"descr": np.lib.format.dtype_to_descr(values.dtype), "fortran_order": False}
                np.lib.format.write_array_header_1_0(member, {**header, "shape": (values.size,)})
                for piece in _pieces(values):
                    member.write(piece.data)


def read_header(stream: IO[bytes]) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """(shape, dtype) of the .npy member `stream` opens, leaving it at the first value; ValueError otherwise."""
    version = np.lib.format.read_magic(stream)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    with HEADERS:
        shape, fortran_order, dtype = read(stream)
    if fortran_order or dtype.hasobject:
        raise ValueError("an array in the record is not a plain one")
    return shape, dtype


_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
"""A zip member's local header before its name and extra field (APPNOTE 4.3.7): signature, versions, flags,
method, time, date, CRC-32, sizes, then the name's and the extra field's lengths."""
_LOCAL_SIGNATURE = 0x04034B50
_COPIED = 1 << 20
"""Bytes copied at a time from a member's archive into the new one."""


def _copy_member(archive: zipfile.ZipFile, source: IO[bytes], member: str, name: str) -> None:
    """Member `member` of the zip file `source` appended to `archive` as `name`: its bytes, CRC-32 and sizes as they are.

    What ``ZipFile.open(name, "w")`` and the handle's close do for a member, but for values written already:
    zipfile has no call that writes a member without forming its CRC-32 again, so this keeps its bookkeeping
    (the member's header, the central directory's entry, where the next member goes) itself.
    """
    with zipfile.ZipFile(source) as reader:
        info = reader.getinfo(member)
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        raise ValueError(f"{member} is not a plain stored member; it cannot be copied as it stands")
    source.seek(info.header_offset)
    fields = _LOCAL_HEADER.unpack(source.read(_LOCAL_HEADER.size))
    if fields[0] != _LOCAL_SIGNATURE:
        raise ValueError(f"{member} has no local header where the archive's directory says")
    source.seek(info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1])
    copied = zipfile.ZipInfo(name, info.date_time)
    copied.compress_type, copied.external_attr = zipfile.ZIP_STORED, info.external_attr
    copied.CRC, copied.file_size, copied.compress_size = info.CRC, info.file_size, info.compress_size
    target = archive.fp
    assert target is not None  # open for writing
    target.seek(archive.start_dir)
    copied.header_offset = target.tell()
    target.write(copied.FileHeader(zip64=True))
    left = info.compress_size
    while left:
        data = source.read(min(left, _COPIED))
        if not data:
            raise ValueError(f"{member} is cut short: {left} of its {info.compress_size} bytes are missing")
        target.write(data)
        left -= len(data)
    archive.start_dir = target.tell()
    archive.filelist.append(copied)
    archive.NameToInfo[name] = copied
    # zipfile writes the central directory at close only for an archive it marked modified.
    archive._didModify = True  # type: ignore[attr-defined]


def _pieces(values: np.ndarray | Sliced) -> Iterator[np.ndarray]:
    if not isinstance(values, np.ndarray):
        return values.slices()
    step = max(1, SLICE_BYTES // max(1, values.itemsize))
    return (values[start : start + step] for start in range(0, values.size, step))
