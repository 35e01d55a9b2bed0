"""What a collaborator knows of its federation's outcome from its own side, kept for the final model bundle.

At FINISHED the aggregator offers the federation's model bundle, whose provenance says which institution's
update each round holds. That is the aggregator's word; a collaborator ends on its own record instead
(:mod:`fedfair.runtime.collaborator.receipt`):

- the training rounds whose sum holds this institution's update as far as it can tell: without secure
  aggregation those it uploaded its update for, under it those whose survivor set it signed (which names
  it: a masked input the aggregator drops leaves it out of that stage), less those the aggregator then
  announced aborted: its closing count and exit status;
- the output model (theta-bar, c-bar) it was sent to evaluate at the plan's final round: the aggregator
  evaluates the model its bundle holds, so the bundle must hold exactly these values.

Kept beside the config as ``NAME.FEDERATION.outcome.npz`` (one model's values and a few round numbers),
rewritten atomically at each change, so a restarted process keeps what the process before it saw.
"""

from __future__ import annotations

import io
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedfair.core.files import atomic_write

logger = logging.getLogger("fedfair.collaborator")

OUTCOME_SUFFIX = "outcome.npz"
"""The record is kept as NAME.FEDERATION.outcome.npz beside the config."""


@dataclass(frozen=True)
class OutputModel:
    """The output model (theta-bar, c-bar) this collaborator was sent to evaluate in round `round`.

    `theta` is read-only, in the dtype it travelled in.
    """

    round: int
    theta: np.ndarray
    c: float


class OutcomeRecord:
    """The rounds this institution contributed to and the output model it was sent, loaded from and kept in `path`."""

    def __init__(self, path: Path) -> None:
        """Load the record at `path`, or start an empty one.

        An unreadable record is set aside with a warning rather than stopping the collaborator: it holds nothing
        private, and starting it again can only lower the count (exit status 3, not 0) or leave the bundle
        unchecked, and so not kept.
        """
        self.path = path
        self._rounds: dict[int, bool] = {}
        """Each training round whose sum holds this update: True while it stands, False once announced aborted."""
        self._output: OutputModel | None = None
        if path.exists():
            try:
                self._load()
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
                self._rounds, self._output = {}, None
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
            if "theta" in arrays:
                theta = np.array(arrays["theta"])
                if theta.ndim != 1 or theta.dtype not in (np.float32, np.float64):
                    raise ValueError(f"the output model is a {theta.dtype} array of shape {theta.shape}")
                theta.setflags(write=False)
                self._output = OutputModel(_round(int(arrays["output_round"])), theta, float(arrays["output_c"]))

    def _save(self) -> None:
        arrays: dict[str, np.ndarray] = {
            "contributed": np.array(sorted(r for r, standing in self._rounds.items() if standing), dtype=np.int64),
            "aborted": np.array(sorted(r for r, standing in self._rounds.items() if not standing), dtype=np.int64),
        }
        if self._output is not None:
            arrays["theta"] = self._output.theta
            arrays["output_round"] = np.array(self._output.round, dtype=np.int64)
            arrays["output_c"] = np.array(self._output.c, dtype=np.float64)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stub wants positional arrays too
        payload = buffer.getvalue()
        atomic_write(self.path, lambda stream: stream.write(payload))

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

    def output_model(self, round_number: int, theta: np.ndarray, c: float) -> None:
        """Keep the output model (theta-bar, c-bar) sent for round `round_number`'s evaluation, the last such one."""
        kept = np.array(theta)
        kept.setflags(write=False)
        self._output = OutputModel(round_number, kept, float(c))
        self._save()

    # ------------------------------------------------------------ what it says

    @property
    def contributed(self) -> int:
        """How many training rounds hold this institution's update, as far as its own side knows."""
        return sum(self._rounds.values())

    @property
    def output(self) -> OutputModel | None:
        """The output model sent for the plan's final evaluation, or None when none was."""
        return self._output


def _round(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a round number")
    return value
