"""The allocator setting's price: a round's CPU and a federation's peak memory with each mmap threshold, A/B.

`fedfair.runtime.memory` fixes glibc's mmap threshold in the aggregator and every collaborator so that
freed model-sized blocks go back to the system (memory), at the price of mapping and unmapping each
block on every use (CPU). This script runs `round_bench.py` (secure aggregation, parties as threads of
one process) for each arm in turn, the arms interleaved within every repetition so that a slow spell of
this shared machine hits them alike, at the two configurations the goals name:
  - d = 10^6, 10 sites: the process's CPU seconds per round (`process_cpu_seconds`, every party's and the
    aggregator's threads together), the cost the setting adds;
  - d = 10^7, 3 sites: the process's peak resident memory (`peak_rss_mb`), what it saves.
Arms: a threshold of 256 KiB, 4 MiB and 32 MiB (glibc's largest), and glibc's own moving threshold
(the setting off); --threshold picks some of them (default: all). Each --baseline COMMIT[:LABEL]
(repeatable) is exported from this repository (git archive) and runs its own round_bench and code as one
more arm, named by its commit (19c2d03, before the setting, is the CPU goal's reference). Each figure is the
median over repetitions of each run's median round.

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
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from published import publish

HERE = Path(__file__).resolve().parent
ARMS = {"256 KiB": str(256 << 10), "4 MiB": str(4 << 20), "32 MiB": str(32 << 20), "glibc's own": "glibc"}
CONFIGURATIONS = {"cpu": (1_000_000, 10, "process_cpu_seconds"), "memory": (10_000_000, 3, "peak_rss_mb")}


def run(dimension: int, parties: int, arm: str | Path, rounds: int) -> dict[str, Any]:
    """One secure federation through round_bench in a fresh process; its result row.

    `arm` is this tree's mmap threshold (bytes, or "glibc"), or a checkout whose own round_bench runs on its
    own code as it stands (secure only where it knows --secure-only, else plain and secure): its secure row.
    """
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        sizes = ["--rounds", str(rounds), "--dimensions", str(dimension), "--parties", str(parties)]
        if isinstance(arm, Path):
            script = arm / "benchmarks" / "round_bench.py"
            command = [sys.executable, str(script), *sizes]
            command += ["--secure-only"] if "--secure-only" in script.read_text() else []
            environment = {**os.environ, "PYTHONPATH": str(arm)}
        else:
            command = [sys.executable, str(HERE / "round_bench.py"), "--secure-only", *sizes]
            command += ["--mapped-from", arm]
            environment = {**os.environ, "PYTHONPATH": str(HERE.parent)}
        subprocess.run([*command, "--json", str(out)], check=True, stdout=subprocess.DEVNULL, env=environment)
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
        "--threshold",
        action="append",
        choices=list(ARMS.values()),
        help="a threshold arm to run (bytes, or glibc; repeatable; default: every one)",
    )
    parser.add_argument(
        "--baseline", action="append", default=[], help="COMMIT[:LABEL] whose own round_bench and code is one more arm"
    )
    args = parser.parse_args()
    chosen = args.threshold or list(ARMS.values())
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        arms: dict[str, str | Path] = {arm: setting for arm, setting in ARMS.items() if setting in chosen}
        for baseline in args.baseline:
            commit, _, label = baseline.partition(":")
            arms[f"{commit} ({label})" if label else commit] = export(commit, folder)
        measure(arms, args.json, *((1, 2) if args.quick else (args.repetitions, args.rounds)))


def measure(arms: dict[str, str | Path], path: Path | None, repetitions: int, rounds: int) -> None:
    """Run every arm at both configurations, interleaved, `repetitions` times; publish after each repetition."""
    readings: dict[str, dict[str, list[float]]] = {name: {arm: [] for arm in arms} for name in CONFIGURATIONS}
    cpu_at_memory: dict[str, list[float]] = {arm: [] for arm in arms}
    for repetition in range(repetitions):
        for name, (dimension, parties, figure) in CONFIGURATIONS.items():
            for arm, setting in arms.items():
                row = run(dimension, parties, setting, rounds)
                readings[name][arm].append(row[figure])
                if name == "memory":
                    cpu_at_memory[arm].append(row["process_cpu_seconds"])
                print(
                    f"allocator_ab: {repetition + 1}/{repetitions} d={dimension} n={parties} {arm}: "
                    f"{figure} {row[figure]:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
        publish(summary(arms, repetition + 1, rounds, readings, cpu_at_memory), path)


def summary(
    arms: dict[str, str | Path],
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
        "arms": {arm: setting if isinstance(setting, str) else "commit" for arm, setting in arms.items()},
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
