"""The round's CPU and a federation's peak memory, this tree against earlier commits, interleaved A/B.

Commits up to 3687e85 fixed glibc's mmap threshold in every party (`fedfair.runtime.memory`, 4 MiB), so that
freed model-sized blocks went back to the system (memory) at the price of mapping and unmapping each on
every use (CPU); this tree leaves glibc's own moving threshold, keeps a large model's states (the sites'
chains, the aggregator's) in files, has sites encode a piece at a time and gives a large round's freed memory
back once a round per site (`fedfair.runtime.memory`). This script runs `round_bench.py` (secure
aggregation, parties as threads of one process) for each arm in turn, the arms interleaved within every
repetition so that a slow spell of this shared machine hits them alike, at the two configurations the
goals name:
  - d = 10^6, 10 sites: the process's CPU seconds per round (`process_cpu_seconds`, every party's and the
    aggregator's threads together); goal: at most 19c2d03's, the code before the setting;
  - d = 10^7, 3 sites: the process's peak resident memory (`peak_rss_mb`); goal: at most 1,200 MB.
Arms: this tree, and each --baseline COMMIT[:LABEL] (repeatable), exported from this repository (git
archive) to run its own round_bench and code, named by its commit. Each figure is the median over
repetitions of each run's median round.

Prints JSON (and writes it with --json PATH, after every repetition); --quick runs one repetition of 2 rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from published import publish

HERE = Path(__file__).resolve().parent
THIS_TREE = "this tree"
CONFIGURATIONS = {"cpu": (1_000_000, 10, "process_cpu_seconds"), "memory": (10_000_000, 3, "peak_rss_mb")}


def run(dimension: int, parties: int, tree: Path, rounds: int) -> dict[str, Any]:
    """One secure federation through `tree`'s own round_bench and code, in a fresh process; its secure row.

    Secure only where that round_bench knows --secure-only, else plain and secure.
    """
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        script = tree / "benchmarks" / "round_bench.py"
        command = [sys.executable, str(script), "--rounds", str(rounds), "--dimensions", str(dimension)]
        command += ["--parties", str(parties), "--json", str(out)]
        command += ["--secure-only"] if "--secure-only" in script.read_text() else []
        environment = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=environment)
        rows = [row for row in json.loads(out.read_text())["results"] if row["secure"]]
        return dict(rows[0])


def export(commit: str, folder: Path) -> Path:
    """`commit` of this repository as a tree under `folder` (git archive), for an arm that runs its own code."""
    tree = folder / commit
    tree.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=HERE.parent, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    parser.add_argument("--repetitions", type=int, default=3, help="interleaved repetitions (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per federation (default 3)")
    parser.add_argument("--quick", action="store_true", help="one repetition of 2 rounds")
    parser.add_argument(
        "--baseline", action="append", default=[], help="COMMIT[:LABEL] whose own round_bench and code is one more arm"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        arms = {THIS_TREE: HERE.parent}
        for baseline in args.baseline:
            commit, _, label = baseline.partition(":")
            arms[f"{commit} ({label})" if label else commit] = export(commit, Path(folder))
        measure(arms, args.json, *((1, 2) if args.quick else (args.repetitions, args.rounds)))


def measure(arms: dict[str, Path], path: Path | None, repetitions: int, rounds: int) -> None:
    """Run every arm at both configurations, interleaved, `repetitions` times; publish after each repetition."""
    readings: dict[str, dict[str, list[float]]] = {name: {arm: [] for arm in arms} for name in CONFIGURATIONS}
    cpu_at_memory: dict[str, list[float]] = {arm: [] for arm in arms}
    for repetition in range(repetitions):
        for name, (dimension, parties, figure) in CONFIGURATIONS.items():
            for arm, tree in arms.items():
                row = run(dimension, parties, tree, rounds)
                readings[name][arm].append(row[figure])
                if name == "memory":
                    cpu_at_memory[arm].append(row["process_cpu_seconds"])
                print(
                    f"allocator_ab: {repetition + 1}/{repetitions} d={dimension} n={parties} {arm}: "
                    f"{figure} {row[figure]:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
        publish(summary(list(arms), repetition + 1, rounds, readings, cpu_at_memory), path)


def summary(
    arms: list[str],
    repetitions: int,
    rounds: int,
    readings: dict[str, dict[str, list[float]]],
    cpu_at_memory: dict[str, list[float]],
) -> dict[str, Any]:
    """The JSON of the repetitions run so far."""
    return {
        "configurations": {
            name: {"dimension": dimension, "parties": parties, "figure": figure}
            for name, (dimension, parties, figure) in CONFIGURATIONS.items()
        },
        "arms": arms,
        "repetitions": repetitions,
        "rounds": rounds,
        "readings": readings,
        "medians": {
            name: {arm: statistics.median(values) for arm, values in by_arm.items()}
            for name, by_arm in readings.items()
        },
        "cpu_at_d1e7": {arm: statistics.median(values) for arm, values in cpu_at_memory.items()},
    }


if __name__ == "__main__":
    main()
