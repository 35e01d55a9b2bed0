"""One institution's privacy ledger for one dataset, across every federation it answers in.

``NAME.DATA.ledger.json`` (DATA: the first 16 hex digits of :func:`data_digest`) holds every noised
release of that data with the federation that asked; the budget counts them all, and only the site's
operator starts it again (:meth:`Ledger.reset`, itself a kept entry). Each entry carries the SHA-256 of
the one before, the head the count and the last hash, and every value is range-checked on load: an edited
or truncated ledger is refused naming the file and the entry (the chain has no secret: it catches accidents).

A ledger has a lineage and a home: a copy is refused, a moved one kept (:mod:`fedfair.privacy.ledger_home`);
its spend counts the other ledgers of its people too (:mod:`fedfair.privacy.ledger_people`).

Why: docs/design.md, "Inside the privacy library".
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedfair.core.errors import BudgetReason, ConfigError, PrivacyBudgetError
from fedfair.core.files import atomic_write, read_json
from fedfair.pki.roster import canonical_json
from fedfair.privacy import distributed
from fedfair.privacy.ledger_entries import (
    CHARGED_KINDS,
    MAX_TEXT,
    RESET,
    Entry,
    check_charge,
    check_reset,
    composed,
    keys_problem,
    spent_on,
)

__all__ = [
    "CHARGED_KINDS",
    "RESET",
    "Charge",
    "Ledger",
    "Peer",
    "composed",
    "data_digest",
    "entry_hash",
    "ledger_path",
]

FORMAT = "fedfair-ledger"
LOCK_FILE = "ledgers.lock"
"""The ledger folder's lock: every change to a ledger there is made holding it."""

VERSION = 2
"""Version 2 adds the lineage, the home and the ledgers it took over (``formerly``); a version 1 file (keyed by
the table's path, beside the site's config) is read only to be taken over (:meth:`Ledger.take_over`)."""

_HEAD_KEYS = {
    1: frozenset(("format", "version", "site", "data", "count", "head", "entries")),
    2: frozenset(("format", "version", "site", "data", "lineage", "home", "formerly", "count", "head", "entries")),
}

_FIX = (
    "restore it from a backup; if it is lost for good, `fedfair collaborator reset-ledger --config FILE "
    '--reason "..." --confirm` starts it again (logged), accepting that what was spent is no longer counted'
)


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


@dataclass(frozen=True)
class Peer:
    """Another ledger of the institution that holds some of a ledger's people: its lineage, file and entries."""

    lineage: str
    file: str
    entries: tuple[Entry, ...]
    rows: int
    """How many of the ledger's (distinct) rows it holds."""
    others: tuple[distributed.Release, ...] = ()
    """What its table spent by other mechanisms: its site's own DP-SGD steps."""
    matched: bool = True
    """Whether its rows were matched; False: its rows file is gone, and it is taken to hold every row."""

    def counted(self, cut: int) -> list[Entry]:
        """Its charged releases since its last reset, and from entry `cut` on (what a reset elsewhere left)."""
        last = max((index for index, entry in enumerate(self.entries) if entry["kind"] == RESET), default=-1)
        start = max(last + 1, cut)
        return [dict(entry) for entry in self.entries[start:] if entry["kind"] != RESET]


