"""An aggregator that keeps one site's upload in the bounded mode (issue 93) against real processes: no total.

A three-site federation under ``input_bound = "two_verifiers"`` (threshold 2, so a bounded total must cover at least
two accepted sites), with ``fedfair auditor start`` and three ``fedfair collaborator start`` processes over loopback
mutual TLS. fedfair's aggregator runs in a thread (:class:`~attacks.pinned_federation.LoopAggregator`) with its
verifier rewritten: it keeps only site-a's SHARE upload each round and drops the others' unread, so the auditor is
asked to total site-a alone. Before issue 93 that total was formed (site-a's exact update, 109 of 109 words) and
applied. Rows:

- the auditor honest: it withdraws at round 1's TOTAL naming BELOW_FLOOR and the floor, no sum of site-a alone is
  formed, no round applies, and no site keeps a bundle;
- the auditor without its floor (a colluding auditor, its ``check_floor`` removed in its own process) and the
  aggregator's own floor removed, the verdict record sent to every site: each site's own check refuses round 1
  (``aggregate-refused`` BELOW_FLOOR, exit 2), and no round applies.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attacks.federation import plan_sections
from attacks.rewrites import rewritten
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from attacks.site_processes import run_sites
from attacks.target_site import THREE
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.local.processes import FEDFAIR_COMMAND
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.record import VerdictRecord
from fedfair.secagg.bounded.upload import LeaderUpload, SealedSeed
from fedfair.secagg.bounded.verifying import RoundVerifier

AUDITOR = "audit-co"
ROUNDS = 2
PROCESS_SECONDS = 180.0
REFUSED = "round 1 STAGE_BOUNDED_TOTAL: withdrawing from the round: BELOW_FLOOR"
LENIENT = (
    "import sys; from fedfair.cli import main; from fedfair.secagg.bounded.context import BoundedContext; "
    "BoundedContext.check_floor = lambda *_: None; sys.exit(main(['auditor', 'start', *sys.argv[1:]]))"
)
"""The auditor without its floor: `fedfair auditor start` with BoundedContext.check_floor made to pass anything."""


def bounded_floor_rows(where: Path, book: RowBook) -> None:
    """The rows of this module (see the module's notes): the auditor honest, then without its floor."""
    for lenient in (False, True):
        bounded_floor_row(where / ("lenient" if lenient else "honest"), book, lenient=lenient)


def bounded_workspace(root: Path) -> Workspace:
    """Three sites, the auditor's certificate, the manifest pinning it and the plan, the mode declared."""
    sections = plan_sections(
        secure=True,
        rounds=ROUNDS,
        quorum=2,
        timeout=30.0,
        training={"local_steps": 1},
        # The plan's update_norm (1000) at 11 fractional bits puts B^2 near 2^42, inside the 52-bit field's limit.
        secure_aggregation={"fractional_bits": 11},
    )
    return make_workspace(root, THREE, plan=sections, manifest=True, auditor=AUDITOR)


def auditor_command(workspace: Workspace, *, lenient: bool) -> list[str]:
    """`fedfair auditor start` for AUDITOR (without its floor when `lenient`), dialling the workspace's aggregator."""
    certs = workspace.certs
    start = [sys.executable, "-c", LENIENT] if lenient else [*FEDFAIR_COMMAND, "auditor", "start"]
    return [
        *start,
        *("--cert", str(certs / f"{AUDITOR}.crt"), "--key", str(certs / f"{AUDITOR}.key")),
        *("--ca", str(certs / "ca.crt"), "--manifest", str(workspace.root / "manifest.toml")),
        *("--aggregator", workspace.address, "--folder", str(workspace.root / AUDITOR)),
    ]


def keeping_site_a(*, to_all: bool) -> dict[str, object]:
    """The aggregator's verifier rewritten to keep only site-a's share (with `to_all`, to send its record to all)."""
    receive_upload, record = RoundVerifier.receive_upload, RoundVerifier.record

    def kept_if_site_a(verifier: RoundVerifier, upload: LeaderUpload | SealedSeed) -> None:
        if upload.party == min(verifier.context.parties):  # site-a, the roster's first; the others' dropped unread
            receive_upload(verifier, upload)

    def to_every_site(verifier: RoundVerifier) -> VerdictRecord:
        made = record(verifier)
        verifier.present = verifier.context.parties  # whom the server sends the record to: every site
        return made

    return {"receive_upload": kept_if_site_a, **({"record": to_every_site} if to_all else {})}


def bounded_floor_row(where: Path, book: RowBook, *, lenient: bool) -> None:
    """One federation under the aggregator keeping site-a's share; the auditor honest or (`lenient`) without floor."""
    auditor_words = "the auditor without its floor, the record sent to every site" if lenient else "the auditor honest"
    expected = (
        "every site (3 real processes) refuses round 1's record (aggregate-refused BELOW_FLOOR, exit 2); no round "
        "applies"
        if lenient
        else "the auditor withdraws at round 1's TOTAL naming BELOW_FLOOR and the floor of 2: no sum of site-a "
        "alone is formed, no round applies, no site keeps a bundle"
    )
    with book.row(
        f"bounded floor: the aggregator keeps only site-a's SHARE upload each round (threshold 2 of 3 sites), "
        f"{auditor_words}",
        expected,
        PATCHED_AGGREGATOR,
    ) as row:
        workspace = bounded_workspace(where)
        floorless = {"check_floor": lambda _context, _accepted, _who: None} if lenient else {}
        with rewritten(RoundVerifier, **keeping_site_a(to_all=lenient)), rewritten(BoundedContext, **floorless):
            run = run_sites(
                workspace, lambda loop: None, PROCESS_SECONDS, {AUDITOR: auditor_command(workspace, lenient=lenient)}
            )
        statuses = run.statuses
        refused = [line[:200] for line in run.lines[AUDITOR] if REFUSED in line]
        refusals = {name: next((line for line in run.lines[name] if "aggregate-refused" in line), "") for name in THREE}
        said = {  # the refusal's round and reason, where it names round 1 and BELOW_FLOOR; else its first words
            name: "round 1, BELOW_FLOOR" if "round 1:" in line and "BELOW_FLOOR" in line else line[:120]
            for name, line in refusals.items()
        }
        output = load_aggregator_plan(workspace.plan).aggregator.output
        applied = [entry["round"] for entry in read_round_log(output) if entry["status"] == "applied"]
        bundles = [name for name in THREE if any(workspace.configs[name].parent.glob("*model_bundle*"))]
        if lenient:
            handled = all(status == 2 for status in statuses.values()) and all(
                words == "round 1, BELOW_FLOOR" for words in said.values()
            )
        else:
            handled = bool(refused) and "fewer than the plan's threshold of 2" in refused[0]
        row.record(
            f"the auditor said {refused[:1] or 'nothing of a floor'}; sites' exit statuses {statuses}; sites said "
            f"{said}; rounds applied {applied}; bundles kept by {bundles}; {run.seconds:.1f} s",
            handled and not applied and not bundles,
            rounds_applied=len(applied),
        )
