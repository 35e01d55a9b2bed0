"""Two trees' secure rounds in lock-step, round by round: paired samples of a party's CPU (``round_compare --paired``).

Both trees' ``round_bench.py --secure-only`` runs (each through ``round_profile.py``: collaborators as threads of
one process, real gRPC over loopback mutual TLS, each party's work on its threads' CPU clocks) start at the same
time and take turns: only one tree's round runs at a time, in ABBA order (tree A's warm-up round, B's, then B's
round 2, A's round 2, A's round 3, B's round 3, ...), each run waiting in its aggregator's loop, before the round
starts, for a go byte on a pipe that this module writes once the other's round is over. Each measured round of one
tree and the same round of the other ran seconds apart, on the same machine state, so each is a paired sample:
the ratio of a party's CPU in the two (the median over parties in each) is one draw, and the rounds give many.

Why not whole runs one after the other (``round_compare`` without ``--paired``): this VM's host reclaims freed
pages, so a run that writes hundreds of megabytes into pages freed seconds earlier pays for faulting and zeroing
them (0.53-0.70 CPU s for 320 MB, against 0.063 into just-freed pages), and whichever tree ran while memory was
"cold" paid: the same two trees read 1.02x one run and 1.13x the next. In lock-step both trees see the same
machine state within each pair; ABBA has each tree run first in half the pairs and, in turn, straight after its own
round or after two of the other's, so neither order nor the gap favours one tree over the whole run.

Each lock-step run is a pair of fresh processes, and a process's own state moves its figures from one run to the
next (which party's allocator hands it freed memory and which must fault in fresh pages: a party's faults in a
round range from 0 to 7,000 at d = 10^6): so ``round_compare --paired`` makes K runs a size (``--runs``), the tree
that starts alternating, and pools their pairs.

Reported per size, for each tree and measured round: the median over parties of a party's CPU seconds in the
round, and of its user and system CPU seconds and its minor page faults (round_profile's per-thread usage); the
whole process's CPU in the round (the aggregator and gRPC's threads too). Then per pair the ratio this tree /
the reference for the party CPU, the party user CPU and the process CPU, their median and a distribution-free
interval for it (:func:`median_interval`: the sign test's order statistics, at least 95% where the pairs allow),
and each run's median.
User CPU and the faults counted are what the code does; system CPU and the faults' cost are what the host's
reclaiming moves: a ratio of user CPU near 1 beside a total above it says the difference is the machine's.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import round_profile

ROUNDS = 8
"""Measured rounds a run by default, each a paired sample; each tree also runs a warm-up round before them and an
unmeasured round after them."""
CONFIDENCE = 0.95
PARTY_FIGURES = ("cpu_seconds", "user_seconds", "system_seconds", "minor_faults")
"""What round_profile accounts for each party in a round, and the median over parties of each is reported."""
RATIOS = {
    "party_cpu": "party_cpu_seconds",
    "party_user_cpu": "party_user_seconds",
    "process_cpu": "process_cpu_seconds",
}
"""Each paired ratio reported (``secure_<name>_ratio``) and the per-round figure it divides."""


class LockStepRun:
    """One tree's profiled run, started with its turn pipes; this side writes go and reads done."""

    def __init__(self, name: str, tree: Path, out: Path, bench_arguments: list[str]) -> None:
        go_read, self.go = os.pipe()
        self.done, done_write = os.pipe()
        self.name, self.out = name, out
        command = round_profile.command(tree, out, bench_arguments, turns=f"{go_read},{done_write}")
        self.process = subprocess.Popen(
            command,
            cwd=tree,
            env=round_profile.environment(tree),
            stdout=subprocess.DEVNULL,
            pass_fds=(go_read, done_write),
        )
        os.close(go_read)  # the child's ends: once it exits, reading done gives end-of-file
        os.close(done_write)

    def turn(self, round_number: int) -> None:
        """Let this run's round `round_number` run, and wait until it is over."""
        try:
            os.write(self.go, round_profile.Turns.GO)
            ended = os.read(self.done, 1) != round_profile.Turns.DONE
        except BrokenPipeError:
            ended = True
        if ended:
            raise RuntimeError(
                f"the {self.name} tree's run ended in its round {round_number} (exit code {self.process.wait()}); "
                "its error is printed above"
            )

    def document(self) -> dict[str, Any]:
        """The run's profile, once it has finished its federation."""
        code = self.process.wait(timeout=600)
        if code != 0:
            raise RuntimeError(f"the {self.name} tree's run failed after its last round (exit code {code})")
        document: dict[str, Any] = json.loads(self.out.read_text())
        return document

    def close(self) -> None:
        """Stop the run if it is still going (an error elsewhere), and close the pipes."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.go)
        os.close(self.done)


def lock_step(dimension: int, parties: int, trees: dict[str, Path], rounds: int) -> dict[str, dict[str, Any]]:
    """Both trees' secure federations at (d, n) of one warm-up round, `rounds` measured rounds and a last one, in
    lock-step, ABBA: each tree's profile document.

    The last round is not measured: its turn ends with the federation (the final model exported, the parties told
    FINISHED and their threads joined), which is no round's work.
    """
    total = rounds + 2
    bench = ["--secure-only", "--rounds", str(total - 1), "--dimensions", str(dimension), "--parties", str(parties)]
    with tempfile.TemporaryDirectory(prefix="fedfair-round-paired-") as folder:
        runs: dict[str, LockStepRun] = {}
        try:
            for name, tree in trees.items():
                runs[name] = LockStepRun(name, tree, Path(folder) / f"{name}.json", bench)
            for round_number in range(1, total + 1):
                for name in first_then_second(list(trees), round_number):
                    runs[name].turn(round_number)
                print(f"d={dimension} n={parties} round {round_number} of {total} in both", file=sys.stderr, flush=True)
            return {name: run.document() for name, run in runs.items()}
        finally:
            for run in runs.values():
                run.close()


def first_then_second(names: list[str], round_number: int) -> list[str]:
    """The order the trees run round `round_number` in: ABBA, the first tree first in the odd rounds."""
    return names if round_number % 2 == 1 else names[::-1]


def per_round(document: dict[str, Any], rounds: Iterable[int]) -> dict[str, list[float]]:
    """A tree's secure `rounds`: per round, the median over parties of each of :data:`PARTY_FIGURES`
    (``party_<figure>``) and the whole process's CPU, user and system seconds and minor faults (``process_...``)."""
    figures: dict[str, list[float]] = {}
    accounts = document["rounds"]["secure"]
    for round_number in rounds:
        account = accounts.get(str(round_number))
        if account is None or "process" not in account or not account["parties"]:
            raise RuntimeError(f"{document['tree']}: round {round_number} was not accounted (did the round run?)")
        for figure in PARTY_FIGURES:
            value = statistics.median(party[figure] for party in account["parties"].values())
            figures.setdefault(f"party_{figure}", []).append(value)
            figures.setdefault(f"process_{figure}", []).append(account["process"][figure])
    return figures


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> dict[str, float]:
    """A distribution-free interval for the median of `values`' population: the order statistics [x_(j), x_(m+1-j)]
    of the m values with the largest j whose coverage 1 - 2 P(B <= j - 1), B ~ Binomial(m, 1/2), is at least
    `confidence` (the sign test's); with too few values for that (m < 6 at 95%), the whole range. Its coverage too.
    """
    ordered, count = sorted(values), len(values)

    def coverage(j: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(count, below) for below in range(j)) / 2**count

    j = max((j for j in range(1, count // 2 + 1) if coverage(j) >= confidence), default=1)
    return {"low": ordered[j - 1], "high": ordered[count - j], "coverage": coverage(j)}


def paired(dimension: int, parties: int, trees: dict[str, Path], rounds: int, runs: int) -> dict[str, Any]:
    """Both trees (``head`` and ``reference``) at (d, n) in `runs` lock-step runs of `rounds` measured rounds each,
    the tree that starts alternating between runs: each tree's figures, and the paired ratios pooled over the runs
    with their medians and intervals (see :func:`compared`)."""
    names = list(trees)
    documents = [
        lock_step(dimension, parties, {name: trees[name] for name in names[:: 1 if index % 2 == 0 else -1]}, rounds)
        for index in range(runs)
    ]
    return {"dimension": dimension, "parties": parties, **compared(documents, rounds)}


def compared(runs: list[dict[str, dict[str, Any]]], rounds: int) -> dict[str, Any]:
    """The lock-step `runs` (each its trees' profile documents, ``head`` and ``reference``, in the order they took
    turns) over `rounds` measured rounds each: each tree's figures per round (every run's in turn) and their
    medians, and per ratio of :data:`RATIOS` every pair's, their median and interval, and each run's median.

    A run's pairs share its two processes, whose own state (which freed memory each party's allocator hands back,
    which pages then fault) differs from one run to the next: each run's median shows that spread, which the
    interval over the pooled pairs does not include.
    """
    measured = range(2, rounds + 2)  # round 1 is the warm-up (it loads the compiled kernels), the last ends the run
    figures = [{name: per_round(document, measured) for name, document in run.items()} for run in runs]
    result: dict[str, Any] = {
        "measured_rounds": rounds,
        "runs": len(runs),
        "first_in_pair": [first_then_second(list(run), number)[0] for run in runs for number in measured],
    }
    for name in ("head", "reference"):
        pooled = {key: [value for run in figures for value in run[name][key]] for key in figures[0][name]}
        result[name] = {
            **{f"secure_{key}": statistics.median(values) for key, values in pooled.items()},
            "secure_each_round": pooled,
            "secure_peak_rss_mb_each": [run[name]["bench"]["results"][0]["peak_rss_mb"] for run in runs],
            "step_cpu_seconds": round_profile.step_medians([run[name] for run in runs]),
        }
    for ratio, figure in RATIOS.items():
        each_run = [
            [mine / theirs for mine, theirs in zip(run["head"][figure], run["reference"][figure], strict=True)]
            for run in figures
        ]
        every = [value for run in each_run for value in run]
        result[f"secure_{ratio}_ratios"] = every
        result[f"secure_{ratio}_ratio"] = statistics.median(every)
        result[f"secure_{ratio}_ratio_interval"] = median_interval(every)
        result[f"secure_{ratio}_ratio_each_run"] = [statistics.median(run) for run in each_run]
    head, reference = result["head"]["step_cpu_seconds"], result["reference"]["step_cpu_seconds"]
    result["steps"] = {
        label: {"head": head.get(label), "reference": reference.get(label)}
        for label in sorted(set(head) | set(reference))
    }
    return result


def printed(result: dict[str, Any]) -> str:
    """One size's paired comparison as lines of text: each ratio with its interval, then each tree's figures."""
    lines = [
        f"d = {result['dimension']:,}, n = {result['parties']}, {result['runs']} runs of "
        f"{result['measured_rounds']} pairs of rounds:"
    ]
    for ratio in RATIOS:
        interval = result[f"secure_{ratio}_ratio_interval"]
        lines.append(
            f"  {ratio.replace('_', ' ')} ratio {result[f'secure_{ratio}_ratio']:.3f}x "
            f"[{interval['low']:.3f}, {interval['high']:.3f}] ({100 * interval['coverage']:.1f}%); each run: "
            + ", ".join(f"{value:.3f}" for value in result[f"secure_{ratio}_ratio_each_run"])
            + "; each pair: "
            + ", ".join(f"{value:.2f}" for value in result[f"secure_{ratio}_ratios"])
        )
    for name in ("head", "reference"):
        tree = result[name]
        lines.append(
            f"  {name:9} a party's round: {1000 * tree['secure_party_cpu_seconds']:.1f} ms CPU "
            f"({1000 * tree['secure_party_user_seconds']:.1f} user, {1000 * tree['secure_party_system_seconds']:.1f} "
            f"system), {tree['secure_party_minor_faults']:,.0f} minor faults; the process "
            f"{1000 * tree['secure_process_cpu_seconds']:.0f} ms ({1000 * tree['secure_process_system_seconds']:.0f} "
            f"system), {tree['secure_process_minor_faults']:,.0f} faults; peak MB "
            + ", ".join(f"{peak:.0f}" for peak in tree["secure_peak_rss_mb_each"])
        )
    return "\n".join(lines)
