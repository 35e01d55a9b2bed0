"""The attack suite: hostile clients against a real federation on loopback, one row per attack.

It starts the real aggregator (an OS process, mutual TLS) and honest collaborators, and
attacks them from a client written from ``proto/fedfair.proto`` alone
(``benchmarks/attacks/hostile_client.py``: the generated protobuf/gRPC modules, grpc,
cryptography, numpy and the standard library, never fedfair's collaborator or transport
code), so what holds, holds against code that is not ours:

- transport and identity: no certificate, a foreign CA, an expired certificate, the
  wrong role, an unlisted name; replays (old round, future round, another federation or
  stage); random bytes, oversize messages, chunk gaps, duplicates and disagreements;
- plain updates: NaN, Inf, 1e30, just outside clip x weight, weights 0, negative, NaN
  and above max_weight, the wrong length;
- denial of service: 50 task streams opened and cancelled in a loop, and a flood of TCP
  connections that never handshake, each while an honest GetPlan is timed;
- status reports (the Report RPC): malformed, cut short and oversized, another federation
  or a round not yet started, an unknown status, NaN / negative / infinite / huge epsilon,
  a report carrying another collaborator's name, and a flood past the rate limit; each
  refused or taken as the certified caller's own, as ``events.jsonl`` shows;
- secure aggregation (six stages): impersonation, an unsigned advertisement, a mutated
  certificate inside one, replayed keys, garbage share ciphertexts (the hostile client),
  a corrupt unmask share and withheld unmask shares (a patched collaborator);
- a cheating aggregator (fedfair's own, its relay patched): equivocation about who
  survived, and a Sybil roster; the honest collaborators must refuse;
- consent and pins (``benchmarks/attacks/consent.py``): a plan naming a model factory
  (refused before import by a collaborator holding a pinned manifest and by one whose
  manifest is a roster only), a plan unlike the pinned one (the evaluation grid, the
  masking graph), a model bundle naming a factory (``fedfair predict`` without
  ``--allow-factory``), differencing (round r with every site, round r + 1 on the same
  model without one, the collaborators restarted in between), a survivor set below
  the manifest's ``min_round_size``, the statistics sum read for rare values and re-run
  without one site, and the review's evaluation queries (a crafted model on a grid of the
  aggregator's choosing; one model evaluated twice, once without a site); each beside a
  control run where the honest path works;
- bounded influence (``benchmarks/attacks/influence.py``): a collaborator claiming weight 1e6
  (plain: its uploads refused; secure: the round void) and one at the bound (its agreed
  weight, an update of L2 norm exactly ``update_norm`` toward a model that flips every
  prediction: accepted, refused at 1.05 times the bound, its damage measured beside an honest
  run and a site poisoning its own labels); a DP collaborator on neighbouring datasets
  (300 and 299 rows, 300 declared) whose weight at the aggregator must not differ, and one
  refusing a plan without ``[influence] sizes``;
- crashes: the aggregator killed with SIGKILL in each stage of a round, then resumed
  with ``--resume``: the final model must be the uninterrupted run's, bit for bit;
- one input per model and limits from the pinned plan (``benchmarks/attacks/record.py``): round 2 re-run
  on the same model across restarts, a 1-ulp model pushed to one site, a deleted record and a deleted
  privacy ledger, a 2 GiB input announced, 20,000 TRAIN tasks against a 3-round plan;
- noise (``benchmarks/attacks/noise.py``, issue 41): under ``[privacy]`` the decoded evaluation of a crafted
  model, its 1-ulp per-site difference, composition counts (a cell and its complement) and training
  differencing under dropouts, each measured against the exact answer in units of the noise the aggregator
  states, with the epsilon each site's ledger charged; their forged models (a c of the aggregator's choosing,
  round 2 on M + 1 ulp) refused by every site (issue 65's model chain);
- plan (``benchmarks/attacks/plan_values.py``, issue 51, items 3 and 8): the decoded noise of a plan whose
  masking degree is every other site, against what the ledger charges; every odd number of a served plan;
- ledger (``benchmarks/attacks/ledger.py``, issue 51): a renewed federation's answers charged on top of the
  first's spend, a revoked certificate refused at the aggregator's handshake, an edited ledger refused;
- the outcome (``benchmarks/attacks/outcome.py``, issue 51): a final bundle of another federation and one with a
  weight moved one ulp, each refused by a collaborator process counting its rounds from its own record;
- rotation (``benchmarks/attacks/rotation.py``, issue 65): a key revoked and rotated while the federation
  runs (a CA-signed manifest update): the old key in 0 later rounds, the re-keyed site finishing every round;
- the chain's doors (``benchmarks/attacks/broken_chain.py``, issue 79): a backdoored initial model, a skipped round
  then a forged model, every site restarted then a forged model: each refused or sat out at its first round;
- figures (``benchmarks/attacks/forged_figures.py``, issue 79): a forged evaluation sum and a forged evaluation
  figure: every site refuses, naming the first forged round, and keeps no bundle;
- a colluding survivor (``benchmarks/attacks/colluding_survivor.py``, issue 79): every sum forged, the claim showing
  the colluder's masked input moved to match: every site re-sums and refuses round 1 (FORGED);
- leaving (``benchmarks/attacks/leaving.py``, issue 79): a site killed before its VERIFY upload under
  distributed noise: its round aborts, every later one applies without it;
- a bounded total of one site (``benchmarks/attacks/bounded_floor.py``, issue 93): the aggregator keeps only
  site-a's upload under the two-verifier input bound: the auditor refuses to total it (BELOW_FLOOR), and without the
  auditor's floor every site refuses the record; no round applies;
- full disk (``benchmarks/attacks/full_disk.py``, issue 65): a collaborator's workspace, a tmpfs, filled while it
  runs: exit 2 naming the disk, its records whole, and the same command with room rejoining (skipped, with the
  reason, where no tmpfs can be mounted);
- a fuzz run: mutated messages on every RPC, Report included (``--fuzz N``, 10,000 by default).

After the attacks the round log is replayed from what each party really sent: every
applied round must be exactly the honest updates (plus what the aggregator acknowledged
from the hostile insider, within the plan's bounds).

Output: JSON on stdout and, with ``--json PATH``, in that file:
``{"attacks": [{"attack", "expected", "observed", "handled", "seconds", ...}, ...],
"fuzz": {"messages", "crashes", "hangs", "invalid_rounds_applied", ...}, "failed": [...]}``.
``--quick`` runs a shorter version (500 fuzz messages, shorter floods, one crash point, in
plain mode) for the test suite (tests/test_attack_matrix.py, in groups of scenarios: ``make test`` runs the
transport group, ``make test-studies`` the others); the full run takes about 3-4 minutes. The exit status is 0
when the run completed, whatever it found; the rows say what held. ``--only S --merge --json FILE`` re-measures
scenario S into an earlier run's FILE: its rows replace the same attacks' rows and every row S wrote before
(each row names its scenario), each stamped with its command, date and commit, and the others stay as the
earlier run measured them. Each scenario's sites charge their privacy ledgers in a folder of the run's own
(``ledgers/SCENARIO``, :mod:`attacks.own_ledgers`), never ``$FEDFAIR_LEDGER_DIR``'s or the user's: a row reads
only the releases its own federations charged.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from published import provenance, publish
from attacks.bounded_floor import bounded_floor_rows
from attacks.broken_chain import broken_chain_rows
from attacks.cheating import equivocation_row, sybil_rows
from attacks.colluding_survivor import colluding_survivor_rows
from attacks.consent import consent_rows
from attacks.crashes import CrashRuns
from attacks.influence import influence_rows
from attacks.forged_figures import forged_figures_rows
from attacks.forged_model import forged_model_rows
from attacks.full_disk import full_disk_rows
from attacks.leaving import leaving_rows
from attacks.ledger import ledger_rows
from attacks.noise import noise_rows
from attacks.outcome import outcome_rows
from attacks.own_ledgers import own_ledgers
from attacks.plain_attacks import PlainAttacks
from attacks.plain_stage import Sizes
from attacks.plan_values import plan_values_rows
from attacks.record import record_rows
from attacks.repeat_model import repeat_model_rows
from attacks.rotation import rotation_rows
from attacks.schedule import schedule_rows
from attacks.rows import CHECK, RowBook
from attacks.secure_attacks import SecureAttacks
from attacks.waits import waits_rows

SCENARIOS = (
    "plain",
    "secure",
    "cheating",
    "consent",
    "influence",
    "crashes",
    "waits",
    "record",
    "noise",
    "plan",
    "schedule",
    "ledger",
    "outcome",
    "repeat_model",
    "rotation",
    "full_disk",
    "chain",
    "figures",
    "colluding",
    "leaving",
    "bounded",
)


def merged(earlier: dict[str, Any], run: dict[str, Any], argv: list[str] | None) -> dict[str, Any]:
    """`earlier`'s document with `run`'s rows in place of the same attacks' rows, each new row stamped.

    A partial run (``--only``) measures some scenarios; the rows it did not measure keep the figures and the
    provenance of the run that did, and each row it did measure names its own command, date and commit.
    """
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    stamp = {**provenance(argv), "commit": commit.stdout.strip() or "unknown"}
    fresh = [{**row, "measured": stamp} for row in run["attacks"]]
    names = {row["attack"] for row in fresh}
    # A row of a re-measured scenario goes even when the scenario no longer writes it (its text changed).
    kept = [
        row
        for row in earlier["attacks"]
        if row["attack"] not in names and row.get("scenario") not in run["scenario_seconds"]
    ]
    attacks = kept + fresh
    return {
        **earlier,
        "scenario_seconds": {**earlier.get("scenario_seconds", {}), **run["scenario_seconds"]},
        "attacks": attacks,
        "failed": [row["attack"] for row in attacks if not row["handled"] and "skipped" not in row],
        "earlier_provenance": earlier.get("earlier_provenance", earlier.get("provenance")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short run for the test suite")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--fuzz", type=int, default=None, help="fuzz messages (default 10,000; 500 with --quick)")
    parser.add_argument("--only", choices=SCENARIOS, action="append", help="run only these scenarios")
    parser.add_argument("--keep", type=Path, help="keep the federations' folders (logs, round logs) here")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --only and --json: replace in that file the rows these scenarios measure, keep the others",
    )
    args = parser.parse_args(argv)
    if args.merge and (args.json is None or not args.only):
        parser.error("--merge rewrites part of an earlier run: give it --only SCENARIO and --json FILE")
    logging.getLogger("fedfair").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    started = time.perf_counter()
    book = RowBook()
    sizes = Sizes.of(args.quick, args.fuzz)
    chosen = args.only or list(SCENARIOS)
    fuzz: dict[str, Any] = {"messages": 0, "crashes": 0, "hangs": 0, "invalid_rounds_applied": 0}
    scenario_seconds: dict[str, float] = {}
    scenario_of: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="fedfair-attacks-") as folder:
        root = args.keep or Path(folder)
        runs: dict[str, Callable[[Path], None]] = {}

        def plain(where: Path) -> None:
            fuzz.update(PlainAttacks(where, book, sizes).run())

        runs["plain"] = plain
        runs["secure"] = lambda where: SecureAttacks(where, book).run()

        def cheating(where: Path) -> None:
            equivocation_row(where / "equivocation", book)
            sybil_rows(where / "sybil", book)
            forged_model_rows(where / "forged_model", book)  # issue 65: a forged next model, real processes

        runs["cheating"] = cheating
        runs["consent"] = lambda where: consent_rows(where, book)
        runs["influence"] = lambda where: influence_rows(where, book, quick=args.quick)
        runs["crashes"] = lambda where: CrashRuns(where, book, quick=args.quick).run()
        runs["waits"] = lambda where: waits_rows(where, book, quick=args.quick)  # issue 46, items 5-7
        runs["record"] = lambda where: record_rows(where, book, quick=args.quick)  # issue 46, items 1-4
        runs["noise"] = lambda where: noise_rows(where, book, quick=args.quick)  # issue 41's acceptance rows
        runs["plan"] = lambda where: plan_values_rows(where, book)  # issue 51, items 3 and 8
        runs["schedule"] = lambda where: schedule_rows(where, book, quick=args.quick)  # issue 51, items 2, 6, 9
        runs["ledger"] = lambda where: ledger_rows(where, book)  # issue 51, items 4, 5 and 7
        runs["outcome"] = lambda where: outcome_rows(where, book)  # issue 51, item 1
        runs["repeat_model"] = lambda where: repeat_model_rows(where, book)  # a final model answered before
        runs["rotation"] = lambda where: rotation_rows(where, book)  # issue 65: revocation while running
        runs["full_disk"] = lambda where: full_disk_rows(where, book)  # issue 65: a collaborator's disk fills
        runs["chain"] = lambda where: broken_chain_rows(where, book)  # issue 79: the model chain's doors
        runs["figures"] = lambda where: forged_figures_rows(where, book)  # issue 79: forged evaluation figures
        runs["colluding"] = lambda where: colluding_survivor_rows(where, book)  # issue 79: a colluder's forged sums
        runs["leaving"] = lambda where: leaving_rows(where, book)  # issue 79: one party leaving mid-round
        runs["bounded"] = lambda where: bounded_floor_rows(where, book)  # issue 93: a total of one site's upload
        for name in chosen:
            print(f"attack matrix: {name} ...", file=sys.stderr, flush=True)
            first = len(book.rows)
            with (
                book.row(f"(scenario) {name}", "the scenario runs to its end", CHECK) as row,
                own_ledgers(root / "ledgers" / name),  # its rows read only the charges its own sites made
            ):
                runs[name](root / name)
                row.record("ran", True)
            scenario_seconds[name] = round(row.seconds, 1)
            if row.handled:  # the row stays only when the scenario itself broke, to say how
                book.rows.remove(row)
            scenario_of |= {written.attack: name for written in book.rows[first:]}
    failed = book.failed()
    summary = {
        "benchmark": "attack_matrix",
        "quick": args.quick,
        "seconds": round(time.perf_counter() - started, 1),
        "scenario_seconds": scenario_seconds,
        "attacks": [{**row.to_json(), "scenario": scenario_of[row.attack]} for row in book.rows],
        "fuzz": fuzz,
        "failed": failed,
    }
    if args.merge and args.json.exists():
        summary = merged(json.loads(args.json.read_text()), summary, argv)
    publish(summary, args.json, argv)
    skipped = [row.attack for row in book.rows if row.skipped is not None]
    print(
        f"attack matrix: {len(book.rows) - len(failed) - len(skipped)} of {len(book.rows)} rows handled"
        + (f", {len(skipped)} skipped (see their rows)" if skipped else "")
        + (f"; not handled: {failed}" if failed else "")
        + f"; fuzz: {fuzz['messages']} messages, {fuzz['crashes']} crashes, {fuzz['hangs']} hangs, "
        f"{fuzz['invalid_rounds_applied']} invalid rounds applied",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
