"""Which of an institution's ledgers are of the same people: keyed digests of each table's rows, matched on overlap.

A ledger is of one exact table (:func:`fedfair.privacy.ledger.ledger_path`), but its people outlive the table: a
re-export with a row added, removed or corrected, a column renamed, or the same table under another site name, is
mostly the same people. Beside each table's ledger its folder keeps ``NAME.DATA.rows``: 64-bit BLAKE2b digests, keyed
by the folder's ``people.key`` (32 bytes from the OS's CSPRNG), of each distinct row's spellings
(:func:`fedfair.runtime.collaborator.table_fingerprint.table_rows`), never a row. A row is another ledger's when any
of its spellings is there; each row is charged the composition over every ledger it belongs to, and a ledger's
epsilon is its most charged row's (:meth:`fedfair.privacy.ledger.Ledger.spent`). Only the operator's reset says a
table is new people. Two people with identical rows (or cells) match too: an over-count, never an under-count.

Why: docs/security.md, "One budget per dataset".
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write
from fedfair.privacy.distributed import Release
from fedfair.privacy.ledger import Ledger, People, Peer

OthersOf = Callable[[Path], list[Release]]
"""The DP-SGD steps (as releases) the accountant at a path holds: none when there is none."""

TABLE_KEY = "table_rows_sha256"
"""The key of a table's fingerprint in a ledger's data identity: only a table's ledger has rows to match."""

KEY_FILE = "people.key"
"""The folder's key of its row digests: without it no digest can be matched to a row, nor computed again."""

KEY_BYTES = 32
ROWS_FORMAT = b"fedfair-rows 1 "
"""A rows file: this, the key's id (16 hex digits) and a newline, then the sorted digests, 8 bytes each."""

_KEY_FIX = (
    f"put back the {KEY_FILE} this folder's ledgers were made with (from a backup of the ledger folder); without "
    "it no table can be matched to the people these ledgers charged"
)


def people_key(folder: Path) -> bytes:
    """The folder's key of row digests, drawn from the OS's CSPRNG the first time (readable by its owner only).

    Raises:
        ConfigError: the key file is not a key, naming it and the fix.
    """
    path = folder / KEY_FILE
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        # A file of its own (mkstemp: unique, 0600), linked whole: a key another process or thread linked first is
        # the one kept, and a key once linked is never written again.
        descriptor, drawn = tempfile.mkstemp(prefix=f".{KEY_FILE}.", dir=folder)
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(os.urandom(KEY_BYTES))
        try:
            os.link(drawn, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(drawn)
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise ConfigError(f"{path} holds {len(key)} bytes, not a {KEY_BYTES}-byte key; {_KEY_FIX}")
    return key


def key_id(key: bytes) -> str:
    """16 hex digits that name `key` (a rows file made with another key cannot be matched)."""
    return hashlib.sha256(b"fedfair people key " + key).hexdigest()[:16]


def row_digests(rows: Iterable[Sequence[str]], key: bytes) -> np.ndarray:
    """The keyed digests (uint64) of `rows`' spellings, one row of the result per distinct row, sorted.

    Each of `rows` is one table row in every spelling it is matched in (all rows spelled alike).
    """
    table = list(rows)
    spelled = [spelling for row in table for spelling in row]
    digests = np.fromiter(
        (int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8, key=key).digest(), "little") for text in spelled),
        dtype=np.uint64,
        count=len(spelled),
    )
    return np.unique(digests.reshape(-1, len(table[0]) if table else 1), axis=0)


def rows_path(ledger: Path) -> Path:
    """Where the row digests of the ledger at `ledger` (``NAME.DATA.ledger.json``) are kept: ``NAME.DATA.rows``."""
    return ledger.with_name(ledger.name.removesuffix(".ledger.json") + ".rows")


def write_rows(path: Path, digests: np.ndarray, key: bytes) -> None:
    """Keep `digests` (:func:`row_digests`) at `path`, atomically: every spelling's, sorted and distinct."""
    payload = ROWS_FORMAT + key_id(key).encode() + b"\n" + np.unique(digests).astype("<u8").tobytes()
    atomic_write(path, lambda stream: stream.write(payload))


def read_rows(path: Path, key: bytes) -> np.ndarray:
    """The sorted row digests kept at `path`.

    Raises:
        ConfigError: the file is damaged, or made with another key, naming it and the fix.
    """
    data = path.read_bytes()
    head, _, body = data.partition(b"\n")
    if not head.startswith(ROWS_FORMAT) or len(body) % 8:
        raise ConfigError(
            f"{path} is not a fedfair rows file (the digests of a ledger's rows); restore it from a backup of the "
            "ledger folder, or delete it and open that ledger's table again (`fedfair collaborator ledger`)"
        )
    if head.removeprefix(ROWS_FORMAT).decode(errors="replace") != key_id(key):
        raise ConfigError(f"{path} was made with another {KEY_FILE} than {path.parent / KEY_FILE}; {_KEY_FIX}")
    return np.frombuffer(body, dtype="<u8").astype(np.uint64)


def overlaps(own: Path, digests: np.ndarray, key: bytes) -> Iterator[tuple[Path, np.ndarray]]:
    """Each other rows file in `own`'s folder (`own`: a ledger's path) that holds some of `digests`, with which.

    Yields the rows file and, for each row of `digests` (:func:`row_digests`), whether any of its spellings is there.

    Raises:
        ConfigError: a rows file of the folder is damaged or of another key, naming it and the fix.
    """
    mine = rows_path(own)
    for path in sorted(own.parent.glob("*.rows")):
        if path == mine:
            continue
        inside = np.any(np.isin(digests, read_rows(path, key)), axis=1, keepdims=False)
        if inside.any():
            yield path, inside


