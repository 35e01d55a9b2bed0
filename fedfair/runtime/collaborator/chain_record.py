"""The model chain's anchor, kept beside the config so that it outlives the process: ``NAME.FEDERATION.chain.npz``.

A site checks each model it is sent against the server states it computed from the sums it verified
(:mod:`fedfair.runtime.collaborator.chain`); held in memory only, a restart would leave it nothing to check the
next model against. So once it verified a training round's sum, and before its verdict leaves, it keeps the
:class:`Anchor`: the state whose model round r was sent and the one the plan's server step makes of round r's
verified sum (or why it makes none), as a state written whole every :data:`WHOLE_EVERY` rounds plus the verified
sums logged since (:class:`LoggedSum`, d + 1 words each, a file each), which a restart steps it by again. The anchor
file, replaced atomically, names them (:class:`AnchorRecord`); a large state (:mod:`fedfair.runtime.state_files`) is
never held whole; an average still theta's copy is written as theta only.

Why: docs/security.md, "Verified aggregation".
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from fedfair.core.files import atomic_write
from fedfair.core.server import ServerState
from fedfair.runtime.collaborator.archives import HEADERS, Sliced, read_header, write_archive
from fedfair.runtime.state_files import InFile, InMemory, HeldState, held_in_file
from fedfair.secagg import EncodingConfig

CHAIN_SUFFIX = "chain.npz"
"""The anchor is kept as NAME.FEDERATION.chain.npz beside the config."""

FORMAT = "fedfair-chain"
VERSION = 4
VERSIONS = (1, 2, 3, 4)
"""Version 4 keeps a state as a state written whole and the sums logged since (:class:`AnchorRecord`); 3 (still
read) wrote each state whole, in a file of its own; 1 and 2 held both states in the anchor file, rewritten each
round. Since 2 a state that averages nothing yet (``averaged_rounds`` 0) leaves out its theta_average, theta's
copy (:func:`fedfair.core.server.server_apply`)."""

STATE_SUFFIX = ".state"
"""A state's file is NAME.FEDERATION.chain.TOKEN.state, beside the anchor."""

SUM_SUFFIX = ".sum"
"""A logged sum's file is NAME.FEDERATION.chain.TOKEN.sum, beside the anchor: its values, back to back."""

WHOLE_EVERY = 8
"""A state is written whole where it would otherwise be the 8th step of logged sums from the last one written
whole. A round writes its sum (d + 1 words, 16 bits each in a runtime round: a quarter of one float64 tensor of the
state) where it wrote a state, one round in 8 a state besides; a restarted site steps at most 7 sums again."""

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


@dataclass(frozen=True)
class LoggedSum:
    """A verified sum as the anchor logs it: all the server step took, besides the state, to make the next.

    `values` is the sum as this site verified it: a masked round's encoded words, which `encoding` decodes for
    `parties` parties, or (`encoding` None) a bounded round's signed total, 2^`fractional_bits` times the sum.
    `survivors` are the parties summed, `weight` the total weight the step divided by (the plan's for them).
    """

    round: int
    values: np.ndarray
    survivors: tuple[str, ...]
    weight: float
    encoding: EncodingConfig | None = None
    parties: int = 0
    fractional_bits: int = 0


Replay = Callable[[HeldState, LoggedSum], HeldState]
"""The server step a logged sum made of a state, made again: the chain's (:meth:`ModelChain.replayed`)."""


@dataclass(frozen=True)
class _Place:
    """Where a kept state is on disk: a state written whole (its file and summary), then the sums stepping it."""

    whole: str
    summary: dict[str, Any]
    sums: tuple[tuple[str, dict[str, Any]], ...] = ()

    def then(self, name: str, logged: LoggedSum) -> _Place:
        """The place of the state the server step makes of this one and `logged`, kept in file `name`."""
        return _Place(self.whole, self.summary, (*self.sums, (name, _sum_summary(logged))))


