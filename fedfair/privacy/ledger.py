"""One institution's privacy ledger for one dataset, across every federation it answers in.

``NAME.DATA.ledger.json`` (DATA: the first 16 hex digits of :func:`data_digest`) holds every noised
release of that data with the federation that asked; the budget counts them all, and only the site's
operator starts it again (:meth:`Ledger.reset`, itself a kept entry). Each entry carries the SHA-256 of
the one before, the head the count and the last hash, and every value is range-checked on load, so an
edited or truncated ledger is refused naming the file and the entry. The chain has no secret: it catches
accidents and careless scripts, not someone who recomputes it.

Why: docs/design.md, "Inside the privacy library".
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedfair.core.errors import BudgetReason, ConfigError, PrivacyBudgetError
from fedfair.core.files import MAX_JSON_INTEGER, atomic_write, read_json
from fedfair.pki.names import FEDERATION_ID_RE
from fedfair.pki.roster import canonical_json
from fedfair.privacy import distributed

FORMAT = "fedfair-ledger"
VERSION = 1

CHARGED_KINDS = ("statistics", "train", "evaluate")
"""The kinds of noised input a ledger charges (a collaborator's record has the same kinds)."""

RESET = "reset"
"""The kind of the entry an operator's reset appends: what was spent before it no longer counts."""

MAX_MU = 2.0**64
"""The largest Skellam mu an entry may hold: calibration never goes past 2^60, and noise of a
larger variance would wrap the widest (64-bit) secure sum."""

MAX_TEXT = 256
"""The longest model digest, federation id or reset reason an entry may hold."""

_CHARGE_KEYS = frozenset(
    ("kind", "federation", "round", "model", "mechanism", "mu", "l1", "l2", "sampling_rate", "addon", "delta", "prev")
)
_OPTIONAL_KEYS = frozenset(("prev", "rounding"))
"""Keys a charge may lack: the chain's link before it is appended, and the rounding a release averages over (only
when charged in expectation, :attr:`fedfair.privacy.distributed.Release.rounding`)."""
_RESET_KEYS = frozenset(("kind", "reason", "at", "spent", "prev"))
_HEAD_KEYS = frozenset(("format", "version", "site", "data", "count", "head", "entries"))

_FIX = (
    "restore it from a backup; if it is lost for good, `fedfair collaborator reset-ledger --config FILE "
    '--reason "..." --confirm` starts it again (logged), accepting that what was spent is no longer counted'
)

Entry = dict[str, object]


@dataclass(frozen=True)
class Charge:
    """One fresh noised input to charge: its kind, round and model, the release it makes, and at what delta.

    `addon` is the delta the release's rounding and wraps use up, taken off before the RDP conversion.
    """

    kind: str
    round: int
    model: str
    release: distributed.Release
    delta: float
    addon: float = 0.0


def data_digest(identity: Mapping[str, object]) -> str:
    """SHA-256 (hex) of a dataset's identity (what names its records), in canonical JSON."""
    return hashlib.sha256(canonical_json(dict(identity))).hexdigest()


def ledger_path(folder: Path, site: str, identity: Mapping[str, object]) -> Path:
    """Where `site` keeps the ledger of the data `identity` names: ``folder/NAME.DATA.ledger.json``."""
    return folder / f"{site}.{data_digest(identity)[:16]}.ledger.json"


def entry_hash(entry: Mapping[str, object]) -> str:
    """SHA-256 (hex) of an entry's canonical bytes: what the next entry's ``prev`` must be."""
    return hashlib.sha256(canonical_json(dict(entry))).hexdigest()


class Ledger:
    """The privacy spent by one site's data: every noised release, whichever federation asked, hash-chained."""

    def __init__(self, path: Path, site: str, identity: Mapping[str, object]) -> None:
        """Load the ledger at `path` (of `site` and the data `identity` names), or start an empty one.

        Raises:
            ConfigError: the file is damaged, edited, truncated or of other data, naming the file and the entry.
        """
        self.path = path
        self.site = site
        self.identity = dict(identity)
        self._entries: list[Entry] = []
        self.found = path.exists()
        """Whether the ledger was on disk when it was opened (else it starts empty)."""
        if self.found:
            self._load()

    # ------------------------------------------------------------ what it says

    @property
    def genesis(self) -> str:
        """The ``prev`` of the first entry: the hash of the site and the data the ledger is for."""
        return hashlib.sha256(canonical_json({"format": FORMAT, "site": self.site, "data": self.identity})).hexdigest()

    @property
    def resets(self) -> int:
        """How many times the operator has started the ledger again."""
        return sum(entry["kind"] == RESET for entry in self._entries)

    def entries(self) -> list[Entry]:
        """Every entry, oldest first (resets included), as copies."""
        return [dict(entry) for entry in self._entries]

    def releases(self, federation: str | None = None) -> list[Entry]:
        """The charged releases since the last reset, of one `federation` or (None) of all."""
        last = max((index for index, entry in enumerate(self._entries) if entry["kind"] == RESET), default=-1)
        return [
            dict(entry)
            for entry in self._entries[last + 1 :]
            if entry["kind"] != RESET and (federation is None or entry["federation"] == federation)
        ]

    def count(self, federation: str) -> int:
        """How many releases `federation` ever charged here, resets or not (what its record must not exceed)."""
        return sum(entry["kind"] != RESET and entry["federation"] == federation for entry in self._entries)

    def spent(self, delta: float, federation: str | None = None) -> float:
        """The epsilon at `delta` of the releases since the last reset (of one `federation`, or all) composed."""
        return composed(self.releases(federation), delta)

    # ------------------------------------------------------------ changing it

    def charge(self, federation: str, charge: Charge, budget: float) -> float:
        """Charge one fresh input of `federation` (one step of its release) and persist it, before it is sent.

        Returns:
            The epsilon at `delta` spent so far with it, over every federation since the last reset.

        Raises:
            PrivacyBudgetError: reason :attr:`BudgetReason.ANSWER_REFUSED`, charging nothing, when the composed
                epsilon would pass `budget`; the message names what was spent where.
        """
        release, delta = charge.release, charge.delta
        entry: Entry = {
            "kind": charge.kind,
            "federation": federation,
            "round": charge.round,
            "model": charge.model,
            "mechanism": release.mechanism,
            "mu": release.mu,
            "l1": release.l1,
            "l2": release.l2,
            "sampling_rate": release.sampling_rate,
            "addon": charge.addon,
            "delta": delta,
        }
        if release.rounding:
            entry["rounding"] = release.rounding
        _check_charge(entry)
        with self._locked():
            earlier = self.releases()
            total = composed([*earlier, entry], delta)
            if total <= budget:
                self._append([entry])
        if total > budget:
            raise PrivacyBudgetError(
                BudgetReason.ANSWER_REFUSED,
                f"answering round {charge.round} ({charge.kind}) of federation {federation} would spend epsilon "
                f"{total:.3g} at delta {delta:g}, past this institution's budget of {budget:g} for this data; spent "
                f"so far: epsilon {composed(earlier, delta):.3g} on {_spent_on(earlier)} (kept in {self.path}); only a "
                "larger [privacy] budget in a new plan (and in this institution's own [privacy] budget_epsilon, "
                "where set) lets it answer more",
            )
        return total

    def fold(self, federation: str, releases: Iterable[Mapping[str, object]]) -> int:
        """Add the releases a federation's record kept before ledgers were per dataset; return how many.

        Each is range-checked as it would be on load; none is added when the ledger already holds an entry of
        `federation` (it was folded before).
        """
        entries: list[Entry] = []
        for index, release in enumerate(releases):
            # Records of before sampling and rounding were charged wrote neither key: 1 and 0 are what they meant.
            entry: Entry = {"sampling_rate": 1.0, "addon": 0.0, **release, "federation": federation}
            try:
                _check_charge(entry)
            except ValueError as error:
                raise ConfigError(f"release {index} of federation {federation}: {error}") from None
            entries.append(entry)
        with self._locked():
            if self.count(federation) > 0 or not entries:
                return 0
            self._append(entries)
        return len(entries)

    def reset(self, reason: str) -> float:
        """The operator's reset: append an entry that ends the spend so far; return the epsilon it had.

        The entries before it stay (and stay chained): the reset is on the record, with its reason and time.
        """
        reason = reason.strip()
        if not reason or len(reason) > MAX_TEXT:
            raise ConfigError(f"a ledger reset needs a reason of 1 to {MAX_TEXT} characters, e.g. --reason 'new data'")
        with self._locked():
            releases = self.releases()
            delta = max((float(entry["delta"]) for entry in releases), default=1e-5)  # type: ignore[arg-type]
            spent = composed(releases, delta)
            at = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
            self._append([{"kind": RESET, "reason": reason, "at": at, "spent": spent}])
        return spent

    # ------------------------------------------------------------ persistence

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the ledger's lock file and read the ledger again: a change starts from what is on disk now.

        Two processes of one site (two federations at once) share the ledger; without this each would write
        its own entries over the other's, and a charge would be lost.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path.with_name(f"{self.path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            if self.path.exists():
                self._load()
            yield
        finally:
            os.close(descriptor)  # closing releases the lock

    def _append(self, entries: list[Entry]) -> None:
        """Chain `entries` onto the ledger and write it atomically (all of them or none)."""
        chained = list(self._entries)
        previous = entry_hash(chained[-1]) if chained else self.genesis
        for entry in entries:
            linked = {**entry, "prev": previous}
            chained.append(linked)
            previous = entry_hash(linked)
        document = {
            "format": FORMAT,
            "version": VERSION,
            "site": self.site,
            "data": self.identity,
            "count": len(chained),
            "head": previous,
            "entries": chained,
        }
        payload = json.dumps(document, indent=1, allow_nan=False).encode()
        atomic_write(self.path, lambda stream: stream.write(payload))
        self._entries = chained

    def _load(self) -> None:
        document = read_json(self.path, _FIX)
        where = f"privacy ledger {self.path}"
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ConfigError(f"{where} is not a {FORMAT} file; {_FIX}")
        if set(document) != _HEAD_KEYS:
            raise ConfigError(f"{where}: {_keys_problem(document, _HEAD_KEYS)}; {_FIX}")
        if document["version"] != VERSION:
            raise ConfigError(f"{where}: version {document['version']!r}, this fedfair reads {VERSION}; {_FIX}")
        if document["site"] != self.site or document["data"] != self.identity:
            raise ConfigError(
                f"{where} is the ledger of {document['site']!r} for the data {document['data']!r}, not of "
                f"{self.site!r} for {self.identity!r}; put back the file that was at this path"
            )
        entries = document["entries"]
        if not isinstance(entries, list):
            raise ConfigError(f"{where}: entries is not a list; {_FIX}")
        previous = self.genesis
        for index, entry in enumerate(entries):
            try:
                if not isinstance(entry, dict):
                    raise ValueError("not a JSON object")
                if entry.get("prev") != previous:
                    raise ValueError(
                        "its prev is not the hash of the entry before it: an entry before it was removed, "
                        "inserted or edited"
                    )
                _check_reset(entry) if entry.get("kind") == RESET else _check_charge(entry)
            except ValueError as error:
                raise ConfigError(f"{where}: entry {index}: {error}; {_FIX}") from None
            previous = entry_hash(entry)
        if document["count"] != len(entries) or document["head"] != previous:
            raise ConfigError(
                f"{where}: the head records {document['count']!r} entries ending in {str(document['head'])[:16]}..., "
                f"but the file holds {len(entries)} ending in {previous[:16]}...: entries were removed from the end, "
                f"or the last one edited; {_FIX}"
            )
        self._entries = entries


# ---------------------------------------------------------------- composing and checking


def _release(entry: Mapping[str, object], steps: int = 1) -> distributed.Release:
    """A ledger entry as the release it charged (`steps` times)."""
    return distributed.Release(
        str(entry["mechanism"]),
        float(entry["mu"]),  # type: ignore[arg-type]
        float(entry["l1"]),  # type: ignore[arg-type]
        float(entry["l2"]),  # type: ignore[arg-type]
        float(entry["sampling_rate"]),  # type: ignore[arg-type]
        steps,
        rounding=int(entry.get("rounding", 0)),  # type: ignore[call-overload]
    )


def composed(entries: list[Entry], delta: float) -> float:
    """The epsilon at `delta` of charged `entries` composed by RDP (0 for none).

    Identical releases (every training round of a run) are one release of as many steps, so a long ledger
    composes in one pass per kind; every entry's `addon` (rounding and wraps) comes off the delta.
    """
    if not entries:
        return 0.0
    groups: dict[tuple[object, ...], tuple[Entry, int]] = {}
    for entry in entries:
        key = (entry["mechanism"], entry["mu"], entry["l1"], entry["l2"], entry["sampling_rate"], entry.get("rounding"))
        first, steps = groups.get(key, (entry, 0))
        groups[key] = (first, steps + 1)
    releases = [_release(first, steps) for first, steps in groups.values()]
    addon = math.fsum(float(entry["addon"]) for entry in entries)  # type: ignore[arg-type]
    return distributed.epsilon(releases, delta - addon)


def _spent_on(entries: list[Entry]) -> str:
    """'3 train answers in fed-a, 1 evaluate answers in fed-b', or 'nothing'."""
    counted: dict[tuple[str, str], int] = {}
    for entry in entries:
        key = (str(entry["kind"]), str(entry["federation"]))
        counted[key] = counted.get(key, 0) + 1
    return ", ".join(f"{n} {kind} answers in {federation}" for (kind, federation), n in sorted(counted.items()))


def _keys_problem(entry: Mapping[str, object], expected: frozenset[str]) -> str:
    missing, extra = sorted(expected - set(entry)), sorted(set(entry) - expected)
    said = [f"missing {', '.join(missing)}"] * bool(missing) + [f"unknown {', '.join(extra)}"] * bool(extra)
    return "; ".join(said)


def _number(entry: Mapping[str, object], key: str, low: float, high: float, *, open_low: bool = False) -> float:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key} = {value!r} is not a finite number")
    if value < low or value > high or (open_low and value == low):
        raise ValueError(f"{key} = {value!r} is outside {'(' if open_low else '['}{low:g}, {high:g}]")
    return float(value)


