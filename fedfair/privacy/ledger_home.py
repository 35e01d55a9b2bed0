"""Where an institution's ledgers live, and how a site's folder knows the ledger it charged is the one it finds.

An institution's ledgers live outside any site's folder (``$FEDFAIR_LEDGER_DIR``, else the user's state folder),
named by site and data digest: a moved or copied folder, or a re-exported table, opens the same ledger, and copies
of a folder on one machine share it. Beside its config a site keeps a link (``NAME.ledger-link.json``: lineage,
generation, head of the ledger it last charged); a ledger that is missing, another, rolled back or diverged
from it, or a table that shares no row with the one it charged, is refused naming the fix (starting again is the
operator's reset). A table that changed but shares people continues (:mod:`fedfair.privacy.ledger_people`).

Why: docs/design.md, "Inside the privacy library"; the threat model: docs/security.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write, read_json
from fedfair.privacy.ledger import Ledger, data_digest

LEDGER_DIR_VARIABLE = "FEDFAIR_LEDGER_DIR"
"""The environment variable that names the folder of an institution's ledgers."""

LINK_FORMAT = "fedfair-ledger-link"
LINK_VERSION = 1
_LINK_KEYS = frozenset(("format", "version", "site", "data", "ledger", "lineage", "count", "head"))
_RESET_FIX = (
    "or, if it is lost for good, start again on purpose: `fedfair collaborator reset-ledger --config FILE "
    '--reason "..." --confirm` (kept in the ledger)'
)


def ledger_folder() -> Path:
    """The folder of this institution's ledgers: ``$FEDFAIR_LEDGER_DIR``, else the user's state folder."""
    named = os.environ.get(LEDGER_DIR_VARIABLE)
    if named:
        return Path(named).expanduser().absolute()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "fedfair" / "ledgers"


def link_path(folder: Path, site: str) -> Path:
    """Where `site`'s folder notes the ledger it last charged: ``folder/NAME.ledger-link.json``."""
    return folder / f"{site}.ledger-link.json"


@dataclass(frozen=True)
class Link:
    """What a site's folder last charged: the ledger's data digest, file, lineage, generation and head."""

    data: str
    ledger: str
    lineage: str
    count: int
    head: str


def read_link(path: Path, site: str) -> Link | None:
    """The link at `path`, or None when there is none.

    Raises:
        ConfigError: the file is damaged or edited, naming it and the fix.
    """
    if not path.exists():
        return None
    fix = f"delete {path} only if this folder never charged a noised input; else restore it from a backup"
    document = read_json(path, fix)
    if not isinstance(document, dict) or set(document) != _LINK_KEYS or document["format"] != LINK_FORMAT:
        raise ConfigError(f"{path} is not a {LINK_FORMAT} file; {fix}")
    count = document["count"]
    texts = [document[key] for key in ("data", "ledger", "lineage", "head")]
    if document["site"] != site or isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigError(f"{path}: its site or count is not this site's ({site}); {fix}")
    if not all(isinstance(text, str) for text in texts):
        raise ConfigError(f"{path}: its data, ledger, lineage or head is not a text; {fix}")
    data, ledger, lineage, head = map(str, texts)
    return Link(data, ledger, lineage, count, head)


def write_link(path: Path, ledger: Ledger) -> None:
    """Note in `path` the ledger a site's folder has just charged (or opened)."""
    document = {
        "format": LINK_FORMAT,
        "version": LINK_VERSION,
        "site": ledger.site,
        "data": data_digest(ledger.identity),
        "ledger": str(ledger.path),
        "lineage": ledger.lineage,
        "count": ledger.count_all,
        "head": ledger.head,
    }
    payload = json.dumps(document, indent=1).encode()
    atomic_write(path, lambda stream: stream.write(payload))


def check_link(link: Link, ledger: Ledger, where: Path) -> None:
    """Refuse `ledger` unless it continues what the site's folder (`where`, its link) last charged.

    When the table changed since, the ledger the folder charged must be one of `ledger`'s people
    (:meth:`Ledger.peers`), and is the one checked.

    Raises:
        ConfigError: the table shares no rows with the one charged, or the ledger charged is missing, another
            lineage, rolled back or diverged.
    """
    if link.count == 0:
        return  # nothing charged from this folder yet
    said = f"{where} notes {link.count} entries charged to the ledger {link.ledger} (lineage {link.lineage[:12]}...)"
    charged = ledger.path.with_name(Path(link.ledger).name)
    if not charged.is_file():
        raise ConfigError(
            f"{said}, but there is none at {charged}: its ledger folder moved or is another. Point "
            f"{LEDGER_DIR_VARIABLE} at the folder that holds it, or move it to {charged.parent}; {_RESET_FIX}"
        )
    if link.data != data_digest(ledger.identity):
        if not any(peer.file == charged.name for peer in ledger.peers()):
            raise ConfigError(
                f"{said} for a table that shares no row with the one [data] names now ({ledger.identity}): if these "
                "are other people, start their ledger on purpose: `fedfair collaborator reset-ledger --config FILE "
                '--reason "..." --confirm` (kept in the ledger; the old spend stays in the old ledger); else put the '
                "table back as it was"
            )
        ledger = Ledger.read(charged)
    if ledger.lineage != link.lineage:
        raise ConfigError(
            f"{said}, but {ledger.path} is another ledger (lineage {ledger.lineage[:12]}...): it was replaced. "
            f"Put back the ledger of lineage {link.lineage[:12]}... (from {link.ledger} or a backup); {_RESET_FIX}"
        )
    if ledger.head_at(link.count) != link.head:
        state = "holds fewer" if ledger.count_all < link.count else "holds other entries at that generation"
        raise ConfigError(
            f"{said}, but {ledger.path} {state} ({ledger.count_all} entries): it was rolled back, or it is a copy "
            "that charged on its own while this folder charged another, and its epsilon understates what was "
            f"spent. Put back the ledger this folder charged (from {link.ledger} or a backup); {_RESET_FIX}"
        )


def former_ledgers(folder: Path, site: str) -> Iterator[Path]:
    """`site`'s ledgers of before in its config's `folder`: version 1 files, keyed by the table's path."""
    for path in sorted(folder.glob(f"{site}.*.ledger.json")):
        try:
            document = json.loads(path.read_bytes())
        except (OSError, ValueError):
            document = None  # damaged: Ledger(...) then names what is wrong with it
        if not isinstance(document, dict) or document.get("version") == 1:
            yield path


def take_over_former(ledger: Ledger, former: Path, same_data: Callable[[Mapping[str, object]], bool]) -> int | None:
    """Continue the version 1 ledger `former` in `ledger` and set it aside; how many releases came, or None.

    None (and `former` left as it is) when `same_data` says the data it names is not `ledger`'s. Set aside as
    ``FILE.taken-over``, so that it is taken over once.

    Raises:
        ConfigError: `former` is damaged or edited, naming it and the entry.
    """
    old = Ledger(former, ledger.site, None)
    if not same_data(old.identity):
        return None
    taken = ledger.take_over(old)
    former.rename(former.with_name(f"{former.name}.taken-over"))
    return taken
