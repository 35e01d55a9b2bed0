"""The public inputs of the last applied training rounds: what lets a site that missed one catch up (issue 98).

Every input a stage of a training round sends all its parties alike, where the round's kind keeps past rounds
(the masked round's parameters, key directory, masking and survivor sets, unmask request, claim and tag set; the
bounded sum's SHARE opening, verdict record and tag set, and its auditor's inputs) is written into the output folder
as the stage opens; a per-party input (the share bundles) never is. Once the round applies its folder is kept, an
aborted round's removed, and a site fetches a kept input with the past round's binding
(:mod:`fedfair.runtime.collaborator.catch_up`). Bounded: a round every collaborator of the plan verified (or passed)
is removed, and at most :data:`KEPT_ROUNDS` are kept.
docs/security.md, "Verified aggregation" (a site that missed a round).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Collection, Mapping
from pathlib import Path

from fedfair.runtime.output_folder import PAST_ROUNDS_NAME
from fedfair.runtime.transport import Pieces, pb

KEPT_ROUNDS = 8
"""The most applied rounds whose inputs are kept for a site that missed them (the newest)."""

_OPEN = ".open"
"""The suffix of the folder of the round under way: it becomes a kept round's once that round applies."""


class PastRounds:
    """The kept inputs of applied training rounds, in ``OUTPUT/past-rounds/ROUND/STEP`` (None: none kept)."""

    def __init__(self, output: Path | None) -> None:
        self._folder = None if output is None else output / PAST_ROUNDS_NAME
        self._lock = threading.Lock()
        self._kept: set[int] = set()
        """The applied rounds kept on disk (a resumed run's too): a fetch of any other touches no file."""
        if self._folder is not None and self._folder.is_dir():
            self._kept = {int(path.name) for path in self._folder.iterdir() if path.name.isdigit()}
        self._verified: dict[str, int] = {}
        """The last round each collaborator verified, as this process saw it."""

    def opened(self, binding: pb.Binding, inputs: bytes | Mapping[str, bytes | Pieces]) -> None:
        """Keep the input every party of training stage `binding` was sent alike (a per-party one is not kept).

        The round's first stage starts its folder afresh: what an aggregator that died mid-round wrote is gone, and
        so is a kept round of that number (one that applied before the checkpoint was written), which would
        otherwise be served in place of the stages now open.
        """
        folder = self._folder
        if folder is None or not isinstance(inputs, bytes) or binding.stage != pb.STAGE_TRAIN or not binding.step:
            return
        round_folder = folder / f"{binding.round}{_OPEN}"
        with self._lock:
            if binding.step == 1:
                shutil.rmtree(round_folder, ignore_errors=True)
                shutil.rmtree(folder / str(binding.round), ignore_errors=True)
                self._kept.discard(binding.round)
            round_folder.mkdir(parents=True, exist_ok=True)
            written = round_folder / f"{binding.step}.part"
            written.write_bytes(inputs)
            os.replace(written, round_folder / str(binding.step))  # a repeated stage's last input stands

    def ended(self, round_number: int, applied: bool, verified_by: Collection[str], roster: Collection[str]) -> None:
        """Round `round_number` applied (keep its inputs) or not (remove them); `verified_by` sent their verdicts.

        Removes every kept round each of `roster` verified or passed, and all but the newest :data:`KEPT_ROUNDS`.
        """
        folder = self._folder
        if folder is None:
            return
        with self._lock:
            round_folder = folder / f"{round_number}{_OPEN}"
            if not applied:
                shutil.rmtree(round_folder, ignore_errors=True)
                return
            for name in verified_by:
                self._verified[name] = max(self._verified.get(name, 0), round_number)
            if round_folder.is_dir():
                kept = folder / str(round_number)
                shutil.rmtree(kept, ignore_errors=True)  # a resumed run's round run again
                os.replace(round_folder, kept)
                self._kept.add(round_number)
            caught_up = min((self._verified.get(name, 0) for name in roster), default=0)
            rounds = sorted(self._kept, reverse=True)
            for number in rounds[KEPT_ROUNDS:] + [number for number in rounds if number <= caught_up]:
                shutil.rmtree(folder / str(number), ignore_errors=True)
                self._kept.discard(number)

    def keeps(self, binding: pb.Binding) -> bool:
        """Whether `binding` is a training stage of a kept round (its input may be on disk); reads no file."""
        with self._lock:
            return binding.stage == pb.STAGE_TRAIN and binding.step > 0 and binding.round in self._kept

    def input(self, binding: pb.Binding) -> bytes | None:
        """The kept input of training stage `binding` of an applied round (None: no such round or stage kept).

        Reads a file only where :meth:`keeps` says the round is kept.
        """
        folder = self._folder
        if folder is None or not self.keeps(binding):
            return None
        path = folder / str(binding.round) / str(binding.step)
        with self._lock:
            try:
                return path.read_bytes()
            except FileNotFoundError:
                return None

    def kept(self) -> list[int]:
        """The applied rounds whose inputs are kept, oldest first."""
        with self._lock:
            return sorted(self._kept)