def _text(entry: Mapping[str, object], key: str) -> str:
    value = entry[key]
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise ValueError(f"{key} = {value!r} is not a text of 1 to {MAX_TEXT} characters")
    return value


def _check_charge(entry: Mapping[str, object]) -> None:
    """Every key of a charged release present and in range; raises ValueError naming the first that is not."""
    present = _OPTIONAL_KEYS & set(entry)
    if set(entry) - present != _CHARGE_KEYS - _OPTIONAL_KEYS:
        raise ValueError(_keys_problem(entry, _CHARGE_KEYS - _OPTIONAL_KEYS | present))
    if entry["kind"] not in CHARGED_KINDS:
        raise ValueError(f"kind = {entry['kind']!r} is not one of {', '.join((*CHARGED_KINDS, RESET))}")
    if not FEDERATION_ID_RE.fullmatch(_text(entry, "federation")):
        raise ValueError(f"federation = {entry['federation']!r} is not a federation id")
    round_number = entry["round"]
    if isinstance(round_number, bool) or not isinstance(round_number, int) or not 0 <= round_number <= MAX_JSON_INTEGER:
        raise ValueError(f"round = {round_number!r} is not a round number")
    _text(entry, "model")
    if entry["mechanism"] not in distributed.MECHANISMS:
        raise ValueError(f"mechanism = {entry['mechanism']!r} is not one of {', '.join(distributed.MECHANISMS)}")
    _number(entry, "mu", 0.0, MAX_MU, open_low=True)
    _number(entry, "l1", 0.0, math.inf)
    _number(entry, "l2", 0.0, math.inf)
    _number(entry, "sampling_rate", 0.0, 1.0, open_low=True)
    rounding = entry.get("rounding", 1)
    if isinstance(rounding, bool) or not isinstance(rounding, int) or not 1 <= rounding <= MAX_JSON_INTEGER:
        raise ValueError(f"rounding = {rounding!r} is not a count of coordinates")
    delta = _number(entry, "delta", 0.0, 1.0, open_low=True)
    if delta == 1.0:
        raise ValueError("delta = 1 is not below 1")
    addon = _number(entry, "addon", 0.0, 1.0)
    if addon >= delta:
        raise ValueError(f"addon = {addon!r} is not below delta = {delta!r}")


def _check_reset(entry: Mapping[str, object]) -> None:
    """A reset entry: its reason, its time and the spend it ended; raises ValueError naming what is wrong."""
    if set(entry) != _RESET_KEYS:
        raise ValueError(_keys_problem(entry, _RESET_KEYS))
    _text(entry, "reason")
    try:
        dt.datetime.fromisoformat(_text(entry, "at"))
    except ValueError:
        raise ValueError(f"at = {entry['at']!r} is not an ISO time") from None
    _number(entry, "spent", 0.0, math.inf)