def groups(memberships: list[np.ndarray]) -> list[frozenset[int]]:
    """The distinct sets of others (by index) the rows belong to, from each other's membership of every row."""
    if not memberships:
        return [frozenset()]
    patterns = np.unique(np.stack(memberships, axis=1), axis=0)
    return [frozenset(int(index) for index in np.flatnonzero(pattern)) for pattern in patterns]


def state_path(ledger: Path) -> Path:
    """Where the DP-SGD accountant of the ledger at `ledger`'s table is kept: ``NAME.DATA.privacy.json``."""
    return ledger.with_name(ledger.name.removesuffix(".ledger.json") + ".privacy.json")


def sharing(own: Path, digests: np.ndarray, key: bytes, others_of: OthersOf | None = None) -> People:
    """The other ledgers in `own`'s folder that hold some of `digests` (its rows), and its rows' groups among them.

    Each group is the set of those ledgers (by index) that one or more of its rows belong to; rows in none make the
    empty group. With `others_of`, each carries its table's DP-SGD steps too (read from its accountant's path). A
    rows file whose table charged nothing yet (no ledger, no accountant) is skipped; a table's charged ledger with
    no rows file, or its DP-SGD accountant alone, is taken to hold every row (``matched`` False), never skipped.

    Raises:
        ConfigError: a rows file or ledger of the folder is damaged or of another key, naming it and the fix.
    """
    peers: list[Peer] = []
    memberships: list[np.ndarray] = []
    for ledger_file in _rowless(own):
        # A table that charged but whose rows file is gone (deleted, or charged before rows files were kept) may
        # hold any of these people: counted as holding them all, so that losing a rows file can only over-count,
        # until that table is opened again or the operator's reset says these are other people.
        peer = _peer(ledger_file, len(digests), others_of, matched=False)
        if peer is not None:
            peers.append(peer)
            memberships.append(np.ones(len(digests), dtype=bool))
    for path, inside in overlaps(own, digests, key):
        ledger_file = path.with_name(path.name.removesuffix(".rows") + ".ledger.json")
        peer = _peer(ledger_file, int(inside.sum()), others_of, matched=True)
        if peer is not None:
            peers.append(peer)
            memberships.append(inside)
    return peers, groups(memberships)


def _peer(ledger_file: Path, rows: int, others_of: OthersOf | None, *, matched: bool) -> Peer | None:
    """The ledger at `ledger_file` (or its table's DP-SGD accountant alone) as a peer holding `rows` of the rows.

    None when that table charged nothing.
    """
    others = tuple(others_of(state_path(ledger_file))) if others_of is not None else ()
    if ledger_file.is_file():
        ledger = Ledger.read(ledger_file)
        return Peer(ledger.lineage, ledger_file.name, tuple(ledger.entries()), rows, others, matched)
    if others:
        name = state_path(ledger_file).name
        return Peer(f"(DP-SGD only) {name}", name, (), rows, others, matched)
    return None


def _rowless(own: Path) -> list[Path]:
    """The ledger paths of the other tables in `own`'s folder that charged and have no rows file.

    Charged: a ledger's entry or a DP-SGD step.
    """
    folder = own.parent
    accountants = [path.with_name(path.name.removesuffix(".privacy.json") + ".ledger.json")
                   for path in folder.glob("*.privacy.json")]  # fmt: skip
    return [
        ledger_file
        for ledger_file in sorted({*folder.glob("*.ledger.json"), *accountants})
        if ledger_file != own
        and not rows_path(ledger_file).exists()
        and (_charged_table(ledger_file) or _charged_table(state_path(ledger_file)))
    ]


def _charged_table(path: Path) -> bool:
    """Whether the file at `path` (a ledger or an accountant) is of a table and holds a charge, or is damaged.

    A damaged file is read next by :meth:`Ledger.read` or the accountant, which name the damage and the fix.
    """
    try:
        document = json.loads(path.read_bytes())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    if not isinstance(document, dict):
        return True
    if path.name.endswith(".ledger.json") and document.get("version") == 1:
        return False  # a ledger of before, keyed by a path: taken over by its own table's ledger
    data = document.get("data")
    return not isinstance(data, dict) or (
        TABLE_KEY in data and bool(document.get("entries") or document.get("history"))
    )


def keep_rows(ledger: Path, rows: Iterable[Sequence[str]]) -> tuple[np.ndarray, bytes]:
    """The digests of `rows` (a table's rows, each in its spellings) under the folder's key, and the key; kept.

    Kept beside `ledger` (the path of that table's ledger, whether or not it exists yet), so that any later table
    of the same people finds them, whether or not this one ever charges.

    Raises:
        ConfigError: the folder's key is not a key, naming it and the fix.
    """
    key = people_key(ledger.parent)
    digests = row_digests(rows, key)
    kept = rows_path(ledger)
    # Kept again when it holds fewer digests than the table's spellings: a rows file of before held one spelling.
    if not kept.exists() or read_rows(kept, key).size < np.unique(digests).size:
        write_rows(kept, digests, key)
    return digests, key


def know_people(ledger: Ledger, rows: Iterable[Sequence[str]], others_of: OthersOf | None = None) -> None:
    """Let `ledger` count the other ledgers of its people (:func:`sharing`, at each use); `rows`: its table's rows.

    With `others_of` (the DP-SGD steps an accountant's path holds, none when there is none), it counts its own
    table's DP-SGD steps and those of the other tables of its people too: one figure for every mechanism.

    Raises:
        ConfigError: the folder's key is not a key, naming it and the fix.
    """
    digests, key = keep_rows(ledger.path, rows)
    ledger.people = functools.partial(sharing, ledger.path, digests, key, others_of)
    if others_of is not None:
        ledger.others = functools.partial(others_of, state_path(ledger.path))
