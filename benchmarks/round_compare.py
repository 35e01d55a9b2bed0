"""A secure round's CPU and memory against a pinned earlier commit: per party, per step, interleaved.

    python benchmarks/round_compare.py [--reference COMMIT] [--runs K] [--sizes D:N ...] [--json PATH]
    python benchmarks/round_compare.py --paired [--rounds R] [--reference COMMIT] [--sizes D:N ...] [--json PATH]

For each size (d parameters, n collaborators; by default d = 10^6 with n = 10 and d = 10^7 with n = 3) the
script runs ``round_bench.py --quick`` (plain and secure federations, collaborators as threads of one
process, real gRPC over loopback mutual TLS, 2 measured rounds after a warm-up) K times in this checkout and K
times in a checkout of the reference commit, alternating which goes first, so that a shared machine's drift
slows both alike. Each run is one process, ``round_profile.py``, which times every step a party takes on its
own thread's CPU clock. CPU seconds, not wall time: the load of other processes changes wall time, not
the CPU a step spends (only a little, through caches). The reference's checkout is a git worktree under
``build/`` made on first use; it runs with this checkout's environment, its own ``fedfair`` first on the path.

Reported, per size: for each tree the median over runs of each party's CPU in a round (``party_cpu_seconds``,
round_bench's: its task handlers and its round job on their threads' clocks), secure and plain, and the peak
resident memory of each run's process (every party's and the aggregator's, so n parties' copies);
``secure_party_cpu_ratio``, this checkout's secure party CPU over the reference's (the medians'), and
``secure_party_cpu_ratios``, each interleaved pair's; ``steps``: per step of a party's secure round (the
encoding, each stage's client step, the model chain's checks), the median CPU of one call at the sum's length in
each tree, and their difference: where a round's extra CPU goes. Then ``--memory-runs`` more runs of each tree
(alternating likewise) trace every allocation (round_profile's ``--live-memory``): ``secure_live_peak_mb_each`` and
``plain_live_peak_mb_each``, the most memory a run's federation held live at once, numpy arrays and Python objects
counted as they are freed, which the host's reclaiming and the allocator's keeping of freed memory cannot move as
they move the peak resident memory; ``live_peak_ratio``, this checkout's median over the reference's, per setting
(goal: at most 1.05).

With ``--paired`` (``round_paired.py``) the two trees instead run at once, secure rounds only, taking turns round
by round in ABBA order, K times a size (``--runs``): each of a run's R measured rounds (``--rounds``, default 8)
is a paired sample of a party's CPU in both trees on the same machine state, so a host that reclaims freed pages
cannot favour one tree. Reported per size: the median of the pooled per-round ratios with a distribution-free
interval, and each run's median, for the party's CPU, its user CPU alone and the process's CPU; a party's user and
system CPU and minor page faults a round in each tree (``results/round_compare_paired.json``). With the defaults
(3 runs of 8 rounds) it takes about 4 minutes at d = 10^6, n = 10 and 10 at d = 10^7, n = 3 on 2 shared cores,
and holds both trees' federations at once (about 2 GB each at d = 10^6, n = 10).

``make bench-round`` runs the paired comparison against the pinned reference and prints the table (the same two
trees' pooled ratio moved 0.014 between two such runs at d = 10^6, n = 10, where whole runs' moved 0.11); run it
after any change to the secure round's code path (secagg, the collaborator's steps, the chain, the transport) and
before merging it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import round_profile
import round_paired
from published import publish

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = "6692f28"
"""The commit this project's round cost is held to (issue 97): the secure round before the verified chain."""
SIZES = ((10**6, 10), (10**7, 3))
RUNS = 3
MEMORY_RUNS = 1
LIVE_PEAK_GOAL = 1.05
"""This checkout's live peak (median over runs) over the reference's, at most, plain and secure (issue 97)."""


def checkout(commit: str) -> Path:
    """A checkout of `commit` (a detached git worktree under build/), made on first use."""
    tree = ROOT / "build" / f"reference-{commit}"
    if not (tree / "benchmarks" / "round_bench.py").is_file():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True)
    return tree