People = tuple[list[Peer], list[frozenset[int]]]
"""The ledgers that share a ledger's people, and each group of its rows as the set of them (by index) it is in."""


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

    def __init__(
        self, path: Path, site: str, identity: Mapping[str, object] | None, *, read_only: bool = False
    ) -> None:
        """Load the ledger at `path` (of `site` and the data `identity` names), or start an empty one.

        `identity` None reads a version 1 ledger of whatever data it names, to be taken over (:meth:`take_over`).
        A ledger moved from its home is written at once with its new home, unless `read_only` (another
        ledger read for its spend, :meth:`read`: neither rewritten nor refused as a copy).

        Raises:
            ConfigError: the file is damaged, edited, truncated, of other data, or a copy of a ledger still at its
                home, naming the file, the entry or the fix.
        """
        self.path = Path(os.path.abspath(path))
        self.site = site
        self.identity = dict(identity or {})
        self.lineage = uuid.uuid4().hex
        """This ledger's random id, drawn when it starts (a copy has the same)."""
        self.formerly: list[Entry] = []
        """The ledgers it took over: their file names, data and when."""
        self.on_write: Callable[[Ledger], None] | None = None
        """Called after each write (the site's folder notes what it charged, :mod:`fedfair.privacy.ledger_home`)."""
        self.people: Callable[[], People] | None = None
        """The other ledgers of its people, read again at each use (:mod:`fedfair.privacy.ledger_people`)."""
        self.others: Callable[[], list[distributed.Release]] | None = None
        """What its data spent by other mechanisms (its site's own DP-SGD steps), read again at each use."""
        self._entries: list[Entry] = []
        self._version = VERSION if identity is not None else 1
        self.found = self.path.exists()
        """Whether the ledger was on disk when it was opened (else it starts empty)."""
        if self.found and self._load(refuse_copy=not read_only) and not read_only:
            with self._locked():
                self._append([])  # moved: it now lives here, so a copy of it elsewhere is told from it

    @classmethod
    def read(cls, path: Path) -> Ledger:
        """The ledger at `path` as it stands, whatever site and data it is of, to count its spend; written never.

        Raises:
            ConfigError: the file is damaged or edited, naming it, the entry and the fix.
        """
        document = read_json(path, _FIX)
        head = document if isinstance(document, dict) else {}
        site, data = head.get("site"), head.get("data")
        if head.get("version") != VERSION or not isinstance(site, str) or not isinstance(data, dict):
            raise ConfigError(f"privacy ledger {path} is not a version {VERSION} {FORMAT} file; {_FIX}")
        return cls(path, site, data, read_only=True)

    # ------------------------------------------------------------ what it says

    @property
    def genesis(self) -> str:
        """The ``prev`` of the first entry: the hash of the site and the lineage (version 1: the data)."""
        if self._version == 1:
            head: Entry = {"format": FORMAT, "site": self.site, "data": self.identity}
        else:
            head = {"format": FORMAT, "site": self.site, "lineage": self.lineage}
        return hashlib.sha256(canonical_json(head)).hexdigest()

    @property
    def count_all(self) -> int:
        """How many entries it holds, resets included: its generation."""
        return len(self._entries)

    @property
    def head(self) -> str:
        """The hash of its last entry (its genesis when it has none)."""
        return entry_hash(self._entries[-1]) if self._entries else self.genesis

    def head_at(self, count: int) -> str | None:
        """The hash its head had when it held `count` entries, or None if it never held that many."""
        if count > len(self._entries):
            return None
        return entry_hash(self._entries[count - 1]) if count else self.genesis

    @property
    def names(self) -> set[str]:
        """Its file name and those of the ledgers it took over (what a federation's record may name)."""
        return {self.path.name, *(str(former["file"]) for former in self.formerly)}

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
        """The epsilon at `delta` of the releases since the last reset composed.

        Of one `federation` here, or (None) of all, with those of the other ledgers of its people, for the row that
        belongs to the most of them.
        """
        if federation is not None:
            return composed(self.releases(federation), delta)
        own, mine = self.releases(), self.own_others()
        return max(composed([*shared, *own], delta, [*others, *mine]) for shared, others in self._groups())

    def own_others(self) -> list[distributed.Release]:
        """What its data spent by other mechanisms (its site's own DP-SGD steps); none when not known."""
        return self.others() if self.others is not None else []

    def peers(self) -> list[Peer]:
        """The other ledgers that hold some of its people (none when its people are not known)."""
        return self.people()[0] if self.people is not None else []

    def shared_releases(self) -> list[list[Entry]]:
        """For each group of its rows that belong to the same other ledgers, what those charged that counts here.

        A release of another ledger counts from that ledger's last reset on, and from where this ledger's own last
        reset (the operator's word that these are new people) left it. One empty list when it shares no one.
        """
        return [shared for shared, _ in self._groups()]

    def _groups(self) -> list[tuple[list[Entry], list[distributed.Release]]]:
        """:meth:`shared_releases`, each with the DP-SGD steps of the other tables of that group (never reset)."""
        if self.people is None:
            return [([], [])]
        peers, groups = self.people()
        last = next((entry for entry in reversed(self._entries) if entry["kind"] == RESET), {})
        cut: Mapping[str, int] = last.get("shared", {})  # type: ignore[assignment]
        counted = [peer.counted(cut.get(peer.lineage, 0)) for peer in peers]
        return [
            (
                [entry for index in sorted(group) for entry in counted[index]],
                [release for index in sorted(group) for release in peers[index].others],
            )
            for group in groups
        ] or [([], [])]

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
        check_charge(entry)
        with self._locked():
            earlier, mine = self.releases(), self.own_others()
            groups = self._groups()
            total = max(composed([*shared, *earlier, entry], delta, [*others, *mine]) for shared, others in groups)
            if total <= budget:
                self._append([entry])
        if total > budget:
            before = max(composed([*shared, *earlier], delta, [*others, *mine]) for shared, others in groups)
            elsewhere = max(len(shared) for shared, _ in groups)
            steps = sum(release.steps for release in mine) + max(sum(r.steps for r in others) for _, others in groups)
            also = f" and {elsewhere} releases of other ledgers of the same people" if elsewhere else ""
            also += f" and {steps} DP-SGD steps on these people" if steps else ""
            raise PrivacyBudgetError(
                BudgetReason.ANSWER_REFUSED,
                f"answering round {charge.round} ({charge.kind}) of federation {federation} would spend epsilon "
                f"{total:.3g} at delta {delta:g}, past this institution's budget of {budget:g} for this data; spent "
                f"so far: epsilon {before:.3g} on {spent_on(earlier)}{also} (kept in {self.path}); only a "
                "larger [privacy] budget in a new plan (and in this institution's own [privacy] budget_epsilon, "
                "or target_epsilon where it sets no budget_epsilon) lets it answer more",
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
                check_charge(entry)
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

        The entries before it stay (and stay chained): the reset is on the record, with its reason and time. It
        ends what the other ledgers of its people charged so far too (they are taken to be other people), noting
        each one's entry count; what they charge later counts here again.
        """
        reason = reason.strip()
        if not reason or len(reason) > MAX_TEXT:
            raise ConfigError(f"a ledger reset needs a reason of 1 to {MAX_TEXT} characters, e.g. --reason 'new data'")
        with self._locked():
            releases = [*self.releases(), *(entry for shared in self.shared_releases() for entry in shared)]
            delta = max((float(entry["delta"]) for entry in releases), default=1e-5)  # type: ignore[arg-type]
            spent = self.spent(delta)
            at = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
            entry: Entry = {"kind": RESET, "reason": reason, "at": at, "spent": spent}
            peers = [peer for peer in self.peers() if peer.entries]
            if peers:
                entry["shared"] = {peer.lineage: len(peer.entries) for peer in peers}
            self._append([entry])
        return spent

    def take_over(self, former: Ledger) -> int:
        """Continue `former` (a version 1 ledger, keyed by a path) here; return how many releases came in.

        Into an empty ledger every entry comes, resets included. Into one that holds entries (another copy of
        the site's folder took over its own first) come the releases of each federation it holds none of: a
        release is never lost, at worst counted twice. `former` is noted in :attr:`formerly` either way.
        """
        at = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
        with self._locked():
            held = {str(entry["federation"]) for entry in self._entries if entry["kind"] != RESET}
            if self._entries:
                taken = [entry for entry in former.releases() if str(entry["federation"]) not in held]
            else:
                taken = former.entries()
            self.formerly.append({"file": former.path.name, "data": former.identity, "at": at})
            self._append([{key: value for key, value in entry.items() if key != "prev"} for entry in taken])
        return sum(entry["kind"] != RESET for entry in taken)

    # ------------------------------------------------------------ persistence

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the ledger folder's lock file and read the ledger again: a change starts from what is on disk now.

        Two processes of one site (two federations at once) share the ledger; without this each would write
        its own entries over the other's, and a charge would be lost. The lock is the folder's, not the file's:
        a charge's budget check counts the other ledgers of the same people there, so two tables of the same
        people charged at once (each under a lock of its own) both passed a budget that fits one (8 of 8 tries).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path.parent / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            if self.path.exists():
                self._load()
            yield
        finally:
            os.close(descriptor)  # closing releases the lock

    def _append(self, entries: list[Entry]) -> None:
        """Chain `entries` onto the ledger and write it atomically (all of them or none)."""
        if self._version == 1:
            raise ConfigError(f"{self.path} is a ledger of before (version 1): take it over, do not write it")
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
            "lineage": self.lineage,
            "home": str(self.path),
            "formerly": self.formerly,
            "count": len(chained),
            "head": previous,
            "entries": chained,
        }
        payload = json.dumps(document, indent=1, allow_nan=False).encode()
        atomic_write(self.path, lambda stream: stream.write(payload))
        self._entries = chained
        if self.on_write is not None:
            self.on_write(self)

    def _load(self, *, refuse_copy: bool = True) -> bool:
        """Read the file; whether it was moved from its home (and so is to be written with its new one)."""
        document = read_json(self.path, _FIX)
        where = f"privacy ledger {self.path}"
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ConfigError(f"{where} is not a {FORMAT} file; {_FIX}")
        version = document.get("version")
        if version not in _HEAD_KEYS or (version == 1) != (self._version == 1):
            wanted = "1 (to be taken over)" if self._version == 1 else str(VERSION)
            raise ConfigError(f"{where}: version {version!r}, this fedfair reads {wanted} here; {_FIX}")
        if set(document) != _HEAD_KEYS[version]:
            raise ConfigError(f"{where}: {keys_problem(document, _HEAD_KEYS[version])}; {_FIX}")
        if self._version == 1 and isinstance(document["data"], dict):
            self.identity = dict(document["data"])
        if document["site"] != self.site or document["data"] != self.identity:
            raise ConfigError(
                f"{where} is the ledger of {document['site']!r} for the data {document['data']!r}, not of "
                f"{self.site!r} for {self.identity!r}; put back the file that was at this path"
            )
        moved = False
        if version == VERSION:
            lineage, home, formerly = document["lineage"], document["home"], document["formerly"]
            taken_over = isinstance(formerly, list) and all(
                isinstance(former, dict) and isinstance(former.get("file"), str) for former in formerly
            )
            if not isinstance(lineage, str) or not isinstance(home, str) or not taken_over:
                raise ConfigError(f"{where}: its lineage, home or formerly is not of its type; {_FIX}")
            self.lineage, self.formerly = lineage, formerly
            moved = not _same_file(Path(home), self.path)
            if moved and refuse_copy and _holds_lineage(Path(home), lineage):
                raise ConfigError(
                    f"{where} is a copy of the ledger at {home} (lineage {lineage[:12]}...): each copy could spend "
                    f"the budget on its own. Keep one: charge the one at {home} (point FEDFAIR_LEDGER_DIR at its "
                    f"folder) and delete this copy, or, if this copy is the one to keep, delete the one at {home}"
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
                check_reset(entry) if entry.get("kind") == RESET else check_charge(entry)
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
        return moved


def _same_file(home: Path, path: Path) -> bool:
    """Whether `home` names the file at `path` (the same path, or another spelling of it through a link)."""
    try:
        return home == path or os.path.samefile(home, path)
    except OSError:
        return False


def _holds_lineage(path: Path, lineage: str) -> bool:
    """Whether `path` holds a ledger of `lineage` (read loosely: a damaged copy is still a copy)."""
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and document.get("lineage") == lineage
