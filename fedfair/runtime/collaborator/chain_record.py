"""The model chain's anchor, kept beside the config so that it outlives the process: ``NAME.FEDERATION.chain.npz``.

A site checks each model it is sent against the server states it computed itself from the sums it verified
(:mod:`fedfair.runtime.collaborator.chain`). Held in memory only, a restart would leave it with nothing to check
the next model against. So once it verified a training round's sum, and before its verdict leaves, it keeps the
:class:`Anchor`: the state whose model round r was sent, and the state the plan's server step makes of round r's
verified sum (or why it makes none). A restarted process takes the chain up from it. Each state is written once,
in a file of its own, and the anchor file, replaced atomically, names them (:class:`AnchorRecord`); a large state
(:mod:`fedfair.runtime.state_files`) is never held whole; an average still theta's copy is written as theta only.

Why: docs/security.md, "Verified aggregation".
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import torch

from fedfair.core.files import atomic_write
from fedfair.core.server import ServerState
from fedfair.runtime.collaborator.archives import HEADERS, Sliced, read_header, write_archive
from fedfair.runtime.state_files import InFile, InMemory, HeldState, held_in_file

CHAIN_SUFFIX = "chain.npz"
"""The anchor is kept as NAME.FEDERATION.chain.npz beside the config."""

FORMAT = "fedfair-chain"
VERSION = 3
VERSIONS = (1, 2, 3)
"""Version 3 keeps each state in a file of its own, written once (:class:`AnchorRecord`); 1 and 2 (still read) held
both states in the anchor file, rewritten each round. Since 2 a state that averages nothing yet (``averaged_rounds``
0) leaves out its theta_average, theta's copy (:func:`fedfair.core.server.server_apply`)."""

STATE_SUFFIX = ".state"
"""A state's file is NAME.FEDERATION.chain.TOKEN.state, beside the anchor."""

_SCALARS = ("round", "c", "c_average", "averaged_rounds")
"""A state's scalars (:class:`~fedfair.runtime.state_files.HeldState`), kept as one-value arrays."""

_WITH_C = frozenset({"control", "velocity"})
"""The tensors of d + 1 values (theta's coordinates, then c's)."""

_READ = 1 << 18
"""Values read from the file at a time into a state kept in a file (2 MiB of float64)."""


@dataclass(frozen=True)
class Anchor:
    """What a site verified last: round `round`'s state, and, once it verified that round's sum, what it makes.

    `next` is the plan's server step applied to the verified sum; None when the site did not verify the sum
    (`verified` False) or when the sum makes no step, `void` then saying why (the round is void).
    """

    round: int
    state: HeldState
    verified: bool = False
    next: HeldState | None = None
    void: str = ""


class AnchorRecord:
    """The anchor kept at `path` (NAME.FEDERATION.chain.npz) and the state files it names beside it.

    Each state is written once, into a file of its own (``NAME.FEDERATION.chain.TOKEN.state``: its tensors'
    float64 values back to back), when an anchor first holds it; the anchor file itself is a few hundred bytes
    naming them. Round r's state is round r - 1's step, written when round r - 1's sum was verified, so a round
    writes and syncs one state where it wrote two.

    Why a crash loses nothing a restart needs: a state file is never changed once written (a state is never
    stepped in place, :func:`fedfair.runtime.state_files.stepped` with ``give_up=False``). A new one is synced,
    and so is its name (the folder), before the anchor naming it replaces the old anchor (atomically:
    temporary file, fsync, rename, fsync of the folder), and a state file is removed only after an anchor that
    no longer names it is in place. So at every instant the anchor on disk is the old one or the new one, and
    every file it names is whole on disk; a file no anchor names (a crash before the rename, or before the
    removal) is removed by the next write.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._kept: list[tuple[HeldState, str]] = []
        """The states the anchor on disk holds, each with the name of its file (the same objects as held)."""

    def read(self, folder: Path | None) -> Anchor:
        """The anchor kept at :attr:`path`; a large state is read into a file in `folder` a span at a time.

        Raises:
            ValueError: the file is not an anchor of a version this reads, or a state of it is not whole.
            OSError: it cannot be read.
        """
        anchor, files = _read(self.path, folder)
        self._kept = [(state, file) for state, file in zip((anchor.state, anchor.next), files) if state and file]
        return anchor

    def write(self, anchor: Anchor) -> None:
        """Keep `anchor`, each of its states not yet on disk written once (OSError, naming the path: a full disk).

        On an error the anchor kept before stays, whole.
        """
        folder, written = self.path.parent, []
        names: dict[str, str] = {}
        try:
            for prefix, state in (("state", anchor.state), ("next", anchor.next)):
                if state is None:
                    continue
                name = next((file for kept, file in self._kept if kept is state), None)
                if name is None:
                    name = _write_state(self.path, state)
                    written.append(name)
                names[prefix] = name
            if written:
                # The new files' names reach the disk before an anchor that names them can.
                _sync_folder(folder)
            atomic_write(self.path, lambda stream: write_archive(stream, _manifest(anchor, names)))
        except BaseException:
            for name in written:
                (folder / name).unlink(missing_ok=True)
            raise
        self._kept = [
            (state, names[prefix]) for prefix, state in (("state", anchor.state), ("next", anchor.next)) if state
        ]
        for stale in folder.glob(f"{_stem(self.path)}.*{STATE_SUFFIX}"):
            if stale.name not in names.values():
                stale.unlink(missing_ok=True)


def read_anchor(path: Path, folder: Path | None) -> Anchor:
    """The anchor kept at `path` (:meth:`AnchorRecord.read`)."""
    return AnchorRecord(path).read(folder)


_AVERAGE = "theta_average"


def _average_is_theta(averaged_rounds: int) -> bool:
    """Whether a state of `averaged_rounds` averages nothing yet, so that its theta_average is theta's copy."""
    return averaged_rounds == 0


