"""What a site keeps of a bounded round between SHARE and DECIDE, so that a restart does not take its answer away.

A framed site clears itself only with the part it sent the aggregator and the share it sealed to the auditor
(:class:`~fedfair.secagg.bounded.peers.Settlement`). It keeps them, with the round's public parameters, in
``NAME.FEDERATION.bounded_settlement``: written atomically before its parts leave, 0600 (the two shares together are
its update), one round at a time, and removed once that round ends for the site, however it ends
(:func:`drop_settlement`). It is used where a participant that lost its round state is still handed that round's
DECIDE: a process restarted after its SHARE upload, which the aggregator hands the round's DECIDE while that stage is
open (DECIDE is :attr:`~fedfair.secagg.round.StageSpec.rejoinable`).

Why: docs/security.md, "A framed site".
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from fedfair.core.errors import ProtocolError, Refusal, RefusedError
from fedfair.core.files import atomic_write
from fedfair.runtime.collaborator.steps import Participant
from fedfair.secagg.bounded.peers import BoundedSite, Settlement
from fedfair.secagg.codec import Reader, Writer

SETTLEMENT_SUFFIX = "bounded_settlement"
"""A site's kept settlement is NAME.FEDERATION.bounded_settlement, in its folder."""


@dataclass(frozen=True)
class KeptRound:
    """What a site kept of the bounded round it last shared in.

    round: the round; public: its public parameters, as SHARE received them; settlement: the site's part and share.
    """

    round: int
    public: bytes
    settlement: Settlement


def settlement_path(me: Participant) -> Path | None:
    """Where this site keeps its settlement: beside its config, or None without a folder (nothing kept)."""
    if me.folder is None:
        return None
    return settlement_file(me.folder, me.name, me.shared.federation_id)


def settlement_file(folder: Path, name: str, federation_id: str) -> Path:
    """Where site `name` keeps its settlement of federation `federation_id` in `folder` (its config's)."""
    return folder / f"{name}.{federation_id}.{SETTLEMENT_SUFFIX}"


def keep_settlement(me: Participant, round_number: int, public: bytes, site: BoundedSite) -> None:
    """Keep what `site` needs past SHARE of round `round_number`, replacing any earlier round's (mode 0600).

    Raises:
        OSError: the write failed (a full disk), naming the file; the parts must then not leave.
        ProtocolError: `site` has not shared.
    """
    path = settlement_path(me)
    if path is None:
        return
    data = Writer().u64(round_number).blob(public).blob(site.settlement().to_bytes()).getvalue()
    atomic_write(path, lambda stream: stream.write(data))  # its temporary file is made 0600, and the rename keeps it


def kept_round(me: Participant) -> KeptRound | None:
    """The round this site last kept a settlement of, or None where it keeps none.

    Raises:
        RefusedError: reason :attr:`Refusal.WITHDRAWN` when the file is damaged, or other users may read it (its
            mode is looser than 0600, as :func:`fedfair.pki.store.load_private_key` refuses a key), naming it.
    """
    path = settlement_path(me)
    if path is None or not path.exists():
        return None
    mode = stat.S_IMODE(path.stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        # It holds the site's exact update: one exposed is not taken up, so that the loosening is seen, not lived with.
        raise RefusedError(
            Refusal.WITHDRAWN,
            f"{path} is readable by other users (mode {mode:04o}) and holds this site's update: this site does not "
            f"take up the round it shared before its restart; check who could read it, and keep such a file 0600 "
            f"(`chmod 600 {path}`)",
        )
    try:
        reader = Reader(path.read_bytes())
        kept = KeptRound(reader.u64(), reader.blob(), Settlement.from_bytes(reader.blob()))
        reader.finish()
    except ProtocolError as error:
        raise RefusedError(
            Refusal.WITHDRAWN,
            f"{path} is damaged ({error}): this site cannot take up the round it shared before its restart; the "
            "file is rewritten at its next round",
        ) from None
    return kept


def drop_settlement(me: Participant, *, keeping: int | None = None) -> None:
    """Remove the kept settlement, unless it is of round `keeping`: its round ended for this site, answered or not.

    Called once the verdict record is answered, the round aborted or left, another round begun, the process ending,
    and (`keeping`: the round the federation is at) at a restarted process's first stage task. A damaged file goes.
    Unlinking is enough, with no overwrite first: the file is its owner's alone (0600), and what it holds, the
    update, is computed from the site's data and model on the same disk, which an overwrite would not take away from
    a reader of the raw disk.
    """
    path = settlement_path(me)
    if path is None or not path.exists():
        return
    if keeping is not None:
        try:
            kept = kept_round(me)
        except RefusedError:
            kept = None  # a damaged file answers no record: it goes
        if kept is not None and kept.round == keeping:
            return
    path.unlink(missing_ok=True)
