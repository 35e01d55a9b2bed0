"""What a collaborator knows of its federation's outcome from its own side, kept for the final model bundle.

The aggregator's bundle says which institution's update each round holds; a collaborator ends on its own
record instead: the training rounds whose sum holds its update as far as it can tell (its closing count
and exit status), the round whose sum it refused (verified aggregation) and why, the output model (theta-bar, c-bar) it was sent to evaluate at the final round, and the
output model as it computes it from the training models it was sent (:class:`Trajectory`, the suffix
average of `fedfair.core.server.apply`). Kept beside the config as ``NAME.FEDERATION.outcome.npz``,
rewritten atomically at each change, so a restarted process keeps what the process before it saw. The models
followed live in that file alone, read back a slice at a time when they are compared or averaged: a process
holds none of them beside the round's own download.

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from fedfair.core.files import atomic_write
from fedfair.runtime.collaborator.archives import read_header, write_archive

logger = logging.getLogger("fedfair.collaborator")

OUTCOME_SUFFIX = "outcome.npz"
"""The record is kept as NAME.FEDERATION.outcome.npz beside the config."""

ROUNDING_ULPS = 4.0
"""Rounding allowed per averaged model, in ulps of the largest value averaged: one fold
a + (x - a) / k rounds three times, each by half an ulp of a value at most twice that size."""


@dataclass(frozen=True)
class Stored:
    """A model's values as the record's file holds them (member `member`), read a slice at a time."""

    path: Path
    member: str
    dtype: np.dtype[np.floating]
    size: int

    def slices(self) -> Iterator[np.ndarray]:
        """The values, :data:`_SLICE` at a time, from the first."""
        with zipfile.ZipFile(self.path) as archive, archive.open(f"{self.member}.npy") as stream:
            read_header(stream)
            for start in range(0, self.size, _SLICE):
                count = min(_SLICE, self.size - start)
                yield np.frombuffer(stream.read(count * self.dtype.itemsize), dtype=self.dtype, count=count)


@dataclass(frozen=True)
class Folded:
    """A running average with one more model folded in, formed a slice at a time as it is read.

    `theta` folded into `average` as the `count`-th model by the server's own update (:func:`_fold`); the
    first model alone when `average` is None.
    """

    average: Values | None
    theta: Values
    count: int
    dtype = np.dtype(np.float64)

    @property
    def size(self) -> int:
        """How many values: theta's."""
        return self.theta.size

    def slices(self) -> Iterator[np.ndarray]:
        """The values, :data:`_SLICE` at a time, from the first."""
        if self.average is None:
            yield from (np.asarray(piece, dtype=np.float64) for piece in _slices(self.theta))
            return
        for average, theta in zip(_slices(self.average), _slices(self.theta), strict=True):
            yield _fold(average, theta, self.count)


Values = np.ndarray | Stored | Folded
"""A model's values: in memory (the download of the round being followed), in the record's file, or an
average still to be formed from those."""


def whole(values: Values) -> np.ndarray:
    """`values` as one array: a fresh one, the caller's own, unless they are an array already."""
    if isinstance(values, np.ndarray):
        return values
    array = np.empty(values.size, dtype=values.dtype)
    for start, piece in zip(range(0, values.size, _SLICE), values.slices(), strict=True):
        array[start : start + piece.size] = piece
    return array


Theta = TypeVar("Theta", bound=Values, covariant=True)


@dataclass(frozen=True)
class ServedModel(Generic[Theta]):
    """A model (theta, c) the aggregator served this collaborator for round `round`.

    `theta` is read-only, in the dtype it travelled in: the downloaded array itself (not a copy) until the
    record is saved, then only in the record's file (:class:`Stored`).
    """

    round: int
    theta: Theta
    c: float


def _served(round_number: int, theta: np.ndarray, c: float) -> ServedModel[np.ndarray]:
    # The caller's array itself, not a copy, read-only through this view until the record's file holds it.
    kept = theta.view()
    kept.setflags(write=False)
    return ServedModel(round_number, kept, float(c))