class AnchorRecord:
    """The anchor kept at `path` (NAME.FEDERATION.chain.npz) and the files it names beside it.

    A state an anchor first holds is kept once: as the sum whose step made it of the anchor's other state, logged
    (``NAME.FEDERATION.chain.TOKEN.sum``: its values back to back), where that one is kept and fewer than
    :data:`WHOLE_EVERY` - 1 sums step it from a state written whole; else whole (``...TOKEN.state``: its tensors'
    float64 values back to back). The anchor file itself names them and holds every scalar. Round r's state is
    round r - 1's step, kept when round r - 1's sum was verified, so a round writes and syncs its sum (a quarter
    of a tensor of the state at 16 bits a word) where version 3 wrote a state, and where version 2 wrote two.

    Why a crash loses nothing a restart needs: a state or sum file is never changed once written (a state is never
    stepped in place, :func:`fedfair.runtime.state_files.stepped` with ``give_up=False``). A new one is synced, and
    so is its name (the folder), before the anchor naming it replaces the old anchor (atomically: temporary file,
    fsync, rename, fsync of the folder), and a file is removed only after an anchor that no longer names it is in
    place. So at every instant the anchor on disk is the old one or the new one, and every file it names is whole
    on disk; a file no anchor names (a crash before the rename, or before the removal) is removed by the next write.
    And a logged state is the state it stood for, bit for bit: decoding a sum is integer arithmetic and exact
    scaling, and the server step (:func:`fedfair.core.server.apply`) is elementwise IEEE arithmetic over the same
    pieces in the same order, so stepping the same state by the same sum again gives the same bits (a restart
    checks each state's scalars besides); the sum's bounds are not checked again, since its step was taken.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._kept: list[tuple[HeldState, _Place]] = []
        """The states the anchor on disk holds, each with its place (the same objects as held)."""

    def read(self, folder: Path | None, replay: Replay) -> Anchor:
        """The anchor kept at :attr:`path`, its logged states made again by `replay`.

        A large state is read (and stepped) into a file in `folder` a span at a time.

        Raises:
            ValueError: the file is not an anchor of a version this reads, a file it names is not whole, or a
                logged state made again is not the one kept (its scalars differ).
            OSError: it cannot be read.
        """
        anchor, places = _read(self.path, folder, replay)
        self._kept = [(state, place) for state, place in zip((anchor.state, anchor.next), places) if state and place]
        return anchor

    def let_go(self, anchor: Anchor) -> None:
        """Hold no state but `anchor`'s (the chain's): the anchor on disk still names the others' files.

        A state the chain has let go of is never kept again (it makes its anchors of its anchor's states and the
        steps of them), so only `anchor`'s places are looked up by :meth:`write`; held here, the state before
        them would keep its memory (a file of d float64 values a tensor) until the next write.
        """
        self._kept = [(state, place) for state, place in self._kept if state is anchor.state or state is anchor.next]

    def write(self, anchor: Anchor, logged: LoggedSum | None = None) -> None:
        """Keep `anchor`, each of its states not yet on disk kept once (OSError, naming the path: a full disk).

        `logged` is the verified sum whose step made `anchor.next` of `anchor.state` (None: no step). On an
        error the anchor kept before stays, whole.
        """
        folder, written = self.path.parent, []
        places: dict[str, _Place] = {}
        try:
            for prefix, state in (("state", anchor.state), ("next", anchor.next)):
                if state is None:
                    continue
                place = next((place for kept, place in self._kept if kept is state), None)
                before = places.get("state")
                if place is None and logged is not None and before and len(before.sums) < WHOLE_EVERY - 1:
                    written.append(_write_file(self.path, SUM_SUFFIX, partial(_put, values=logged.values)))
                    place = before.then(written[-1], logged)
                elif place is None:
                    written.append(_write_file(self.path, STATE_SUFFIX, partial(_put_state, state=state)))
                    place = _Place(written[-1], _state_summary(state))
                places[prefix] = place
            if written:
                # The new files' names reach the disk before an anchor that names them can.
                _sync_folder(folder)
            atomic_write(self.path, lambda stream: write_archive(stream, _manifest(anchor, places)))
        except BaseException:
            for name in written:
                (folder / name).unlink(missing_ok=True)
            raise
        self._kept = [
            (state, places[prefix]) for prefix, state in (("state", anchor.state), ("next", anchor.next)) if state
        ]
        named = {name for place in places.values() for name in (place.whole, *(name for name, _ in place.sums))}
        for suffix in (STATE_SUFFIX, SUM_SUFFIX):
            for stale in folder.glob(f"{_stem(self.path)}.*{suffix}"):
                if stale.name not in named:
                    stale.unlink(missing_ok=True)


@dataclass(frozen=True)
class AnchorVerdict:
    """What an anchor on disk says of its round, its states left on disk: for an observer (a test, a benchmark)."""

    round: int
    verified: bool
    stepped: bool
    """Whether the verified sum made a next state (not void)."""
    void: str


def read_verdict(path: Path) -> AnchorVerdict:
    """What the anchor kept at `path` says of its round (ValueError: not an anchor; OSError: unreadable)."""
    scalars, _ = _scalars(path)
    return AnchorVerdict(
        int(scalars["round"]), bool(scalars["verified"]), "next.fields" in scalars, str(scalars["void"])
    )


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


def _write_file(anchor_path: Path, suffix: str, put: Callable[[int], None]) -> str:
    """Write a new file beside the anchor (`put` writes into its handle) and sync it; its name."""
    handle, name = tempfile.mkstemp(prefix=f"{_stem(anchor_path)}.", suffix=suffix, dir=anchor_path.parent)
    try:
        put(handle)
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


def _put_state(handle: int, state: HeldState) -> None:
    """Write `state`'s tensors (:func:`_stored`) back to back into the file `handle`."""
    offset = 0
    for name in _stored(state):
        offset += state.copy_field(name, handle, offset)