def run_tree(tree: Path, dimension: int, parties: int, live_memory: bool = False) -> dict[str, Any]:
    """One round_bench --quick of `tree` at (d, n), its party steps timed (round_profile.py); its document.

    `live_memory`: its allocations traced too (round_profile's ``--live-memory``), for the live peaks.
    """
    with tempfile.TemporaryDirectory(prefix="fedfair-round-compare-") as folder:
        out = Path(folder) / "profile.json"
        bench = ["--quick", "--dimensions", str(dimension), "--parties", str(parties)]
        command = round_profile.command(tree, out, bench, live_memory=live_memory)
        subprocess.run(command, cwd=tree, env=round_profile.environment(tree), check=True, stdout=subprocess.DEVNULL)
        document: dict[str, Any] = json.loads(out.read_text())
        return document


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One tree's runs at one size: the medians of round_bench's figures, every peak, each step's median call."""
    by_setting = {
        secure: [next(r for r in run["bench"]["results"] if r["secure"] is secure) for run in runs]
        for secure in (False, True)
    }
    return {
        "secure_party_cpu_seconds": statistics.median(r["party_cpu_seconds"] for r in by_setting[True]),
        "plain_party_cpu_seconds": statistics.median(r["party_cpu_seconds"] for r in by_setting[False]),
        "secure_party_cpu_seconds_each": [r["party_cpu_seconds"] for r in by_setting[True]],
        "secure_process_cpu_seconds": statistics.median(r["process_cpu_seconds"] for r in by_setting[True]),
        "secure_peak_rss_mb_each": [r["peak_rss_mb"] for r in by_setting[True]],
        "plain_peak_rss_mb_each": [r["peak_rss_mb"] for r in by_setting[False]],
        "step_cpu_seconds": round_profile.step_medians(runs),
    }


def live_peaks(dimension: int, parties: int, trees: dict[str, Path], runs: int) -> dict[str, dict[str, list[float]]]:
    """Both trees at (d, n), `runs` traced runs each, alternating which runs first: each tree's live peaks (MiB),
    ``secure`` and ``plain``, one a run."""
    peaks: dict[str, dict[str, list[float]]] = {name: {"secure": [], "plain": []} for name in trees}
    for index in range(runs):
        for name in list(trees)[:: 1 if index % 2 == 0 else -1]:
            for result in run_tree(trees[name], dimension, parties, live_memory=True)["bench"]["results"]:
                peaks[name]["secure" if result["secure"] else "plain"].append(result["live_peak_mb"])
            print(
                f"d={dimension} n={parties} {name:9} traced run {index + 1}: live peak "
                + ", ".join(f"{setting} {values[-1]:.0f} MB" for setting, values in peaks[name].items()),
                file=sys.stderr,
                flush=True,
            )
    return peaks


def compare(dimension: int, parties: int, trees: dict[str, Path], runs: int, memory_runs: int) -> dict[str, Any]:
    """Both trees at (d, n), `runs` times each, alternating which runs first, then `memory_runs` traced runs each
    likewise; the comparison."""
    documents: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for index in range(runs):
        for name in list(trees)[:: 1 if index % 2 == 0 else -1]:
            documents[name].append(run_tree(trees[name], dimension, parties))
            each = documents[name][-1]["bench"]["results"]
            print(
                f"d={dimension} n={parties} {name:9} run {index + 1}: "
                + ", ".join(
                    f"{'secure' if r['secure'] else 'plain'} {r['party_cpu_seconds']:.3f} s a party, "
                    f"peak {r['peak_rss_mb']:.0f} MB"
                    for r in each
                ),
                file=sys.stderr,
                flush=True,
            )
    head, reference = summary(documents["head"]), summary(documents["reference"])
    peaks = live_peaks(dimension, parties, trees, memory_runs) if memory_runs else None
    for name, tree_summary in (("head", head), ("reference", reference)):
        for setting in ("secure", "plain"):
            tree_summary[f"{setting}_live_peak_mb_each"] = peaks[name][setting] if peaks else []
    steps = {
        label: {
            "head": head["step_cpu_seconds"].get(label),
            "reference": reference["step_cpu_seconds"].get(label),
        }
        for label in sorted(set(head["step_cpu_seconds"]) | set(reference["step_cpu_seconds"]))
    }
    return {
        "dimension": dimension,
        "parties": parties,
        "head": head,
        "reference": reference,
        "secure_party_cpu_ratio": head["secure_party_cpu_seconds"] / reference["secure_party_cpu_seconds"],
        "secure_party_cpu_ratios": [
            mine / theirs
            for mine, theirs in zip(
                head["secure_party_cpu_seconds_each"], reference["secure_party_cpu_seconds_each"], strict=True
            )
        ],
        "live_peak_ratio": {
            setting: statistics.median(head[f"{setting}_live_peak_mb_each"])
            / statistics.median(reference[f"{setting}_live_peak_mb_each"])
            for setting in ("secure", "plain")
        }
        if peaks
        else None,
        "live_peak_goal": LIVE_PEAK_GOAL,
        "steps": steps,
    }