def _slices(values: Values) -> Iterator[np.ndarray]:
    """`values`, :data:`_SLICE` at a time: views of an array, read from the record's file, or formed."""
    if not isinstance(values, np.ndarray):
        return values.slices()
    return (values[start : start + _SLICE] for start in range(0, values.size, _SLICE))


@dataclass
class Trajectory:
    """The suffix average of the training models this site was sent, as the server forms it.

    `fedfair.core.server.apply` adds a round's start model to the average when the round applies and the
    rounds applied so far (it included) exceed `skipped`. A site sees each round's start model; a round
    applied when the next round's model differs (an aborted round leaves it as it was). So a site that was
    sent every training round's model from the first can follow the average: `last` is the latest round's
    model (whether that round applied is known at the next one), `applied` the rounds before it that did.
    `following` turns False for good once a round is missed (the site joined late, or sat one out).
    """

    skipped: int
    """The applied rounds left out of the average (the plan's `average_from_round`)."""
    following: bool = True
    last: ServedModel[Values] | None = None
    applied: int = 0
    averaged: int = 0
    average: Values | None = None
    average_c: float = 0.0
    scale: float = 0.0
    """The largest magnitude of theta's and c's values averaged: the rounding bound's unit."""
    unchanged: set[int] = field(default_factory=set)
    """Rounds whose next round was sent the same model: they did not apply (seen even when not `following`)."""

    def sent(self, model: ServedModel[Values]) -> None:
        """Follow training round `model.round`'s model (a round run again after a crash replaces its own)."""
        last = self.last
        if last is not None and model.round == last.round:
            self.last = model
            return
        consecutive = last is not None and model.round == last.round + 1
        if last is not None and consecutive and _same(last, model):
            self.unchanged.add(last.round)
        elif last is not None and consecutive and self.following:
            self.applied += 1
            if self.applied > self.skipped:
                self.average, self.average_c, self.scale = self.folded(last)
                self.averaged += 1
        if not consecutive and not (last is None and model.round == 1):
            self.following = False
        self.last = model

    def folded(self, model: ServedModel[Values]) -> tuple[Folded, float, float]:
        """(average, average_c, scale) with `model` added, by the server's own update a + (x - a) / k.

        The new average is formed as it is read (:class:`Folded`): the record writes it to its file a slice
        at a time, and no model's worth of float64 is ever held.
        """
        count = self.averaged + 1
        scale = max(self.scale, _largest_magnitude(model.theta), abs(model.c))
        if self.average is None:
            return Folded(None, model.theta, count), model.c, scale
        return Folded(self.average, model.theta, count), self.average_c + (model.c - self.average_c) / count, scale

    def mismatch(self, output: ServedModel[Values]) -> str | None:
        """Why `output` is not the average this site can compute, or None: it is, or the site cannot tell.

        Whether the final round applied is not known here, so both outcomes are candidates: applied, its
        start model enters the average (if the rounds applied then exceed `skipped`; else the output is
        the model after its step, which no site is sent, and nothing can be told); aborted, the average
        stands as it is (or, before any model entered it, the output is the final round's model itself).
        """
        last = self.last
        if not self.following or last is None or last.round != output.round:
            return None
        # Each candidate is (average to fold the last model into or None, the model or None, its c, scale, folds);
        # its theta is formed a slice at a time as it is compared, never held whole beside the output.
        candidates: list[tuple[Values | None, Values | None, float, float, int]] = []
        if self.applied + 1 > self.skipped:
            count = self.averaged + 1
            scale = max(self.scale, _largest_magnitude(last.theta), abs(last.c))
            average_c = last.c if self.average is None else self.average_c + (last.c - self.average_c) / count
            candidates.append((self.average, last.theta, average_c, scale, count))
        if self.applied > self.skipped and self.average is not None:
            candidates.append((self.average, None, self.average_c, self.scale, self.averaged))
        elif self.applied <= self.skipped:
            candidates.append((None, last.theta, last.c, _largest_magnitude(last.theta), 0))
        # Models travel in float32 (contract.model_download): this site averages float32(theta_t) where the server
        # averages theta_t, and compares with float32(theta-bar); each cast moves a value by at most half an ulp.
        travelled = _cast_rounding(last.theta.dtype) + _cast_rounding(output.theta.dtype)
        gaps = []
        for average, theta, c, scale, folds in candidates:
            reference = theta if theta is not None else average
            assert reference is not None  # every candidate holds the model, the average or both
            if reference.size != output.theta.size:
                return f"model: the output model has {output.theta.size} values, the training rounds' {reference.size}"
            bound = (ROUNDING_ULPS * _FLOAT64_EPS * folds + travelled) * scale
            gap = max(_largest_gap(output.theta, average, theta, folds), abs(output.c - c))
            if gap <= bound:
                return None
            gaps.append((gap, bound, folds))
        if self.applied + 1 <= self.skipped:
            return None  # the final round may have applied: the output is then a model no site was sent
        gap, bound, folds = min(gaps)
        return (
            f"model: the output model this collaborator was sent to evaluate in round {output.round} is not the "
            f"average of the models it was sent for the {folds} training rounds the plan averages: it differs by "
            f"{gap:.3g} (rounding allows {bound:.3g})"
        )