def _stem(path: Path) -> str:
    """The anchor's name without ``.npz``: its state files' names begin with it."""
    return path.name.removesuffix(".npz")


def _stored(state: HeldState) -> list[str]:
    """The tensors of `state` its file holds, in order: all but an average that is theta's copy."""
    return [field for field in state.fields if not (field == _AVERAGE and _average_is_theta(state.averaged_rounds))]


def _write_state(anchor_path: Path, state: HeldState) -> str:
    """Write `state`'s tensors (:func:`_stored`) into a new file beside the anchor and sync it; its name."""
    handle, name = tempfile.mkstemp(prefix=f"{_stem(anchor_path)}.", suffix=STATE_SUFFIX, dir=anchor_path.parent)
    try:
        offset = 0
        for field in _stored(state):
            offset += state.copy_field(field, handle, offset)
        os.fsync(handle)
    except BaseException as error:
        os.unlink(name)
        if isinstance(error, OSError):
            # Whoever reads the error must learn which disk filled (or failed), not only that one did.
            raise OSError(error.errno, error.strerror, str(anchor_path)) from error
        raise
    finally:
        os.close(handle)
    return os.path.basename(name)


def _sync_folder(folder: Path) -> None:
    """Bring the names in `folder` to the disk (a new file's name is not synced with its contents)."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _manifest(anchor: Anchor, files: dict[str, str]) -> dict[str, np.ndarray | Sliced]:
    """The anchor file's members: its format and version, and (:data:`_SUMMARY`) all else in one.

    Its round and verdict, and per state its scalars, tensors and file: one JSON member where a member a value
    (versions 1 and 2) cost about 5 ms a write at 21 of them, a tenth of a site's step at d = 10^6.
    """
    summary: dict[str, object] = {"round": anchor.round, "verified": anchor.verified, "void": anchor.void}
    for prefix, state in (("state", anchor.state), ("next", anchor.next)):
        if state is None:
            continue
        summary[f"{prefix}.fields"] = list(state.fields)
        summary[f"{prefix}.stored"] = _stored(state)
        summary[f"{prefix}.dimension"] = state.dimension
        summary[f"{prefix}.file"] = files[prefix]
        for name in _SCALARS:
            summary[f"{prefix}.{name}"] = getattr(state, name)
    return {
        "format": np.array(FORMAT),
        "version": np.array(VERSION, dtype=np.int64),
        _SUMMARY: np.array(json.dumps(summary)),
    }


_SUMMARY = "anchor"
"""Version 3's member holding every value but the format and version, as JSON (floats kept exactly: repr)."""


Values = Callable[[str, int, bool], Iterator[np.ndarray]]
"""A kept state's tensor `field` (of `length` values): at once (`whole`) or :data:`_READ` values at a time."""


def _read(path: Path, folder: Path | None) -> tuple[Anchor, tuple[str | None, str | None]]:
    """The anchor kept at `path`, and the names of its states' files (None: version 1 or 2, held in it)."""
    try:
        with HEADERS, np.load(path, allow_pickle=False) as arrays:
            if str(arrays["format"]) != FORMAT or int(arrays["version"]) not in VERSIONS:
                raise ValueError(f"not a {FORMAT} file of version {' or '.join(map(str, VERSIONS))}")
            scalars = {name: arrays[name] for name in arrays.files if not _is_tensor(name)}
        if _SUMMARY in scalars:
            scalars = {name: np.array(value) for name, value in json.loads(str(scalars[_SUMMARY])).items()}
        round_number, verified, void = int(scalars["round"]), bool(scalars["verified"]), str(scalars["void"])
        kept = [
            _kept(path, scalars, prefix, folder) if f"{prefix}.fields" in scalars else (None, None)
            for prefix in ("state", "next")
        ]
    except (KeyError, zipfile.BadZipFile, json.JSONDecodeError) as error:
        raise ValueError(f"an anchor without {error}") from None
    (state, state_file), (after, after_file) = kept
    if state is None or round_number < 1 or (after is not None and not verified):
        raise ValueError(f"an anchor of round {round_number} that is not one a site writes")
    return Anchor(round_number, state, verified, after, void), (state_file, after_file)


