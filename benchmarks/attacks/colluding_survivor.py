"""One colluding survivor forging every sum (issue 79) against real collaborator processes: refused at round 1.

fedfair's aggregator runs in a thread (:class:`~attacks.pinned_federation.LoopAggregator`) with its secure-aggregation
server rewritten for every round: the unmasked sum is moved by ERROR on its first word, and the claim shows
the colluder's masked input moved by the same ERROR. That is the strongest claim a colluder can back: every
other masked input, every seed and every mask key is the true one, so the inputs shown re-sum to the forged
sum; only the colluder's input differs from the one whose digest the survivors signed at CONSISTENCY. The
server's own check of the tags is skipped, so it relays them all the same. Before the re-sum, a colluder's
tags covering the change passed every site (issue 79: 6 forged sums of 6 verified). Three real ``fedfair
collaborator start`` processes follow it; the colluder is one of them (whatever it reports, the others decide
for themselves). Expected: every site exits 2 with ``aggregate-refused`` naming round 1 and FORGED, its record
counting round 1 alone (its masked input went into the refused sum), the aggregator applies no round and no
site keeps a bundle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from attacks.broken_chain import Federation, run_federation
from attacks.rewrites import rewritten
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.secagg.server import AggregateResult, Server
from fedfair.secagg.verify_messages import AggregateClaim

ERROR = 1 << 12
"""What the forged sum adds to its first word: a few thousandths of a coordinate, inside every bound."""
COLLUDER = 3
"""The colluding survivor's party id (site-c of the three)."""


@contextmanager
def forging_every_sum() -> Iterator[None]:
    """Rewrite :class:`Server` (this process's aggregator only) so every round's sum is forged and backed."""
    finish, claim = Server.finish, Server.claim

    def forged_finish(server: Server) -> AggregateResult:
        server.running_sum[0] += server.running_sum.dtype.type(ERROR)
        return finish(server)

    def backed_claim(server: Server) -> AggregateClaim:
        shown = claim(server)
        inputs = list(shown.inputs)
        index = server.survivors.index(COLLUDER)
        moved = inputs[index].copy()
        moved[0] += moved.dtype.type(ERROR)
        inputs[index] = moved
        return replace(shown, inputs=tuple(inputs))

    def relayed_anyway(server: Server) -> bool:
        return True

    with rewritten(Server, finish=forged_finish, claim=backed_claim, tags_add_up=relayed_anyway):
        yield


def untouched(federation: Federation) -> Callable[[RoundLoop], None]:
    """The round loop as it is: the attack lives in the server's steps."""
    return lambda loop: None


def colluding_survivor_rows(root: Path, book: RowBook) -> None:
    """One row: a federation of three site processes under a forger backed by one colluder (about 30 s)."""
    with book.row(
        f"colluding survivor: every round's sum moved by {ERROR} on one word and the claim shows the colluder's "
        "masked input moved to match (the other inputs, seeds and mask keys true), tags relayed unchecked",
        "every site (3 real processes) re-sums the inputs its signed view fixes and exits 2 with aggregate-refused "
        "naming round 1 and FORGED, counts only round 1 (whose sum holds its masked input), keeps no bundle; the "
        "aggregator applies no round",
        PATCHED_AGGREGATOR,
    ) as row:
        with forging_every_sum():
            seen: dict[str, Any] = run_federation(root / "colluding-survivor", untouched)
        row.record(
            f"exit statuses {seen['statuses']}; said {seen['said']}; refusals {seen['refusals']}; rounds each record "
            f"counts {seen['counts']}; bundles kept {seen['bundles']}; rounds the aggregator applied "
            f"{seen['applied']}; {seen['seconds']:.1f} s",
            all(status == 2 for status in seen["statuses"].values())
            and all("aggregate-refused: round 1:" in line for line in seen["said"].values())
            and all(found == (1, "FORGED") for found in seen["refusals"].values())
            and all(found == 1 for found in seen["counts"].values())
            and not any(seen["bundles"].values())
            and not seen["applied"],
            forged_sums_verified=sum(found != (1, "FORGED") for found in seen["refusals"].values()),
        )