_FLOAT64_EPS = float(np.finfo(np.float64).eps)
"""The unit of the fold's rounding: this site and the server both average in float64."""


def _cast_rounding(dtype: np.dtype[np.floating]) -> float:
    """How far a model that travelled in `dtype` may sit from the server's float64 one, in units of the scale.

    A whole ulp, not half: the scale itself is read from the cast values, which may be half an ulp short.
    """
    return 0.0 if dtype == np.float64 else float(np.finfo(dtype).eps)


_SLICE = 1 << 20
"""Coordinates the fold and the comparison take at a time (8 MiB in float64): their temporaries cost that."""


def _fold(average: np.ndarray, theta: np.ndarray, count: int) -> np.ndarray:
    """A slice of the server's running average a + (x - a) / k, k = `count`, x = `theta`, from those slices."""
    folded: np.ndarray = average + (theta - average) / count
    return folded


def _largest_magnitude(theta: Values) -> float:
    """The largest |value| of `theta` (0 for none), a slice at a time."""
    return max((float(np.abs(piece).max()) for piece in _slices(theta)), default=0.0)


def _largest_gap(output: Values, average: Values | None, theta: Values | None, count: int) -> float:
    """The largest |output - candidate|, formed a slice at a time in float64.

    The candidate is `theta` folded into `average` (:class:`Folded`), or `average` alone when `theta` is None.
    """
    candidate = average if theta is None else Folded(average, theta, count)
    assert candidate is not None  # every candidate holds the model, the average or both
    pieces = zip(_slices(output), _slices(candidate), strict=True)
    return max((float(np.abs(piece - formed).max()) for piece, formed in pieces), default=0.0)


def _same(one: ServedModel[Values], other: ServedModel[Values]) -> bool:
    if one.c != other.c or one.theta.size != other.theta.size:
        return False
    return all(np.array_equal(a, b) for a, b in zip(_slices(one.theta), _slices(other.theta), strict=True))


@dataclass(frozen=True)
class Refusal:
    """The training round whose sum a site refused, the reason's name (`VerifyReason`) and the check's words."""

    round: int
    reason: str
    detail: str


