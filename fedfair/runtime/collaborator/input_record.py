"""One input per model, for good: what a collaborator answered, to whom, and the bits it sent.

Secure aggregation reveals the sum of one survivor set's inputs. Two sums that differ by
one site's input give that input away: the same round over survivors that differ by one
site, or the same survivors where one site sends something new (it was restarted, or was
pushed a model one ulp away so that it trained again). So a collaborator keeps, beside its
config, one record per federation (``NAME.FEDERATION.bindings.json``) and the latest
payload of each kind (``NAME.FEDERATION.KIND.kept.npz``), each written atomically *before*
anything derived from its data leaves:

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedfair.core.errors import (
    BudgetReason,
    ConfigError,
    PermanentFailureError,
    PrivacyBudgetError,
    Refusal,
    RefusedError,
)
from fedfair.core.files import atomic_write, read_json
from fedfair.privacy import distributed
from fedfair.runtime.failures import FEDERATION_PAST, LOCAL_STATE_LOST

KINDS = ("statistics", "train", "evaluate")
"""The kinds of input: the statistics before round 1 (round 0), a round's training and its evaluation."""

FORMAT = "fedfair-bindings"
VERSION = 2
"""Version 2 adds each input's round, the kept payloads, the training count and thresholds; version 1
files (survivor sets only) are still read, their inputs' rounds unknown."""

_FIX = (
    "restore it (and the .kept.npz files beside it) from a backup; losing it would let the aggregator sum "
    "this institution's past inputs with new ones, so start afresh only for a new federation id, or pass "
    "--reset-state if you accept that"
)


@dataclass(frozen=True)
class Kept:
    """The bits of one answer, kept so that the same request gets exactly them again.

    vector: the contribution as sent without secure aggregation (float64), or None when the
    answer was to contribute nothing; weight: its weight; encoded: under secure aggregation,
    the fixed-point words before masking (noise included, where there is noise).
    """

    vector: np.ndarray | None
    weight: float
    encoded: np.ndarray | None = None


@dataclass
class SignedView:
    """The survivors (by name) this collaborator signed for one input, whichever session carried it.

    A round the aggregator re-runs (after a crash, or pretending one) carries the same
    input again; the collaborator then signs only the same survivor set, so no two
    unmasked sums differ by one party's input. `kept` is that input's bits when it was
    answered before (they are sent again); `keep` persists an answer before it is sent.
    """

    survivors: frozenset[str] | None = None
    bind_survivors: Callable[[frozenset[str]], None] = field(default=lambda survivors: None, repr=False)
    kept: Kept | None = None
    keep: Callable[[Kept], None] = field(default=lambda kept: None, repr=False)

    def bind(self, survivors: frozenset[str]) -> None:
        """Bind this input to `survivors` (kept on disk first, then remembered here)."""
        self.bind_survivors(survivors)
        self.survivors = survivors


@dataclass
class _Input:
    round: int | None
    survivors: frozenset[str] | None = None