def _is_tensor(name: str) -> bool:
    prefix, _, field = name.partition(".")
    return prefix in ("state", "next") and field not in (*_SCALARS, "fields")


def _kept(path: Path, scalars: dict[str, np.ndarray], prefix: str, folder: Path | None) -> tuple[HeldState, str | None]:
    """The state kept under `prefix` (in its own file, or as members of the anchor's), and its file's name."""
    fields = [str(field) for field in scalars[f"{prefix}.fields"].tolist()]
    if "theta" not in fields or "theta_average" not in fields:
        raise ValueError(f"its {prefix} holds no theta")
    averages = _average_is_theta(int(scalars[f"{prefix}.averaged_rounds"]))
    if f"{prefix}.file" not in scalars:
        with zipfile.ZipFile(path) as archive:
            with archive.open(f"{prefix}.theta.npy") as stream:
                shape, _ = read_header(stream)
            members = {field: f"{prefix}.{field}" for field in fields}
            # Written once where it is theta's copy (:func:`_average_is_theta`), read as theta's.
            if averages and f"{prefix}.{_AVERAGE}.npy" not in archive.namelist():
                members[_AVERAGE] = f"{prefix}.theta"

            def member(field: str, length: int, whole: bool) -> Iterator[np.ndarray]:
                with archive.open(f"{members[field]}.npy") as stream:
                    shape, dtype = read_header(stream)
                    if shape != (length,) or dtype != np.float64:
                        raise ValueError(
                            f"its {members[field]} is a {dtype} array of shape {shape}, not {length} float64 values"
                        )
                    yield from _values(stream, members[field], length, whole)

            return _state(scalars, prefix, fields, shape[0] if len(shape) == 1 else 0, member, folder), None
    name = str(scalars[f"{prefix}.file"])
    stored = [str(field) for field in scalars[f"{prefix}.stored"].tolist()]
    dimension = int(scalars[f"{prefix}.dimension"])
    offsets, at = {}, 0
    for field in stored:
        offsets[field] = at
        at += 8 * (dimension + (field in _WITH_C))
    if set(fields) - set(stored) - ({_AVERAGE} if averages else set()):
        raise ValueError(f"its {prefix} file holds no {', '.join(sorted(set(fields) - set(stored)))}")
    offsets.setdefault(_AVERAGE, offsets.get("theta", 0))
    with open(path.parent / name, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        if size != at:
            raise ValueError(f"its {prefix} file {name} holds {size} bytes, not the {at} of its tensors")

        def tensor(field: str, length: int, whole: bool) -> Iterator[np.ndarray]:
            stream.seek(offsets[field])
            yield from _values(stream, f"{prefix}.{field}", length, whole)

        return _state(scalars, prefix, fields, dimension, tensor, folder), name


def _state(
    scalars: dict[str, np.ndarray], prefix: str, fields: list[str], dimension: int, values: Values, folder: Path | None
) -> HeldState:
    """The state of `fields` kept under `prefix`: whole in memory, or (a large one) into a file in `folder` by span."""
    if dimension < 1:
        raise ValueError(f"its {prefix} theta is not a model's")
    in_file = held_in_file(dimension, len(fields))
    tensors: dict[str, torch.Tensor] = {}
    for field in fields:
        # A state kept in a file is laid out by its tensors' presence alone: an empty one stands for each.
        whole = [] if in_file else list(values(field, dimension + (field in _WITH_C), True))
        tensors[field] = torch.from_numpy(whole[0] if whole else np.empty(0))
    state = ServerState(
        round=int(scalars[f"{prefix}.round"]),
        theta=tensors["theta"],
        c=float(scalars[f"{prefix}.c"]),
        theta_average=tensors["theta_average"],
        c_average=float(scalars[f"{prefix}.c_average"]),
        averaged_rounds=int(scalars[f"{prefix}.averaged_rounds"]),
        control=tensors.get("control"),
        velocity=tensors.get("velocity"),
        second_moment=tensors.get("second_moment"),
    )
    if not in_file:
        return InMemory(state)
    kept = InFile(dimension, state, folder)
    for field in fields:
        at = 0
        for piece in values(field, dimension + (field in _WITH_C), False):
            kept.put(field, at, piece)
            at += piece.size
    return kept


def _values(stream: IO[bytes], name: str, length: int, whole: bool) -> Iterator[np.ndarray]:
    """`length` float64 values read from `stream`: at once (`whole`) or :data:`_READ` at a time."""
    step = length if whole else _READ
    for start in range(0, length, step):
        count = min(step, length - start)
        data = stream.read(count * 8)
        if len(data) != count * 8:
            raise ValueError(f"its {name} is cut short")
        yield np.frombuffer(data, dtype=np.float64).copy()