def printed(result: dict[str, Any]) -> str:
    """The comparison at one size as lines of text: the ratio, the peaks, then each step's CPU."""
    head, reference = result["head"], result["reference"]
    lines = [
        f"d = {result['dimension']:,}, n = {result['parties']}: secure party CPU "
        f"{head['secure_party_cpu_seconds']:.3f} s against {reference['secure_party_cpu_seconds']:.3f} s, "
        f"{result['secure_party_cpu_ratio']:.2f}x (each pair: "
        + ", ".join(f"{value:.2f}" for value in result["secure_party_cpu_ratios"])
        + ")",
        "  peak MB, secure: "
        + ", ".join(f"{value:.0f}" for value in head["secure_peak_rss_mb_each"])
        + " against "
        + ", ".join(f"{value:.0f}" for value in reference["secure_peak_rss_mb_each"])
        + "; plain: "
        + ", ".join(f"{value:.0f}" for value in head["plain_peak_rss_mb_each"])
        + " against "
        + ", ".join(f"{value:.0f}" for value in reference["plain_peak_rss_mb_each"]),
    ]
    if result["live_peak_ratio"] is not None:
        lines.append(
            "  live peak MB (traced), "
            + "; ".join(
                f"{setting}: "
                + ", ".join(f"{value:.0f}" for value in head[f"{setting}_live_peak_mb_each"])
                + " against "
                + ", ".join(f"{value:.0f}" for value in reference[f"{setting}_live_peak_mb_each"])
                + f" ({result['live_peak_ratio'][setting]:.3f}x, goal {result['live_peak_goal']:.2f}x)"
                for setting in ("secure", "plain")
            )
        )
    for label, spent in result["steps"].items():
        mine, theirs = spent["head"], spent["reference"]
        shown = [f"{1000 * value:8.2f}" if value is not None else "     n/a" for value in (mine, theirs)]
        lines.append(f"  {label:22} {shown[0]} ms against {shown[1]} ms")
    return "\n".join(lines)


def size(text: str) -> tuple[int, int]:
    """A size given as D:N."""
    dimension, _, parties = text.partition(":")
    return int(dimension), int(parties)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", default=REFERENCE, help=f"the commit compared against (default {REFERENCE})")
    parser.add_argument(
        "--reference-tree", type=Path, help="an existing checkout of the reference (default: one made under build/)"
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=RUNS,
        help=f"runs of each tree per size (with --paired: lock-step runs; default {RUNS})",
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="run both trees at once in lock-step, round by round (round_paired.py), secure rounds only",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=round_paired.ROUNDS,
        help=f"with --paired: measured rounds a run, each a paired sample (default {round_paired.ROUNDS})",
    )
    parser.add_argument(
        "--memory-runs",
        type=int,
        default=MEMORY_RUNS,
        help=f"traced runs of each tree per size, for the live peaks (default {MEMORY_RUNS}; 0: none)",
    )
    parser.add_argument(
        "--sizes",
        type=size,
        nargs="+",
        default=list(SIZES),
        metavar="D:N",
        help="the sizes (default 1000000:10 10000000:3)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.memory_runs < 0:
        parser.error("--memory-runs must be 0 or more")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (each measured round is one paired sample)")
    trees = {"head": ROOT, "reference": (args.reference_tree or checkout(args.reference)).resolve()}
    if args.paired:
        paired = [
            round_paired.paired(dimension, parties, trees, args.rounds, args.runs) for dimension, parties in args.sizes
        ]
        for result in paired:
            print(round_paired.printed(result), file=sys.stderr)
        publish(
            {
                "benchmark": "round_compare_paired",
                "what": "a secure round's CPU per party, this checkout against the reference commit, both run at once "
                "and taking turns round by round (ABBA); round_bench --secure-only, collaborators as threads, CPU "
                "seconds on each thread's clock, split into user and system time, with the minor page faults",
                "reference": args.reference,
                "measured_rounds": args.rounds,
                "runs": args.runs,
                "results": paired,
            },
            args.json,
            argv,
        )
        return 0
    results = [compare(dimension, parties, trees, args.runs, args.memory_runs) for dimension, parties in args.sizes]
    for result in results:
        print(printed(result), file=sys.stderr)
    publish(
        {
            "benchmark": "round_compare",
            "what": "a secure round's CPU per party and each party step's CPU, this checkout against the reference "
            "commit, interleaved; round_bench --quick, collaborators as threads, CPU seconds on each thread's clock; "
            "then traced runs of each for the live peaks (tracemalloc: numpy arrays and Python objects held at once)",
            "reference": args.reference,
            "runs": args.runs,
            "memory_runs": args.memory_runs,
            "results": results,
        },
        args.json,
        argv,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
