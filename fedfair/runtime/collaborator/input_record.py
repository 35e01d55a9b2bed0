"""One input per model, for good: what a collaborator answered, to whom, and the bits it sent.

Secure aggregation reveals the sum of one survivor set's inputs. Two sums that differ by
one site's input give that input away: the same round over survivors that differ by one
site, or the same survivors where one site sends something new (it was restarted, or was
pushed a model one ulp away so that it trained again). So a collaborator keeps, beside its
config, one record per federation (``NAME.FEDERATION.bindings.json``) and the latest
payload of each kind (``NAME.FEDERATION.KIND.kept.npz``), each written atomically *before*
anything derived from its data leaves; noised inputs are charged to the site's ledger
(:mod:`fedfair.privacy.ledger`), and the record counts those charges.

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedfair.core.errors import (
    ConfigError,
    PermanentFailureError,
    Refusal,
    RefusedError,
)
from fedfair.core.files import atomic_write, read_json
from fedfair.privacy.ledger import CHARGED_KINDS, Charge, Ledger
from fedfair.runtime.collaborator.stored_answer import StoredAnswer, answer_words, read_answer, write_answer
from fedfair.privacy.ledger_people import TABLE_KEY
from fedfair.runtime.failures import FEDERATION_PAST, LOCAL_STATE_LOST, TABLE_CHANGED

KINDS = CHARGED_KINDS
"""The kinds of input: the statistics before round 1 (round 0), a round's training and its evaluation."""

FORMAT = "fedfair-bindings"
VERSION = 4
"""Version 4 binds the site's data (:class:`BoundData`) at its first join; version 3 moves the privacy releases to the site's ledger (:mod:`fedfair.privacy.ledger`) and keeps
their count; version 2 files (each input's round, the kept payloads, the training count and thresholds,
the releases) are read and their releases folded into the ledger; version 1 files (survivor sets only)
are still read, their inputs' rounds unknown."""

_KEYS = {
    1: frozenset(("format", "latest", "inputs")),
    2: frozenset(("format", "version", "latest", "inputs", "kept", "trainings", "thresholds", "releases")),
    3: frozenset(
        ("format", "version", "latest", "inputs", "kept", "trainings", "thresholds", "charged", "resets", "ledger")
    ),
}
_KEYS[4] = _KEYS[3] | {"data"}
"""Every key of each version: a file with one missing or one more was edited, and is refused."""

_FIX = (
    "restore it (and the .kept.npz files beside it) from a backup; losing it would let the aggregator sum "
    "this institution's past inputs with new ones, so start afresh only for a new federation id, or pass "
    "--reset-state if you accept that"
)


@dataclass(frozen=True)
class BoundData:
    """This site's data as its record binds it.

    `identity` names its records (a table by its rows' fingerprint,
    :func:`~fedfair.runtime.collaborator.charges.data_identity`); `name` says it to an operator.
    """

    identity: dict[str, object]
    name: str


@dataclass
class SignedView:
    """The survivors (by name) this collaborator signed for one input, whichever session carried it.

    A round the aggregator re-runs (after a crash, or pretending one) carries the same
    input again; the collaborator then signs only the same survivor set, so no two
    unmasked sums differ by one party's input. `stored` is that input's bits when it was
    answered before (they are sent again); `keep` persists an answer before it is sent; `read_words` reads the
    kept words back a piece at a time (:func:`~fedfair.runtime.collaborator.stored_answer.answer_words`).
    """

    survivors: frozenset[str] | None = None
    bind_survivors: Callable[[frozenset[str]], None] = field(default=lambda survivors: None, repr=False)
    read_answer: Callable[[], StoredAnswer | None] = field(default=lambda: None, repr=False)
    keep: Callable[[StoredAnswer], None] = field(default=lambda kept: None, repr=False)
    read_words: Callable[[int], Iterator[np.ndarray]] = field(default=lambda span: _unkept(), repr=False)

    @property
    def stored(self) -> StoredAnswer | None:
        """The bits stored for this input, read from their file at each ask (RefusedError if it lost them), or None."""
        return self.read_answer()

    def bind(self, survivors: frozenset[str]) -> None:
        """Bind this input to `survivors` (kept on disk first, then remembered here)."""
        self.bind_survivors(survivors)
        self.survivors = survivors