class InputRecord:
    """The record of one collaborator in one federation, loaded from and kept in ``path``."""

    def __init__(self, path: Path, federation: str = "", *, reset: bool = False) -> None:
        """Load the record at `path` (of federation `federation`) or start one.

        `reset` is the operator's word (``--reset-state``) that a lost record may start again past the first
        round.
        """
        self.path = path
        self.federation = federation
        self.reset = reset
        self._inputs: dict[str, _Input] = {}
        self._latest: int | None = None
        self._kept: dict[str, dict[str, object]] = {}
        self._trainings = 0
        self._thresholds: dict[int, float] = {}
        self._releases: list[dict[str, object]] = []
        """The privacy ledger: every fresh noised answer, charged before it was kept (and so before it left)."""
        self._views: dict[str, SignedView] = {}
        self._first_asked: int | None = None
        """The first round this process was asked to answer."""
        self.found = path.exists()
        """Whether a record was on disk when this process started (else it starts one)."""
        if self.found:
            self._load()

    # ------------------------------------------------------------ persistence

    def _load(self) -> None:
        data = read_json(self.path, _FIX)
        try:
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("not a bindings file")
            latest = data["latest"]
            self._latest = None if latest is None else _count(latest, "latest")
            inputs = data["inputs"]
            if data.get("version", 1) == 1:
                self._inputs = {str(key): _Input(None, _names(names)) for key, names in inputs.items()}
                return
            for key, entry in inputs.items():
                round_number = entry["round"]
                survivors = entry["survivors"]
                self._inputs[str(key)] = _Input(
                    None if round_number is None else _count(round_number, f"inputs.{key}.round"),
                    None if survivors is None else _names(survivors),
                )
            self._kept = {str(kind): dict(entry) for kind, entry in data["kept"].items()}
            self._trainings = _count(data["trainings"], "trainings")
            self._thresholds = {
                _count(int(round_number), "thresholds"): float(c) for round_number, c in data["thresholds"].items()
            }
            self._releases = [dict(entry) for entry in data.get("releases", [])]
            for entry in self._releases:
                _release(entry)  # each entry must still read as a release
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ConfigError(f"{self.path}: unreadable bindings ({error}); {_FIX}") from None

    def _save(self) -> None:
        document = {
            "format": FORMAT,
            "version": VERSION,
            "latest": self._latest,
            "inputs": {
                key: {
                    "round": entry.round,
                    "survivors": None if entry.survivors is None else sorted(entry.survivors),
                }
                for key, entry in sorted(self._inputs.items())
            },
            "kept": self._kept,
            "trainings": self._trainings,
            "thresholds": {str(round_number): c for round_number, c in sorted(self._thresholds.items())},
            "releases": self._releases,
        }
        payload = json.dumps(document, indent=1).encode()
        atomic_write(self.path, lambda stream: stream.write(payload))

    def _kept_path(self, kind: str) -> Path:
        stem = self.path.name.removesuffix(".bindings.json")
        return self.path.with_name(f"{stem}.{kind}.kept.npz")

    def _read_kept(self, kind: str, key: str) -> Kept | None:
        """The kept bits of `key` (kind:model), or None if another answer replaced them or they are lost."""
        entry = self._kept.get(kind)
        if entry is None or entry.get("key") != key:
            return None
        path = self._kept_path(kind)
        try:
            payload = path.read_bytes()
        except OSError:
            return None
        if hashlib.sha256(payload).hexdigest() != entry.get("sha256"):
            return None  # a kill between the payload and the record, or a changed file: not these bits
        with np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
            vector = arrays["vector"] if "vector" in arrays else None
            encoded = arrays["encoded"] if "encoded" in arrays else None
            weight = float(arrays["weight"])
        for array in (vector, encoded):
            if array is not None:
                array.setflags(write=False)
        return Kept(vector, weight, encoded)

    def _write_kept(self, kind: str, key: str, round_number: int, kept: Kept) -> None:
        arrays: dict[str, np.ndarray] = {"weight": np.array(kept.weight, dtype=np.float64)}
        if kept.vector is not None:
            arrays["vector"] = np.asarray(kept.vector)
        if kept.encoded is not None:
            arrays["encoded"] = np.asarray(kept.encoded)
        path = self._kept_path(kind)
        # Straight to the file, hashed as read back: an in-memory archive would hold the input twice more.
        atomic_write(path, lambda stream: np.savez(stream, **arrays))  # type: ignore[arg-type]  # numpy's stub wants positional arrays too
        with path.open("rb") as written:
            digest = hashlib.file_digest(written, "sha256").hexdigest()
        self._kept[kind] = {"key": key, "round": round_number, "sha256": digest}

    # ------------------------------------------------------------ what it says

    @property
    def latest(self) -> int | None:
        """The round of the latest input answered, or None."""
        return self._latest

    @property
    def trainings(self) -> int:
        """How many training rounds this institution trained and answered (each charged to its accountant)."""
        return self._trainings

    def check_accountant(self, rounds: int, where: Path | None) -> None:
        """Refuse a privacy accountant that does not go with this record.

        The accountant charges a round before its steps run and the record counts it after, so an
        honest pair always has ``rounds >= trainings``; fewer means the accountant's file was lost or
        rolled back, and going on would spend the budget again from a false start. An accountant that
        charged rounds beside no record at all means the record was lost (PermanentFailureError, unless
        ``reset``).
        """
        if rounds > 0 and not self.found and not self.reset:
            raise PermanentFailureError(
                LOCAL_STATE_LOST, path=self.path, evidence=f"its privacy accountant charged {rounds} rounds"
            )
        if rounds < self._trainings:
            raise ConfigError(
                f"the privacy accountant ({where or 'in memory'}) has charged {rounds} rounds, but {self.path} "
                f"records {self._trainings} trained: the accountant's state was lost or rolled back, so its "
                "epsilon would understate what was spent; restore it from the backup taken with the bindings"
            )

    def spent(self, delta: float) -> float:
        """The epsilon (at `delta`) of every release in the ledger, composed (RDP); 0 without any."""
        return _composed(self._releases, delta)

    def ledger(self) -> list[dict[str, object]]:
        """The ledger's entries.

        Kind, round, model, mechanism, mu, l1, l2 (encoded units), sampling rate and the delta add-on of
        rounding and wraps.
        """
        return [dict(entry) for entry in self._releases]

    def charge(
        self,
        kind: str,
        round_number: int,
        model: str,
        release: distributed.Release,
        delta: float,
        budget: float,
        addon: float = 0.0,
    ) -> float:
        """Charge one fresh input's `release` (one step) to the ledger and persist it, before it is kept and sent.

        Returns:
            The epsilon spent so far with it, at `delta` (less every entry's `addon` for rounding and wraps).

        Raises:
            PrivacyBudgetError: reason :attr:`BudgetReason.ANSWER_REFUSED`, charging nothing, when the composed
                epsilon would pass `budget`; the message names what was spent on what.
        """
        entry: dict[str, object] = {
            "kind": kind,
            "round": round_number,
            "model": model,
            "mechanism": release.mechanism,
            "mu": release.mu,
            "l1": release.l1,
            "l2": release.l2,
            "sampling_rate": release.sampling_rate,
            "addon": addon,
            "delta": delta,
        }
        total = _composed([*self._releases, entry], delta)
        if total > budget:
            kinds = sorted({str(item["kind"]) for item in self._releases})
            spent_on = ", ".join(
                f"{sum(item['kind'] == name for item in self._releases)} {name} answers" for name in kinds
            )
            raise PrivacyBudgetError(
                BudgetReason.ANSWER_REFUSED,
                f"answering round {round_number} ({kind}) would spend epsilon {total:.3g} at delta {delta:g}, past "
                f"this institution's budget of {budget:g}; spent so far: epsilon {self.spent(delta):.3g} on "
                f"{spent_on or 'nothing'} (kept in {self.path}); only a larger [privacy] budget in a new plan "
                "(and in this institution's own [privacy] budget_epsilon, where set) lets it answer more",
            )
        self._releases.append(entry)
        self._save()
        return total

    def composition_threshold(self, average_from: int) -> float | None:
        """The threshold c composition counts use.

        The mean of the c of the training rounds from `average_from` on that this institution trained on (else
        of all it trained on), never a c the aggregator names for the query; None before any training.
        """
        chosen = [c for round_number, c in self._thresholds.items() if round_number >= average_from]
        chosen = chosen or list(self._thresholds.values())
        return float(np.mean(chosen)) if chosen else None

    # ------------------------------------------------------------ answering

    def view(self, round_number: int, kind: str, model: str) -> SignedView:
        """The binding of the input of `kind` on `model` in round `round_number`.

        A model answered before gets the kept bits again, in the same round (an aggregator re-running
        it) or a later one (a round aborted, the model unchanged). Raises RefusedError (INPUT_BOUND) for a round
        answered with another model (a model pushed one ulp away) and for an answer whose bits are no
        longer kept (only the latest of each kind is); PermanentFailureError for a round older than the
        latest answered, and for no record past the first round.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown input kind {kind!r}; one of {', '.join(KINDS)}")
        if self._latest is not None and round_number < self._latest:
            # A replayed round's sum could be subtracted from one already revealed; an aggregator serving
            # it has finished this federation or gone back, and waiting will not change that.
            raise PermanentFailureError(
                FEDERATION_PAST, latest=self._latest, federation=self.federation, path=self.path, served=round_number
            )
        if self._first_asked is None:
            self._first_asked = round_number
        # A process that began with no record may go on past round 1 only if it was there from the start
        # (it may have withdrawn from every round so far, which keeps nothing).
        if self._latest is None and not self.found and not self.reset and self._first_asked > 1:
            raise PermanentFailureError(
                LOCAL_STATE_LOST, path=self.path, evidence=f"the aggregator is at round {round_number}"
            )
        key = f"{kind}:{model}"
        entry = self._inputs.get(key)
        for other, answered in self._inputs.items():
            if other != key and other.startswith(f"{kind}:") and answered.round == round_number:
                raise RefusedError(
                    Refusal.INPUT_BOUND,
                    f"round {round_number} ({kind}) was already answered for another model (kept in "
                    f"{self.path}); a second answer for the same round could be subtracted from the first",
                )
        kept = None
        if entry is not None:
            kept = self._read_kept(kind, key)
            if kept is None and entry.round is not None:
                raise RefusedError(
                    Refusal.INPUT_BOUND,
                    f"this {kind} model was answered in round {entry.round}, and its bits are no longer kept (a "
                    "later answer replaced them, or the file was lost); answering again would send new bits",
                )
            if entry.round is not None and round_number > entry.round:
                # An aborted round leaves the model as it was, so the next round may carry it again: it gets
                # the same bits, bound to the same survivors (and the session binds every party to this model).
                entry.round = round_number
                self._latest = max(round_number, self._latest or round_number)
                self._save()
        cached = self._views.get(key)
        if cached is not None:
            cached.kept = cached.kept or kept
            return cached

        def bind(survivors: frozenset[str]) -> None:
            answered = self._inputs.setdefault(key, _Input(round_number))
            answered.round, answered.survivors = round_number, survivors
            self._latest = max(round_number, self._latest or round_number)
            self._save()

        def keep(answer: Kept) -> None:
            self._write_kept(kind, key, round_number, answer)
            self._inputs.setdefault(key, _Input(round_number)).round = round_number
            self._latest = max(round_number, self._latest or round_number)
            if kind == "train" and answer.vector is not None:
                self._trainings += 1
            self._save()
            view.kept = answer

        view = self._views[key] = SignedView(None if entry is None else entry.survivors, bind, kept, keep)
        return view

    def note_threshold(self, round_number: int, c: float) -> None:
        """Remember the threshold c of a training round's model (kept with the next save)."""
        self._thresholds[round_number] = float(c)


