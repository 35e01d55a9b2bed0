"""A large federation for real, on this one machine: what it costs in memory and time per round.

Runs, with secure aggregation on (the plan's default masking graph),
    fedfair launch --dataset census-income --collaborators 51 --rounds 5 --no-fedavg
as a child process: the aggregator and 51 collaborator processes talking gRPC over mutual TLS,
Census-Income split uniformly at random into 51 sites (about 3,900 training rows each, 510
features, logistic regression). While it runs, every `--sample-seconds` it reads

- the machine's MemAvailable (/proc/meminfo): ``machine.used_peak_mb`` is how far it fell below
  its value just before the launch, which is what decides whether the federation fits (it counts
  each shared page once, and it also counts whatever else the machine's other users did meanwhile);
- each federation process's /proc/PID/smaps_rollup and VmHWM: RSS (resident pages, shared ones
  included: torch's libraries, mapped once in the page cache, count in every process's RSS), PSS
  (each shared page divided among the processes mapping it: the processes' PSS add up to what they
  use together, ``federation_pss_peak_mb``) and USS (Private_Clean + Private_Dirty: what a
  process's exit would give back).

Per process the peak of each is kept; ``collaborator`` gives their median and largest over the
collaborators, ``aggregator`` the aggregator's. Round times are the aggregator's (rounds.jsonl:
from opening a round to its applied sum). Prints JSON; --json PATH writes it too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from published import publish
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.local.forkserver import DISABLE

MIB = 1024.0
"""KiB per MiB: /proc reports kB (KiB)."""


def read_kib(text: str, keys: Collection[str]) -> dict[str, int]:
    """The `Key:   N kB` lines of a /proc file's `text` (meminfo, status, smaps_rollup) named in `keys`, in KiB."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in keys and rest.split():
            values[key] = int(rest.split()[0])
    return values


def proc_text(path: str) -> str | None:
    """A /proc file's text, or None once the process is gone (or it is not ours to read)."""
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def available_mb() -> float:
    """The machine's MemAvailable in MiB."""
    text = proc_text("/proc/meminfo") or ""
    return read_kib(text, {"MemAvailable"})["MemAvailable"] / MIB


@dataclass
class ProcessPeaks:
    """One federation process and the largest of each of its memory measures seen so far, in MiB."""

    role: str
    name: str
    rss_mb: float = 0.0
    pss_mb: float = 0.0
    uss_mb: float = 0.0
    hwm_mb: float = 0.0
    """VmHWM: the kernel's own peak RSS, between samples included."""

    def sample(self, pid: int) -> float:
        """Read the process's memory now and raise the peaks; its PSS in MiB (0 once it is gone)."""
        rollup = proc_text(f"/proc/{pid}/smaps_rollup")
        status = proc_text(f"/proc/{pid}/status")
        if rollup is None or status is None:
            return 0.0
        now = read_kib(rollup, {"Rss", "Pss", "Private_Clean", "Private_Dirty"})
        if "Rss" not in now:  # a process exiting right now has no mappings left
            return 0.0
        pss = now["Pss"] / MIB
        self.rss_mb = max(self.rss_mb, now["Rss"] / MIB)
        self.pss_mb = max(self.pss_mb, pss)
        self.uss_mb = max(self.uss_mb, (now["Private_Clean"] + now["Private_Dirty"]) / MIB)
        self.hwm_mb = max(self.hwm_mb, read_kib(status, {"VmHWM"}).get("VmHWM", 0) / MIB)
        return pss


def classify(command: list[str]) -> tuple[str, str]:
    """(role, name) of a launched process from its command line: a collaborator is named by its
    config's folder (the site), the aggregator is "aggregator", anything else "other"."""
    if "collaborator" in command and "--config" in command:
        return "collaborator", Path(command[command.index("--config") + 1]).parent.name
    if "aggregator" in command:
        return "aggregator", "aggregator"
    return "other", command[0] if command else "?"