def _unkept() -> Iterator[np.ndarray]:
    raise RefusedError(Refusal.WITHDRAWN, "this input's words were not kept on disk, so they cannot be tagged")


@dataclass
class _Input:
    round: int | None
    survivors: frozenset[str] | None = None


class InputRecord:
    """The record of one collaborator in one federation, loaded from and kept in ``path``."""

    def __init__(
        self,
        path: Path,
        federation: str = "",
        *,
        ledger: Ledger | None = None,
        reset: bool = False,
        data: BoundData | None = None,
    ) -> None:
        """Load the record at `path` (of federation `federation`) or start one.

        `ledger` is the site's ledger for its data, which every noised input is charged to; a record of
        before ledgers has its releases folded into it. Without one the record charges nothing (it is read
        to look at, or its federation is not noised). `reset` is the operator's word (``--reset-state``)
        that a lost record may start again past the first round. `data` is the site's data now: a record that
        bound other data refuses it (``table-changed``), whatever the plan charges; a record that bound none yet
        binds it at its next write.

        Raises:
            PermanentFailureError: ``table-changed``; ``local-state-lost`` (:meth:`check_accountant`).
            ConfigError: the record or the ledger is unreadable, or does not go with the other.
        """
        self.path = path
        self.federation = federation
        self.ledger = ledger
        self.reset = reset
        self._inputs: dict[str, _Input] = {}
        self._latest: int | None = None
        self._kept: dict[str, dict[str, object]] = {}
        self._trainings = 0
        self._thresholds: dict[int, float] = {}
        self._charged = 0
        """How many releases this record charged to the ledger: the ledger must hold at least as many of it."""
        self._resets = 0
        """The ledger's reset count when the record last wrote: more there means the operator reset it since."""
        self._ledger_name: str | None = None
        """The file name of the ledger this record charged to (its data's), None before any charge."""
        self._data: dict[str, object] | None = None
        """The identity of the data this record's inputs were of, bound at the first join (None before version 4)."""
        self._views: dict[str, SignedView] = {}
        self._first_asked: int | None = None
        """The first round this process was asked to answer."""
        self.found = path.exists()
        """Whether a record was on disk when this process started (else it starts one)."""
        if self.found:
            self._load()
        if data is not None:
            self._check_data(data)
        if ledger is not None:
            self._check_ledger(ledger)

    # ------------------------------------------------------------ persistence

    def _load(self) -> None:
        data = read_json(self.path, _FIX)
        try:
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("not a bindings file")
            version = data.get("version", 1)
            if version not in _KEYS or isinstance(version, bool):
                raise ValueError(f"version {version!r}, this fedfair reads 1 to {VERSION}")
            if set(data) - {"version"} != _KEYS[version] - {"version"}:
                missing, extra = sorted(_KEYS[version] - set(data)), sorted(set(data) - _KEYS[version] - {"version"})
                raise ValueError(f"a version {version} record with keys missing {missing} or unknown {extra}")
            latest = data["latest"]
            self._latest = None if latest is None else _count(latest, "latest")
            inputs = data["inputs"]
            if version == 1:
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
            if version == 2:
                releases = [dict(entry) for entry in data["releases"]]
            else:
                self._charged = _count(data["charged"], "charged")
                self._resets = _count(data["resets"], "resets")
                name = data["ledger"]
                if name is not None and not isinstance(name, str):
                    raise ValueError(f"ledger = {name!r} is not a file name")
                self._ledger_name = name
            if version >= 4:
                bound = data["data"]
                if bound is not None and not isinstance(bound, dict):
                    raise ValueError(f"data = {bound!r} is not a data identity")
                self._data = bound
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ConfigError(f"{self.path}: unreadable bindings ({error}); {_FIX}") from None
        if version == 2 and releases:
            self._fold(releases)

    def _fold(self, releases: list[dict[str, object]]) -> None:
        """Move a version 2 record's releases into the ledger (once), and write the record as version 3."""
        if self.ledger is None:
            raise ConfigError(
                f"{self.path} holds {len(releases)} privacy releases from before ledgers were kept per dataset; "
                "open it with the site's ledger (a collaborator or `fedfair collaborator ledger` does) to fold them in"
            )
        try:
            self.ledger.fold(self.federation, releases)
        except ConfigError as error:
            raise ConfigError(f"{self.path}: unreadable bindings ({error}); {_FIX}") from None
        self._charged = len(releases)
        self._resets, self._ledger_name = self.ledger.resets, self.ledger.path.name
        self._save()

    def _check_data(self, data: BoundData) -> None:
        """Refuse data other than the data this record bound; bind `data` when it bound none yet.

        Checked before the ledger: a changed table also opens another ledger, and this is the cause to name.
        """
        if self._data is None:
            self._data = data.identity
            return
        if self._data != data.identity:
            raise PermanentFailureError(
                TABLE_CHANGED,
                data=data.name,
                federation=self.federation,
                bound=_fingerprint(self._data),
                now=_fingerprint(data.identity),
            )

    def _check_ledger(self, ledger: Ledger) -> None:
        """Refuse a ledger that lost releases this record charged to it (lost or rolled back).

        A ledger the operator reset since this record last wrote is taken as it is: the reset is on its record.
        """
        if self._ledger_name is not None and self._ledger_name not in ledger.names:
            raise ConfigError(
                f"{self.path} charged federation {self.federation}'s releases to the ledger {self._ledger_name}, "
                f"but this institution's [data] now opens {ledger.path.name}: its data changed within a federation; "
                "put [data] back as it was, or take part with the new data in a new federation (`fedfair plan renew`)"
            )
        if ledger.resets > self._resets:
            self._charged, self._resets = ledger.count(self.federation), ledger.resets
            return
        held = ledger.count(self.federation)
        if held < self._charged:
            raise ConfigError(
                f"{self.path} charged {self._charged} releases of federation {self.federation} to the privacy ledger "
                f"{ledger.path}, which holds {held}: the ledger was lost, replaced or rolled back, so its epsilon "
                "would understate what this data has spent; restore it from the backup taken with the bindings, or "
                "if it is lost for good reset it explicitly (`fedfair collaborator reset-ledger`)"
            )

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
            "charged": self._charged,
            "resets": self._resets,
            "ledger": self._ledger_name,
            "data": self._data,
        }
        payload = json.dumps(document, indent=1).encode()
        atomic_write(self.path, lambda stream: stream.write(payload))

    def _answer_path(self, kind: str) -> Path:
        stem = self.path.name.removesuffix(".bindings.json")
        return self.path.with_name(f"{stem}.{kind}.kept.npz")

    def _read_answer(self, kind: str, key: str) -> StoredAnswer | None:
        """The kept bits of `key` (kind:model), or None if another answer replaced them or they are lost."""
        entry = self._kept.get(kind)
        if entry is None or entry.get("key") != key:
            return None
        return read_answer(self._answer_path(kind), str(entry.get("sha256")))

    def _write_answer(self, kind: str, key: str, round_number: int, kept: StoredAnswer) -> None:
        digest = write_answer(self._answer_path(kind), kept)
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

    def charge(self, charge: Charge, budget: float) -> float:
        """Charge one fresh input of this federation to the site's ledger, before it is kept and sent.

        The ledger is written first, then this record's count of its charges: a crash between them can only
        over-count.

        Returns:
            The epsilon at `delta` the data has spent so far with it, over every federation.

        Raises:
            PrivacyBudgetError: from :meth:`Ledger.charge`, charging nothing, past `budget`.
        """
        if self.ledger is None:
            raise ValueError(f"{self.path} was opened without the site's ledger, so it cannot charge a release")
        total = self.ledger.charge(self.federation, charge, budget)
        self._charged += 1
        self._resets, self._ledger_name = self.ledger.resets, self.ledger.path.name
        self._save()
        return total

    # ------------------------------------------------------------ answering

    def view(self, round_number: int, kind: str, model: str, *, one_round: bool = False) -> SignedView:
        """The binding of the input of `kind` on `model` in round `round_number`.

        A model answered before gets the kept bits again, in the same round (an aggregator re-running
        it) or a later one (a round aborted, the model unchanged). With `one_round` (the input is noised
        inside the secure sum and charged to the ledger, each one a release of its own), an input already
        signed for a survivor set in an earlier round is that round's alone: a later round on the same model
        gets a fresh input, free to be signed for other survivors, so one party leaving binds no later round
        (docs/security.md, "Verified aggregation"). Raises RefusedError (INPUT_BOUND) for a round
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
        key = self._key(round_number, kind, model, one_round)
        entry = self._inputs.get(key)
        for other, answered in self._inputs.items():
            if other != key and other.startswith(f"{kind}:") and answered.round == round_number:
                raise RefusedError(
                    Refusal.INPUT_BOUND,
                    f"round {round_number} ({kind}) was already answered for another model (kept in "
                    f"{self.path}); a second answer for the same round could be subtracted from the first",
                )
        if entry is not None:
            if self._read_answer(kind, key) is None and entry.round is not None:
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
            return cached

        def read_stored() -> StoredAnswer | None:  # none while another answer of its kind is the one kept
            answer = self._read_answer(kind, key)
            if answer is None and self._kept.get(kind, {}).get("key") == key:
                lost = f"this {kind} model's kept bits changed or were lost (in {self.path.parent})"
                raise RefusedError(Refusal.INPUT_BOUND, f"{lost}; answering again would send new bits")
            return answer

        def read_words(span: int) -> Iterator[np.ndarray]:
            entry = self._kept.get(kind, {})
            digest = str(entry.get("sha256")) if entry.get("key") == key else ""
            return answer_words(self._answer_path(kind), digest, span)

        def bind(survivors: frozenset[str]) -> None:
            answered = self._inputs.setdefault(key, _Input(round_number))
            answered.round, answered.survivors = round_number, survivors
            self._latest = max(round_number, self._latest or round_number)
            self._save()

        def keep(answer: StoredAnswer) -> None:
            self._write_answer(kind, key, round_number, answer)
            self._inputs.setdefault(key, _Input(round_number)).round = round_number
            self._latest = max(round_number, self._latest or round_number)
            if kind == "train" and (answer.vector is not None or answer.encoded is not None):
                self._trainings += 1
            self._save()

        self._views[key] = SignedView(None if entry is None else entry.survivors, bind, read_stored, keep, read_words)
        return self._views[key]

    def _key(self, round_number: int, kind: str, model: str, one_round: bool) -> str:
        """The record's key of the input of `kind` on `model` answered in `round_number` (see :meth:`view`).

        One input per model: ``KIND:MODEL``. With `one_round`, the latest input on the model is taken again
        unless it was signed for survivors in an earlier round; then this round's own, ``KIND:MODEL@ROUND``.
        """
        base = f"{kind}:{model}"
        if not one_round:
            return base
        own = [key for key in self._inputs if key == base or key.startswith(f"{base}@")]
        latest = max(own, key=lambda key: self._inputs[key].round or 0, default=None)
        if latest is None:
            return base
        entry = self._inputs[latest]
        if entry.survivors is not None and entry.round is not None and entry.round < round_number:
            return f"{base}@{round_number}"
        return latest

    def note_threshold(self, round_number: int, c: float) -> None:
        """Remember the threshold c of a training round's model (kept with the next save).

        The file's record of the c each round trained on, for the site's operator to check against the
        aggregator's round log; nothing this process sends depends on it.
        """
        self._thresholds[round_number] = float(c)


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} = {value!r} is not a round count")
    return value


def _names(names: object) -> frozenset[str]:
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ValueError("a survivor set is not a list of names")
    return frozenset(names)


def fold_records(ledger: Ledger, folder: Path, site: str) -> list[str]:
    """Fold into `ledger` the releases every record of `site` in `folder` kept before ledgers were per dataset.

    Each ``NAME.FEDERATION.bindings.json`` of version 2 with releases is read with the ledger, which folds them
    in once and writes it as version 3; returns the federations folded now. Their data is taken to be the
    site's data now: those records did not say which data they charged.
    """
    folded = []
    for path in sorted(folder.glob(f"{site}.*.bindings.json")):
        data = read_json(path, _FIX)
        if isinstance(data, dict) and data.get("version") == 2 and data.get("releases"):
            federation = path.name.removeprefix(f"{site}.").removesuffix(".bindings.json")
            InputRecord(path, federation, ledger=ledger)
            folded.append(federation)
    return folded


def _fingerprint(identity: dict[str, object]) -> str:
    """A data identity as an operator compares it: a table's fingerprint's first 16 hex digits, else its fields."""
    table = identity.get(TABLE_KEY)
    if isinstance(table, str):
        return table[:16]
    return json.dumps(identity, sort_keys=True)