def _put(handle: int, values: np.ndarray) -> None:
    """Write `values`' bytes into the file `handle` (no copy of them)."""
    view, done = np.ascontiguousarray(values).data.cast("B"), 0
    while done < len(view):
        done += os.write(handle, view[done:])


def _sync_folder(folder: Path) -> None:
    """Bring the names in `folder` to the disk (a new file's name is not synced with its contents)."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _state_summary(state: HeldState) -> dict[str, Any]:
    """A state written whole, as the anchor file names it: its tensors, those its file holds, its scalars."""
    summary: dict[str, Any] = {"fields": list(state.fields), "stored": _stored(state), "dimension": state.dimension}
    summary.update(_made(state))
    return summary


def _made(state: HeldState) -> dict[str, Any]:
    """`state`'s scalars (:data:`_SCALARS`)."""
    return {name: getattr(state, name) for name in _SCALARS}


def _sum_summary(logged: LoggedSum) -> dict[str, Any]:
    """A logged sum, as the anchor file names it: all of it but its values, which its file holds."""
    return {
        "round": logged.round,
        "dtype": logged.values.dtype.str,
        "length": logged.values.size,
        "survivors": list(logged.survivors),
        "weight": logged.weight,
        "encoding": None if logged.encoding is None else logged.encoding.to_document(),
        "parties": logged.parties,
        "fractional_bits": logged.fractional_bits,
    }


def _manifest(anchor: Anchor, places: dict[str, _Place]) -> dict[str, np.ndarray | Sliced]:
    """The anchor file's members: its format and version, and (:data:`_SUMMARY`) all else in one.

    Its round and verdict, and per state the state written whole it starts from (its scalars, tensors and file),
    the sums that step it since and its own scalars: one JSON member where a member a value (versions 1 and 2) cost
    about 5 ms a write at 21 of them, a tenth of a site's step at d = 10^6.
    """
    summary: dict[str, object] = {"round": anchor.round, "verified": anchor.verified, "void": anchor.void}
    sums: dict[str, dict[str, Any]] = {}
    for prefix, state in (("state", anchor.state), ("next", anchor.next)):
        if state is None:
            continue
        place = places[prefix]
        summary.update({f"{prefix}.{name}": value for name, value in place.summary.items()})
        summary[f"{prefix}.file"] = place.whole
        summary[f"{prefix}.sums"] = [name for name, _ in place.sums]
        summary[f"{prefix}.made"] = _made(state)
        sums.update(place.sums)
    summary["sums"] = sums
    return {
        "format": np.array(FORMAT),
        "version": np.array(VERSION, dtype=np.int64),
        _SUMMARY: np.array(json.dumps(summary)),
    }


_SUMMARY = "anchor"
"""Version 3's and 4's member holding every value but the format and version, as JSON (floats kept exactly: repr)."""


Values = Callable[[str, int, bool], Iterator[np.ndarray]]
"""A kept state's tensor `field` (of `length` values): at once (`whole`) or :data:`_READ` values at a time."""