def children_of(parent: int) -> list[int]:
    """The processes whose parent is `parent` (the launcher starts every party directly)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_text(f"/proc/{entry}/stat")
            # The command name, in parentheses, may hold spaces: the parent id follows the last ')'.
            if stat is not None and int(stat.rpartition(")")[2].split()[1]) == parent:
                found.append(int(entry))
    return found


class Sampler:
    """Samples the machine's and the launcher's processes' memory until :meth:`stop`."""

    def __init__(self, launcher: int, every: float) -> None:
        self.launcher = launcher
        self.every = every
        self.baseline_mb = available_mb()
        self.lowest_mb = self.baseline_mb
        self.federation_pss_peak_mb = 0.0
        self.samples = 0
        self.processes: dict[int, ProcessPeaks] = {launcher: ProcessPeaks("launcher", "launch")}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        for pid in children_of(self.launcher):
            # A child read between fork and exec still shows the launcher's command line: classify
            # it again until it shows its own, keeping the peaks measured so far.
            if pid not in self.processes or self.processes[pid].role == "other":
                command = (proc_text(f"/proc/{pid}/cmdline") or "").split("\0")
                role, name = classify(command)
                peaks = self.processes.setdefault(pid, ProcessPeaks(role, name))
                peaks.role, peaks.name = role, name
        total = sum(peaks.sample(pid) for pid, peaks in self.processes.items())
        self.federation_pss_peak_mb = max(self.federation_pss_peak_mb, total)
        self.lowest_mb = min(self.lowest_mb, available_mb())
        self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def of_role(self, role: str) -> list[ProcessPeaks]:
        return [peaks for peaks in self.processes.values() if peaks.role == role]


def spread(values: list[float]) -> dict[str, float]:
    """Median and largest, in MiB rounded to 0.1."""
    return {"median": round(statistics.median(values), 1), "max": round(max(values), 1)} if values else {}


def summary(sampler: Sampler, rounds: list[dict[str, Any]], planned: int, wall: float) -> dict[str, Any]:
    """The benchmark's figures from the sampler's peaks and the aggregator's round log."""
    collaborators = sampler.of_role("collaborator")
    applied = [record for record in rounds if record.get("status") == "applied"]
    seconds = [float(record["seconds"]) for record in applied]
    evaluations = [record["evaluation"] for record in rounds if "evaluation" in record]
    evaluation: dict[str, Any] = evaluations[-1] if evaluations else {}
    aggregator = sampler.of_role("aggregator")
    return {
        "rounds_planned": planned,
        "rounds_completed": len(applied),
        "finished": len(applied) == planned and evaluation.get("status") == "done",
        "wall_seconds": round(wall, 1),
        "round_seconds": [round(value, 2) for value in seconds],
        "round_seconds_median": round(statistics.median(seconds), 2) if seconds else None,
        "worst_risk": evaluation.get("worst_risk"),
        "accuracy": evaluation.get("accuracy"),
        "machine": {
            "total_mb": round(read_kib(proc_text("/proc/meminfo") or "", {"MemTotal"})["MemTotal"] / MIB),
            "available_before_mb": round(sampler.baseline_mb),
            "available_lowest_mb": round(sampler.lowest_mb),
            "used_peak_mb": round(sampler.baseline_mb - sampler.lowest_mb),
        },
        "federation_pss_peak_mb": round(sampler.federation_pss_peak_mb),
        "samples": sampler.samples,
        "collaborators_seen": len(collaborators),
        "collaborator": {
            measure: spread([getattr(peaks, f"{measure}_mb") for peaks in collaborators])
            for measure in ("rss", "hwm", "pss", "uss")
        },
        "aggregator": {key: round(value, 1) for key, value in asdict(aggregator[0]).items() if key.endswith("_mb")}
        if aggregator
        else {},
        "per_collaborator": [asdict(peaks) for peaks in collaborators],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="census-income", help="launch's --dataset (default census-income)")
    parser.add_argument("--collaborators", type=int, default=51, help="sites (default 51)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--sample-seconds", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="federation-bench-") as scratch:
        workdir, log = Path(scratch) / "federation", Path(scratch) / "launch.log"
        command = [
            sys.executable, "-m", "fedfair.cli", "launch", "--dataset", args.dataset,
            "--collaborators", str(args.collaborators), "--rounds", str(args.rounds), "--no-fedavg",
            "--workdir", str(workdir),
        ]  # fmt: skip
        started = time.perf_counter()
        with open(log, "w") as output:
            # Each party a fresh interpreter, as a deployment runs it: forked from launch's forkserver, it would share
            # the forkserver's pages and carry its command line, and the sampler could tell no site by its own.
            fresh = {**os.environ, DISABLE: "0"}
            launcher = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=fresh)
            sampler = Sampler(launcher.pid, args.sample_seconds)
            code = launcher.wait()
            sampler.stop()
        wall = time.perf_counter() - started
        try:
            rounds = read_round_log(workdir / "aggregator" / "output")
        except (OSError, ValueError):
            rounds = []
        document = {
            "benchmark": "federation_bench",
            "launched": " ".join(["fedfair", *command[3:-2]]),
            "dataset": args.dataset,
            "collaborators": args.collaborators,
            "launch_exit_status": code,
            **summary(sampler, rounds, args.rounds, wall),
        }
        if code != 0:
            print("".join(log.read_text().splitlines(keepends=True)[-60:]), file=sys.stderr)
    publish(document, args.json, argv)
    return 0 if document["finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