class OutcomeRecord:
    """The rounds this institution contributed to and the models it was sent, loaded from and kept in `path`."""

    def __init__(self, path: Path, average_from: int) -> None:
        """Load the record at `path`, or start an empty one; `average_from` is the plan's (`average_from_round`).

        An unreadable record is set aside with a warning rather than stopping the collaborator: it holds nothing
        private, and starting it again can only lower the count (exit status 3, not 0) or leave the bundle
        unchecked, and so not kept.
        """
        self.path = path
        self._rounds: dict[int, bool] = {}
        """Each training round whose sum holds this update: True while it stands, False once announced aborted."""
        self._output: ServedModel[Values] | None = None
        self._refusal: Refusal | None = None
        """The round whose sum this site refused (verified aggregation), and why; kept for good once set."""
        self._trajectory = Trajectory(average_from)
        if path.exists():
            try:
                self._load()
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
                self._rounds, self._output = {}, None
                self._trajectory = Trajectory(average_from, following=False)
                logger.warning(
                    "%s is unreadable (%s); starting it again: the rounds contributed before are not counted, and "
                    "the final bundle is kept only if this process is sent the output model to evaluate",
                    path,
                    error,
                )

    def _load(self) -> None:
        with np.load(self.path, allow_pickle=False) as arrays:
            for key, standing in (("contributed", True), ("aborted", False)):
                self._rounds.update(dict.fromkeys((_round(value) for value in arrays[key].tolist()), standing))
            self._output = self._model(arrays, "output")
            if "refused_round" in arrays:
                refused = (str(arrays["refused_reason"]), str(arrays["refused_detail"]))
                self._refusal = Refusal(_round(int(arrays["refused_round"])), *refused)
            trajectory = self._trajectory
            trajectory.following = bool(arrays["following"])
            trajectory.last = self._model(arrays, "last")
            trajectory.applied, trajectory.averaged = _round(int(arrays["applied"])), _round(int(arrays["averaged"]))
            trajectory.unchanged = {_round(value) for value in arrays["unchanged"].tolist()}
            if "average_theta" in arrays:
                trajectory.average = self._stored("average_theta")
                trajectory.average_c, trajectory.scale = float(arrays["average_c"]), float(arrays["scale"])

    def _model(self, arrays: np.lib.npyio.NpzFile, prefix: str) -> ServedModel[Stored] | None:
        """The model the file holds under `prefix`, its theta left there (:class:`Stored`), or None."""
        if f"{prefix}_theta" not in arrays:
            return None
        stored = self._stored(f"{prefix}_theta")
        return ServedModel(_round(int(arrays[f"{prefix}_round"])), stored, float(arrays[f"{prefix}_c"]))

    def _stored(self, member: str) -> Stored:
        """The values the file holds as `member`, left there; ValueError if they are not a model's."""
        with zipfile.ZipFile(self.path) as archive, archive.open(f"{member}.npy") as stream:
            shape, dtype = read_header(stream)
        if len(shape) != 1 or dtype not in (np.float32, np.float64):
            raise ValueError(f"the record's {member} is a {dtype} array of shape {shape}")
        return Stored(self.path, member, dtype, shape[0])

    def _save(self) -> None:
        """Write the record, then let go of any model it held in memory: the file holds it now."""
        trajectory = self._trajectory
        arrays: dict[str, Values] = {
            "contributed": np.array(sorted(r for r, standing in self._rounds.items() if standing), dtype=np.int64),
            "aborted": np.array(sorted(r for r, standing in self._rounds.items() if not standing), dtype=np.int64),
            "following": np.array(trajectory.following),
            "applied": np.array(trajectory.applied, dtype=np.int64),
            "averaged": np.array(trajectory.averaged, dtype=np.int64),
            "unchanged": np.array(sorted(trajectory.unchanged), dtype=np.int64),
        }
        if self._refusal is not None:
            arrays["refused_round"] = np.array(self._refusal.round, dtype=np.int64)
            arrays["refused_reason"] = np.array(self._refusal.reason)
            arrays["refused_detail"] = np.array(self._refusal.detail)
        for prefix, model in (("output", self._output), ("last", trajectory.last)):
            if model is not None:
                arrays[f"{prefix}_theta"] = model.theta
                arrays[f"{prefix}_round"] = np.array(model.round, dtype=np.int64)
                arrays[f"{prefix}_c"] = np.array(model.c, dtype=np.float64)
        if trajectory.average is not None:
            arrays["average_theta"] = trajectory.average
            arrays["average_c"] = np.array(trajectory.average_c, dtype=np.float64)
            arrays["scale"] = np.array(trajectory.scale, dtype=np.float64)
        # Straight into the file, a model stored or an average formed a slice at a time: neither is held whole.
        atomic_write(self.path, lambda stream: write_archive(stream, arrays))
        if self._output is not None:
            self._output = ServedModel(self._output.round, self._stored("output_theta"), self._output.c)
        if trajectory.last is not None:
            trajectory.last = ServedModel(trajectory.last.round, self._stored("last_theta"), trajectory.last.c)
        if trajectory.average is not None:
            trajectory.average = self._stored("average_theta")

    # ------------------------------------------------------------ what the collaborator saw

    def held(self, round_number: int) -> None:
        """Training round `round_number`'s sum holds this update (a re-run round after an aggregator crash counts once).

        Without secure aggregation: the update was uploaded; under it: this site signed the round's survivor set.
        """
        if self._rounds.get(round_number) is not True:
            self._rounds[round_number] = True
            self._save()

    def aborted(self, round_number: int) -> None:
        """The aggregator announced training round `round_number` aborted: no model holds its update."""
        if self._rounds.get(round_number):
            self._rounds[round_number] = False
            self._save()

    def training_model(self, round_number: int, theta: np.ndarray, c: float) -> None:
        """Follow the model (theta, c) sent for training round `round_number` (:class:`Trajectory`).

        `theta` is read, not kept: the record's file keeps it.
        """
        self._trajectory.sent(_served(round_number, theta, c))
        self._save()

    def output_model(self, round_number: int, theta: np.ndarray, c: float) -> None:
        """Keep the output model (theta-bar, c-bar) sent for round `round_number`'s evaluation, the last such one.

        `theta` is read, not kept, like :meth:`training_model`'s.
        """
        self._output = _served(round_number, theta, c)
        self._save()

    def refused(self, round_number: int, reason: str, detail: str) -> None:
        """This site refused training round `round_number`'s sum (verified aggregation): no bundle is kept after it.

        The first refusal stands: a later one (a restarted process shown another sum) does not replace it.
        """
        if self._refusal is None:
            self._refusal = Refusal(round_number, reason, detail)
            self._save()

    # ------------------------------------------------------------ what it says

    @property
    def refusal(self) -> Refusal | None:
        """The round whose sum this site refused and why; None while every sum it was shown passed its check."""
        return self._refusal

    @property
    def contributed(self) -> int:
        """How many training rounds hold this institution's update, as far as its own side knows.

        A round that aborted after this site's part (the aggregator's checks of the decoded sum announce
        nothing) shows as the next round being sent the same model, and does not count.
        """
        unchanged = self._trajectory.unchanged
        return sum(standing and number not in unchanged for number, standing in self._rounds.items())

    @property
    def output(self) -> ServedModel[np.ndarray] | None:
        """The output model sent for the plan's final evaluation, read back whole (a fresh array), or None if none was."""
        output = self._output
        if output is None:
            return None
        return ServedModel(output.round, whole(output.theta), output.c)

    def output_mismatch(self) -> str | None:
        """Why the output model is not the average of the training models this site was sent, or None.

        None also when there is no output model, or the site cannot tell (:meth:`Trajectory.mismatch`). A site that
        refused a round's sum refuses every output model after it: it is made from a sum that failed its check.
        """
        if self._refusal is not None:
            refusal = self._refusal
            return f"this site refused round {refusal.round}'s sum ({refusal.reason}): {refusal.detail}"
        return None if self._output is None else self._trajectory.mismatch(self._output)


def _round(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a round number")
    return value