def _scalars(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The anchor file's values but its tensors (versions 1 and 2 hold them), and (versions 3 and 4) its document.

    Raises:
        ValueError: not an anchor of a version this reads. OSError: it cannot be read.
    """
    try:
        with HEADERS, np.load(path, allow_pickle=False) as arrays:
            if str(arrays["format"]) != FORMAT or int(arrays["version"]) not in VERSIONS:
                raise ValueError(f"not a {FORMAT} file of version {' or '.join(map(str, VERSIONS))}")
            scalars = {name: arrays[name] for name in arrays.files if not _is_tensor(name)}
        document: dict[str, Any] = {}
        if _SUMMARY in scalars:
            document = json.loads(str(scalars[_SUMMARY]))
            scalars = {name: np.array(value) for name, value in document.items() if not isinstance(value, dict)}
    except (KeyError, zipfile.BadZipFile, json.JSONDecodeError) as error:
        raise ValueError(f"an anchor without {error}") from None
    missing = {"round", "verified", "void"} - scalars.keys()
    if missing:
        raise ValueError(f"an anchor without {', '.join(sorted(missing))}")
    return scalars, document


def _read(path: Path, folder: Path | None, replay: Replay) -> tuple[Anchor, tuple[_Place | None, _Place | None]]:
    """The anchor kept at `path`, its logged states made again by `replay`, and its states' places.

    A place is None where the state is held in the anchor file itself (versions 1 and 2).
    """
    scalars, document = _scalars(path)
    round_number, verified, void = int(scalars["round"]), bool(scalars["verified"]), str(scalars["void"])
    states: list[HeldState | None] = []
    places: list[_Place | None] = []
    try:
        for prefix in ("state", "next"):
            if f"{prefix}.fields" not in scalars:
                states.append(None)
                places.append(None)
                continue
            sums = tuple((str(name), document["sums"][name]) for name in document.get(f"{prefix}.sums", []))
            earlier, before = (places[0], states[0]) if places else (None, None)
            state: HeldState
            whole: str | None
            if (
                earlier
                and before
                and earlier.whole == document[f"{prefix}.file"]
                and sums[: len(earlier.sums)] == earlier.sums
            ):
                # The next state steps the anchor's state once more: made from it, not from the state written whole.
                state, whole, todo = before, earlier.whole, sums[len(earlier.sums) :]
            else:
                (state, whole), todo = _kept(path, scalars, prefix, folder), sums
            for name, summary in todo:
                state = replay(state, _logged(path.parent / name, summary))
            made = document.get(f"{prefix}.made")
            if made is not None and _made(state) != made:
                raise ValueError(
                    f"its {prefix}, stepped again by its {len(sums)} logged sums, is not the state it kept "
                    f"({_made(state)} where it kept {made})"
                )
            states.append(state)
            if whole is None:
                places.append(None)
                continue
            summary = {name: document[f"{prefix}.{name}"] for name in ("fields", "stored", "dimension", *_SCALARS)}
            places.append(_Place(whole, summary, sums))
    except (KeyError, TypeError) as error:
        raise ValueError(f"an anchor without {error}") from None
    first, after = states
    if first is None or round_number < 1 or (after is not None and not verified):
        raise ValueError(f"an anchor of round {round_number} that is not one a site writes")
    return Anchor(round_number, first, verified, after, void), (places[0], places[1])


def _logged(file: Path, summary: dict[str, Any]) -> LoggedSum:
    """The sum logged in `file`, `summary` all else of it (ValueError: not whole)."""
    dtype = np.dtype(str(summary["dtype"]))
    if dtype.kind not in "iu":
        raise ValueError(f"its logged sum {file.name} is of {dtype} values, not integers")
    values = np.empty(int(summary["length"]), dtype)
    with open(file, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        if size != values.nbytes or stream.readinto(values.data.cast("B")) != size:
            raise ValueError(f"its logged sum {file.name} holds {size} bytes, not the {values.nbytes} of its values")
    encoding = summary["encoding"]
    return LoggedSum(
        round=int(summary["round"]),
        values=values,
        survivors=tuple(str(name) for name in summary["survivors"]),
        weight=float(summary["weight"]),
        encoding=None if encoding is None else EncodingConfig.of_document(encoding),
        parties=int(summary["parties"]),
        fractional_bits=int(summary["fractional_bits"]),
    )


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