def _release(entry: dict[str, object], steps: int = 1) -> distributed.Release:
    """A ledger entry as the release it charged (`steps` times)."""
    return distributed.Release(
        str(entry["mechanism"]),
        float(entry["mu"]),  # type: ignore[arg-type]
        float(entry["l1"]),  # type: ignore[arg-type]
        float(entry["l2"]),  # type: ignore[arg-type]
        float(entry.get("sampling_rate", 1.0)),  # type: ignore[arg-type]
        steps,
    )


def _composed(entries: list[dict[str, object]], delta: float) -> float:
    """The epsilon at `delta` of `entries` composed by RDP.

    Identical releases (every training round of a run) are one release of as many steps, so a long ledger
    composes in one pass per kind.
    """
    if not entries:
        return 0.0
    groups: dict[tuple[object, ...], tuple[dict[str, object], int]] = {}
    for entry in entries:
        key = (entry["mechanism"], entry["mu"], entry["l1"], entry["l2"], entry.get("sampling_rate", 1.0))
        first, steps = groups.get(key, (entry, 0))
        groups[key] = (first, steps + 1)
    releases = [_release(first, steps) for first, steps in groups.values()]
    addon = math.fsum(float(entry.get("addon", 0.0)) for entry in entries)  # type: ignore[arg-type]
    return distributed.epsilon(releases, delta - addon)


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} = {value!r} is not a round count")
    return value


def _names(names: object) -> frozenset[str]:
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ValueError("a survivor set is not a list of names")
    return frozenset(names)
