"""What a collaborator knows of its federation's outcome from its own side, kept for the final model bundle.

The aggregator's bundle says which institution's update each round holds; a collaborator ends on its own
record instead: the training rounds whose sum holds its update as far as it can tell (its closing count and exit
status), the round whose sum it refused (verified aggregation) and why, the rounds it sat out unable to check their
models, the parties a bounded round's verdict record named liars (with the record's digest), the output model (theta-bar, c-bar) it was sent to evaluate at the final round, and the output model as it
computes it from the training models it was sent (:class:`.trajectory.Trajectory`, the suffix average of
`fedfair.core.server.apply`). Kept beside the config as ``NAME.FEDERATION.outcome.npz``, rewritten atomically at
each change, so a restarted process keeps what the process before it saw. The models followed live in that file
alone, read back a slice at a time when compared or averaged: a process holds none beside the round's download.

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedfair.core.files import atomic_write
from fedfair.runtime.collaborator.archives import HEADERS, Member, read_header, write_archive
from fedfair.runtime.collaborator.trajectory import Stored, ServedModel, Trajectory, Values, served_model

logger = logging.getLogger("fedfair.collaborator")

OUTCOME_SUFFIX = "outcome.npz"
"""The record is kept as NAME.FEDERATION.outcome.npz beside the config."""


@dataclass(frozen=True)
class Refusal:
    """The training round whose sum a site refused, the reason's name (`VerifyReason`) and the check's words."""

    round: int
    reason: str
    detail: str


@dataclass(frozen=True)
class Excluded:
    """A party a bounded round's verdict record excluded: its proof failed this site's own check of the record.

    round: the training round; party: its name; reasons: the check's words; record_sha256: the SHA-256 of the
    signed verdict record as this site received it (the aggregator's rounds.jsonl ``verdict_record_sha256``);
    kept: the file this site kept the record's bytes in ("" if none).
    """

    round: int
    party: str
    reasons: str
    record_sha256: str
    kept: str


_EXCLUDED_FIELDS = ("party", "reasons", "record_sha256", "kept")


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
        self._unchecked: dict[int, str] = {}
        """Each round this site sat out because it could not check the model it was sent, and why."""
        self._excluded: list[Excluded] = []
        self._trajectory = Trajectory(average_from)
        if path.exists():
            try:
                self._load()
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
                self._rounds, self._output, self._unchecked, self._excluded = {}, None, {}, []
                self._refusal = None
                self._trajectory = Trajectory(average_from, following=False)
                logger.warning(
                    "%s is unreadable (%s); starting it again: the rounds contributed before are not counted, and "
                    "the final bundle is kept only if this process is sent the output model to evaluate",
                    path,
                    error,
                )

    def _load(self) -> None:
        with HEADERS, np.load(self.path, allow_pickle=False) as arrays:
            for key, standing in (("contributed", True), ("aborted", False)):
                self._rounds.update(dict.fromkeys((_round(value) for value in arrays[key].tolist()), standing))
            self._output = self._model(arrays, "output")
            if "unchecked_rounds" in arrays:
                why = [str(reason) for reason in arrays["unchecked_why"].tolist()]
                rounds = [_round(value) for value in arrays["unchecked_rounds"].tolist()]
                self._unchecked = dict(zip(rounds, why, strict=True))
            if "excluded_rounds" in arrays:
                columns = [[str(value) for value in arrays[f"excluded_{name}"].tolist()] for name in _EXCLUDED_FIELDS]
                rounds = [_round(value) for value in arrays["excluded_rounds"].tolist()]
                self._excluded = [Excluded(*row) for row in zip(rounds, *columns, strict=True)]
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

    def _kept(self, values: Values) -> Values | Member:
        """`values` as the next save writes them: a model this record's file holds already, copied as it stands."""
        if isinstance(values, Stored) and values.path == self.path:
            return Member(self.path, values.member)
        return values

    def _save(self) -> None:
        """Write the record, then let go of any model it held in memory: the file holds it now."""
        trajectory = self._trajectory
        arrays: dict[str, Values | Member] = {
            "contributed": np.array(sorted(r for r, standing in self._rounds.items() if standing), dtype=np.int64),
            "aborted": np.array(sorted(r for r, standing in self._rounds.items() if not standing), dtype=np.int64),
            "following": np.array(trajectory.following),
            "applied": np.array(trajectory.applied, dtype=np.int64),
            "averaged": np.array(trajectory.averaged, dtype=np.int64),
            "unchanged": np.array(sorted(trajectory.unchanged), dtype=np.int64),
        }
        if self._unchecked:
            arrays["unchecked_rounds"] = np.array(sorted(self._unchecked), dtype=np.int64)
            arrays["unchecked_why"] = np.array([self._unchecked[number] for number in sorted(self._unchecked)])
        if self._excluded:
            arrays["excluded_rounds"] = np.array([entry.round for entry in self._excluded], dtype=np.int64)
            for name in _EXCLUDED_FIELDS:
                arrays[f"excluded_{name}"] = np.array([getattr(entry, name) for entry in self._excluded])
        if self._refusal is not None:
            arrays["refused_round"] = np.array(self._refusal.round, dtype=np.int64)
            arrays["refused_reason"] = np.array(self._refusal.reason)
            arrays["refused_detail"] = np.array(self._refusal.detail)
        for prefix, model in (("output", self._output), ("last", trajectory.last)):
            if model is not None:
                arrays[f"{prefix}_theta"] = self._kept(model.theta)
                arrays[f"{prefix}_round"] = np.array(model.round, dtype=np.int64)
                arrays[f"{prefix}_c"] = np.array(model.c, dtype=np.float64)
        if trajectory.average is not None:
            arrays["average_theta"] = self._kept(trajectory.average)
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
        self._trajectory.sent(served_model(round_number, theta, c))
        self._save()

    def output_model(self, round_number: int, theta: np.ndarray, c: float) -> None:
        """Keep the output model (theta-bar, c-bar) sent for round `round_number`'s evaluation, the last such one.

        `theta` is read, not kept, like :meth:`training_model`'s.
        """
        self._output = served_model(round_number, theta, c)
        self._save()

    def refused(self, round_number: int, reason: str, detail: str) -> None:
        """This site refused training round `round_number`'s sum (verified aggregation): no bundle is kept after it.

        The first refusal stands: a later one (a restarted process shown another sum) does not replace it.
        """
        if self._refusal is None:
            self._refusal = Refusal(round_number, reason, detail)
            self._save()

    def unchecked(self, round_number: int, why: str) -> None:
        """This site sat round `round_number` out: it could not check the model it was sent (`why`).

        It trained on and evaluated none of it (:mod:`fedfair.runtime.collaborator.chain`); the first reason
        given for a round stands.
        """
        if round_number not in self._unchecked:
            self._unchecked[round_number] = why
            self._save()

    def excluded(self, entry: Excluded) -> None:
        """Keep a party a verdict record named a liar (once per round and party), once no dispute cleared it."""
        if all((kept.round, kept.party) != (entry.round, entry.party) for kept in self._excluded):
            self._excluded.append(entry)
            self._save()

    # ------------------------------------------------------------ what it says

    @property
    def liars(self) -> tuple[Excluded, ...]:
        """Every party a bounded round's verdict record excluded, in the order this site checked them."""
        return tuple(self._excluded)

    @property
    def sat_out(self) -> dict[int, str]:
        """The rounds this site sat out, unable to check their models, each with why (a copy)."""
        return dict(self._unchecked)

    def unchecked_output(self) -> tuple[int, str] | None:
        """The first round sat out unchecked and why, when this site holds no output model it checked; else None.

        Under verified aggregation an output model is recorded only once the model chain checked it, so a site
        that sat rounds out and then checked the final output model again keeps its bundle (its count says the
        rounds it missed); one that did not keeps none.
        """
        if not self._unchecked or self._output is not None:
            return None
        first = min(self._unchecked)
        return first, self._unchecked[first]

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
    def output(self) -> ServedModel[Values] | None:
        """The output model sent for the plan's final evaluation, or None if none was.

        Its theta as the record holds it (:class:`~fedfair.runtime.collaborator.trajectory.Stored`: read a slice at
        a time), never whole: at the end of a federation every site holds the bundle it checks beside it.
        """
        return self._output

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
