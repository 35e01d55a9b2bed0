"""round_bench's parties: a collaborator without data that times its own share of each round, and how they run.

:class:`BenchCollaborator` sends a precomputed update (:class:`FixedUpdate`, no local training) and records the
intervals its task handlers and round job spend busy (:func:`covered` merges them); :func:`run_parties` runs the
aggregator and the collaborators, as threads of this process or as processes of their own, and
:func:`peak_rss_mb` and its kin read this process's memory. See ``benchmarks/round_bench.py`` for what is measured.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import resource
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import numpy as np
import torch

from fedfair.core.models import output_units
from fedfair.core.update import Update
from fedfair.runtime.aggregator.start import run_aggregator
from fedfair.runtime.collaborator import client as collaborator_client
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.preparation import Prepared
from fedfair.runtime.collaborator.steps import StartJob
from fedfair.runtime.collaborator.trainer import LocalData
from fedfair.runtime.plan.aggregator_plan import SharedSettings, load_aggregator_plan
from fedfair.runtime.transport import pb

BATCH = 100.0
"""The fixed update's weight, and the plan's max_weight."""

Result = TypeVar("Result")

TRAIN_SECONDS = "FEDFAIR_BENCH_TRAIN_SECONDS"
"""How the --train-seconds option reaches every collaborator, threads and spawned processes alike."""


class FixedUpdate:
    """A round trainer that returns the same small update after `seconds` of sleep: no local training.

    The sleep stands in for training on the institution's own hardware (its GPU, its own
    machine), which takes wall time but none of the cores this benchmark shares.
    """

    def __init__(self, dimension: int, seed: int, seconds: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.delta = 0.01 * torch.randn(dimension, generator=generator)
        self.seconds = seconds

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        if self.seconds > 0:
            time.sleep(self.seconds)
        return Update(delta=self.delta, delta_c=-0.01, weight=BATCH)


class BenchCollaborator(Collaborator):
    """A collaborator without data: a fixed update of the plan's size, and trivial evaluation answers.

    It also times its own share of each round (see the module's notes): the intervals its
    thread spends in each task's handler and its round job (training and encoding) spends
    running, which overlap while the key stages run beside the job, merged per round; and
    the CPU time of both threads in them.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.busy_intervals: dict[int, list[tuple[float, float]]] = {}
        self.busy_cpu_seconds: dict[int, float] = {}
        self.process_cpu_spans: dict[int, tuple[float, float]] = {}
        """Per round, this process's CPU clock as the round's first handler or job starts and as its last ends."""
        self._timing_lock = threading.Lock()
        self.measures_memory = False
        """Whether this party is a process of its own, whose memory is its own to measure (``--processes``)."""
        self.first_round_rss_mb: float | None = None

    def prepare(self, data: LocalData | None, shared: SharedSettings) -> None:
        outputs = output_units(shared.model.classes)
        parameters = (shared.model.features + 1) * outputs  # logistic regression: weights and a bias per output
        trainer = FixedUpdate(
            parameters, seed=hash(self.config.name) % 2**31, seconds=float(os.environ.get(TRAIN_SECONDS, "0"))
        )
        self._model = shared.model  # round 1's model is checked against this model built from the plan's seed
        self._use(Prepared(trainer, None, parameters))

    def _timed(self, round_number: int, run: Callable[[], Result]) -> Result:
        started, started_cpu, started_process_cpu = time.perf_counter(), time.thread_time(), time.process_time()
        try:
            return run()
        finally:
            ended, cpu, ended_process_cpu = time.perf_counter(), time.thread_time() - started_cpu, time.process_time()
            with self._timing_lock:
                self.busy_intervals.setdefault(round_number, []).append((started, ended))
                self.busy_cpu_seconds[round_number] = self.busy_cpu_seconds.get(round_number, 0.0) + cpu
                first, last = self.process_cpu_spans.get(round_number, (started_process_cpu, ended_process_cpu))
                self.process_cpu_spans[round_number] = (
                    min(first, started_process_cpu),
                    max(last, ended_process_cpu),
                )

    def handle(self, stub: Any, task: pb.Task) -> bool:
        return self._timed(task.binding.round, lambda: super(BenchCollaborator, self).handle(stub, task))

    def train(self, stub: Any, binding: pb.Binding) -> StartJob:
        if self.measures_memory and self.first_round_rss_mb is None:
            # What the process holds as its first round starts; the peak from here on is the rounds'.
            self.first_round_rss_mb = resident_rss_mb()
            reset_peak_rss()
        job = super().train(stub, binding)  # the download, inside the TRAIN handler's time
        return StartJob(lambda: self._timed(binding.round, job.run), job.model)

    def evaluate(self, stub: Any, binding: pb.Binding) -> StartJob:
        job = super().evaluate(stub, binding)
        return StartJob(lambda: self._timed(binding.round, job.run), job.model)

    def busy(self) -> Busy:
        """Per round, the wall time covered by the recorded intervals, their threads' CPU time in them, and the
        process's CPU (every thread: gRPC's own included) from the round's first interval's start to its last's end.

        The last is the party's whole CPU on the round only where the process is the party's alone (``--processes``).
        """
        walls = {round_number: covered(spans) for round_number, spans in self.busy_intervals.items()}
        process = {round_number: last - first for round_number, (first, last) in self.process_cpu_spans.items()}
        return walls, dict(self.busy_cpu_seconds), process

    def evaluation_answers(self, theta: torch.Tensor, c: float) -> np.ndarray:
        from fedfair.fairness import sums

        losses = np.linspace(0.1, 2.0, 100)
        return sums.local_answers(losses, np.zeros(losses.size), self.shared.evaluation.thresholds())


Busy = tuple[dict[int, float], dict[int, float], dict[int, float]]
"""A party's per-round wall and CPU seconds inside its task handlers and round jobs, and its process's CPU
seconds across the round (see :meth:`BenchCollaborator.busy`)."""


def covered(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the intervals `spans` (overlapping time counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def party_medians(busy: list[Busy], rounds: list[int]) -> tuple[float, float, list[float]]:
    """The median over parties of each party's median critical path over `rounds` (wall, CPU), and
    every party's median wall time."""
    walls = [statistics.median(wall.get(r, 0.0) for r in rounds) for wall, _, _ in busy]
    cpus = [statistics.median(cpu.get(r, 0.0) for r in rounds) for _, cpu, _ in busy]
    return statistics.median(walls), statistics.median(cpus), walls


def collaborator_process(config: Path, results: Any) -> None:
    """One party as its own process (``--processes``): take part in the federation, then put its
    busy times and its peak memory on the `results` queue."""
    logging.getLogger("fedfair").setLevel(logging.WARNING)
    collaborator = BenchCollaborator(load_collaborator_config(config))
    collaborator.measures_memory = True
    process_start = peak_rss_mb()  # imports, configuration and identity
    with mock.patch.object(collaborator_client, "load_local_data", lambda *_: None):
        collaborator.run()
    first_round = collaborator.first_round_rss_mb
    results.put(
        (collaborator.busy(), (peak_rss_mb(), first_round if first_round is not None else process_start, process_start))
    )


def run_parties(
    plan_path: Path, configs: list[Path], processes: bool
) -> tuple[list[Busy], list[tuple[float, float, float]]]:
    """Run the aggregator here and the collaborators as threads of this process or as processes of their own;
    each party's busy times, and with processes each one's (peak, start-up) memory in MiB (none with threads)."""
    plan = load_aggregator_plan(plan_path)
    if processes:
        # spawn, not fork: this process already runs gRPC's threads.
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        children = [context.Process(target=collaborator_process, args=(config, results)) for config in configs]
        for child in children:
            child.start()
        run_aggregator(plan)
        try:
            reported = [results.get(timeout=120) for _ in children]
        except queue.Empty:
            codes = [child.exitcode for child in children]
            raise RuntimeError(
                f"a collaborator process sent no timings (exit codes {codes}); see its output above"
            ) from None
        for child in children:
            child.join(60)
        return [busy for busy, _ in reported], [peak for _, peak in reported]
    collaborators = [BenchCollaborator(load_collaborator_config(config)) for config in configs]
    threads = [threading.Thread(target=collaborator.run, daemon=True) for collaborator in collaborators]
    # No table has d - 1 features: the collaborators skip loading theirs (BenchCollaborator.prepare).
    with mock.patch.object(collaborator_client, "load_local_data", lambda *_: None):
        for thread in threads:
            thread.start()
        run_aggregator(plan)
        for thread in threads:
            thread.join(60)
    return [collaborator.busy() for collaborator in collaborators], []


def reset_peak_rss() -> None:
    """Start this process's peak resident memory afresh (Linux's /proc/self/clear_refs), so that each
    configuration reports its own peak rather than the largest of the run so far."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # elsewhere the peak is the process's lifetime one (peak_rss_mb says so by falling back)


def resident_rss_mb() -> float:
    """This process's resident memory now, in MiB (VmRSS; where /proc is missing, the peak)."""
    return _status_mb("VmRSS:")


def peak_rss_mb() -> float:
    """This process's peak resident memory since :func:`reset_peak_rss`, in MiB (VmHWM; where /proc is
    missing, the lifetime peak)."""
    return _status_mb("VmHWM:")


def _status_mb(field: str) -> float:
    """`field` of /proc/self/status in MiB, or the lifetime peak (getrusage) where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


PARTY_BASE_BYTES = 450 * 2**20
"""A party process before the model: imports, configuration, identity, plan and kernels. Measured about 440 MB a
party at d = 10^6, n = 50 (50 processes took ~22 GB), and 396-505 MB at d = 10^7 with one 40 MB update in it."""
PARTY_MODEL_COPIES = 4
"""The float32 copies of the model (4 d bytes each) a party process holds at its peak: the update at start-up plus
what the rounds add (``party_model_copies``, measured 2.1-2.6 at d = 10^7 and 10^8), rounded up."""
AGGREGATOR_BASE_BYTES = 600 * 2**20
AGGREGATOR_PARTY_BYTES = 30 * 2**20
AGGREGATOR_MODEL_COPIES = 12
"""The aggregator (this process) at its peak: 600 MB, 30 MB a party and 12 copies of 4 d bytes, above every peak
measured (1,632-1,721 MB at d = 10^6, n = 50; 934 MB at 10^7, n = 3; 4,870 MB at 10^8, n = 3)."""


def processes_memory_need(dimension: int, parties: int) -> int:
    """The bytes a ``--processes`` federation of `parties` at `dimension` takes at its peak, conservatively.

    Every party process at :data:`PARTY_BASE_BYTES` plus :data:`PARTY_MODEL_COPIES` x 4 d bytes, and the
    aggregator's own (:data:`AGGREGATOR_BASE_BYTES` and its kin). Resident sizes summed count the pages the processes
    share once each, so the true need is lower.
    """
    party = PARTY_BASE_BYTES + PARTY_MODEL_COPIES * 4 * dimension
    aggregator = AGGREGATOR_BASE_BYTES + AGGREGATOR_PARTY_BYTES * parties + AGGREGATOR_MODEL_COPIES * 4 * dimension
    return parties * party + aggregator


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The bytes this machine can give new processes without swapping (MemAvailable); None where it is not said."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def memory_refusal(dimension: int, parties: int, available: int | None) -> str | None:
    """Why a ``--processes`` federation of `parties` at `dimension` should not start on a machine with `available`
    bytes free (None: it fits, or the machine does not say what it has)."""
    need = processes_memory_need(dimension, parties)
    if available is None or need <= available:
        return None
    party = PARTY_BASE_BYTES + PARTY_MODEL_COPIES * 4 * dimension
    fitting = max((available - AGGREGATOR_BASE_BYTES - AGGREGATOR_MODEL_COPIES * 4 * dimension), 0) // (
        party + AGGREGATOR_PARTY_BYTES
    )
    return (
        f"--processes at d = {dimension:,}, n = {parties} needs about {need / 2**30:.1f} GiB ({parties} party processes "
        f"of {party / 2**20:,.0f} MiB: {PARTY_BASE_BYTES // 2**20} MiB at start-up and {PARTY_MODEL_COPIES} float32 "
        f"copies of the model; the aggregator {(need - parties * party) / 2**30:.1f} GiB) but this machine has "
        f"{available / 2**30:.1f} GiB available (MemAvailable in /proc/meminfo); run at most {fitting} parties "
        "(--parties), the parties as threads of one process (leave out --processes), or pass --force to run anyway"
    )
