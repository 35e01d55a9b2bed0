"""One round_bench run of a source tree with each party's steps timed on its own thread's CPU clock.

    python benchmarks/round_profile.py TREE OUT.json [--live-memory] [--turns GO_FD,DONE_FD] -- ROUND_BENCH_ARGUMENTS...

Runs ``TREE/benchmarks/round_bench.py`` (TREE: this checkout, or another commit's checkout, which must then be
first on ``PYTHONPATH`` so that its ``fedfair`` is the one imported) with the collaborators as threads of this
process, and times every call of each step a party makes in a secure round (:data:`STEPS`: the encoding, the
client's step of each stage, the model chain's checks) on the calling thread's CPU clock
(``time.thread_time``), which no other thread's work and no wait reaches. No profiler runs: each step costs
what it costs without one. A step is keyed by the length of the sum it belongs to, so that a training round's
steps (d + 1 words) are told apart from an evaluation's. ``OUT.json`` gets round_bench's own summary
(``bench``) and, per step and length, the CPU seconds of each call (``steps``); ``round_compare.py`` reads
their medians (the warm-up round's calls, which load the compiled kernels, are a minority of them).

With ``--live-memory`` the run also traces every allocation Python and numpy make (``tracemalloc``, one frame): each
configuration's result gets ``live_peak_mb``, the most memory its federation held live at once beyond what the
process held as it started (``live_start_mb``), in MiB. That counts numpy arrays and Python objects (bytes and
messages), every party's and the aggregator's, the moment they are freed; unlike the peak resident memory, no
freed memory the allocator keeps and no page the host has yet to reclaim is in it. Torch tensors and gRPC's own
buffers are not traced. The tracing slows allocations, so the CPU figures of such a run are not compared.

Every run also accounts each round on its own (``rounds``, keyed by round number): per party, the user and system
CPU seconds and the minor and major page faults of the threads that ran its task handlers and round job, inside
them (``getrusage(RUSAGE_THREAD)`` around round_bench's own ``BenchCollaborator._timed``, the very intervals
round_bench's ``party_cpu_seconds`` counts, and their ``time.thread_time``); and the whole process's from the
round's start to the next one's (its ``process`` entry: the aggregator's and gRPC's threads too, and the round's
``span`` on the machine's monotonic clock, which every process reads alike). User time and the
faults counted are what the code does; system time and what each fault costs are what the host moves (a host that
reclaims freed pages makes the next writes into them fault and zero pages in the kernel). Linux splits a thread's
CPU time into user and system by tick samples and brings it up to date at each tick, so each interval's user and
system seconds are good to about a scheduler tick (1-10 ms); over a round's intervals the errors mostly cancel.

With ``--turns GO_FD,DONE_FD`` (inherited pipe descriptors; ``round_paired.py`` makes them) the run takes turns
with another: before each round the aggregator's loop starts (``RoundLoop.train``, the same name in every tree
compared) it reads one go byte from GO_FD, and once the round and whatever the loop does after it (evaluation,
checkpoint) are over, as the next round is about to start or the federation has ended, it writes one done byte to
DONE_FD. Only one tree's round runs at a time, and the coordinator decides whose.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import resource
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

STEPS: dict[str, tuple[str, str, str]] = {
    "encode": ("fedfair.secagg.encode", "Encoder", "encode"),
    "ADVERTISE": ("fedfair.secagg.client", "Client", "advertise"),
    "SHARE": ("fedfair.secagg.client", "Client", "share_keys"),
    "CHECK": ("fedfair.secagg.client", "Client", "check_shares"),
    "MASK": ("fedfair.secagg.client", "Client", "masked_input"),
    "CONSISTENCY": ("fedfair.secagg.client", "Client", "consistency"),
    "UNMASK": ("fedfair.secagg.client", "Client", "unmask"),
    "VERIFY_CLAIM (tag)": ("fedfair.secagg.client", "Client", "tag"),
    "VERIFY_TAGS (verify)": ("fedfair.secagg.client", "Client", "verify"),
    "chain: model sent": ("fedfair.runtime.collaborator.chain", "ModelChain", "sent"),
    "chain: sum verified": ("fedfair.runtime.collaborator.chain", "ModelChain", "verified"),
    "chain: anchor kept": ("fedfair.runtime.collaborator.chain_record", "AnchorRecord", "write"),
    "outcome: record saved": ("fedfair.runtime.collaborator.outcome", "OutcomeRecord", "_save"),
}
"""Each timed step: its label, then its module, class and method (the same names at every commit compared; a step
a tree lacks is not timed there). ``chain: anchor kept`` is part of ``chain: sum verified``: the anchor written
and synced before the site's verdict leaves (issue 97), which the reference 6692f28 did not keep. ``outcome: record
saved`` is one rewrite of the site's outcome record (its models included), which every round, plain or secure, makes
two or three of."""


def length_of(instance: Any, arguments: tuple[Any, ...]) -> int:
    """The length of the sum a step belongs to: its client's d + 1, the encoded values' + 1, the chain's words."""
    config = getattr(instance, "config", None)
    if config is not None and hasattr(config, "dimension"):
        return int(config.dimension) + 1
    for argument in arguments:
        size = getattr(argument, "size", None)
        if isinstance(size, int) and size > 1:
            return size + 1 if type(instance).__name__ == "Encoder" else size
    return 0


def timed(label: str, method: Callable[..., Any], calls: dict[str, dict[int, list[float]]]) -> Callable[..., Any]:
    """`method`, each call's CPU on its thread added to ``calls[label][length]``."""
    lock = threading.Lock()

    @functools.wraps(method)
    def step(instance: Any, *arguments: Any, **keywords: Any) -> Any:
        started = time.thread_time()
        try:
            return method(instance, *arguments, **keywords)
        finally:
            spent = time.thread_time() - started
            with lock:
                calls.setdefault(label, {}).setdefault(length_of(instance, arguments), []).append(spent)

    return step


def time_steps() -> dict[str, dict[int, list[float]]]:
    """Wrap every step of :data:`STEPS` that this tree has; the calls' CPU seconds, filled as they run."""
    calls: dict[str, dict[int, list[float]]] = {}
    for label, (module, owner, name) in STEPS.items():
        try:
            cls = getattr(importlib.import_module(module), owner, None)
        except ModuleNotFoundError:  # a step of a module the tree does not have (the reference's older layout)
            continue
        if cls is not None and hasattr(cls, name):
            setattr(cls, name, timed(label, getattr(cls, name), calls))
    return calls


def step_medians(documents: list[dict[str, Any]]) -> dict[str, float]:
    """Each step's median call over the runs' `documents`, at the longest sum it was called on (a training round's)."""
    medians: dict[str, float] = {}
    for label in sorted({label for document in documents for label in document["steps"]}):
        calls = [document["steps"].get(label, {}) for document in documents]
        longest = max(int(length) for call in calls for length in call)
        medians[label] = statistics.median(seconds for call in calls for seconds in call.get(str(longest), []))
    return medians


def usage_since(before: resource.struct_rusage, who: int) -> dict[str, float]:
    """The user and system CPU seconds and the minor and major page faults of `who` (a getrusage target) since
    `before`."""
    now = resource.getrusage(who)
    return {
        "user_seconds": now.ru_utime - before.ru_utime,
        "system_seconds": now.ru_stime - before.ru_stime,
        "minor_faults": now.ru_minflt - before.ru_minflt,
        "major_faults": now.ru_majflt - before.ru_majflt,
    }


class Turns:
    """This run's side of a lock-step with another run (``--turns``): a round starts on a go byte, and a done byte
    says it is over."""

    GO, DONE = b"g", b"d"

    def __init__(self, go: BinaryIO, done: BinaryIO) -> None:
        self.go, self.done = go, done
        self.holding = False

    def take(self) -> None:
        """Wait for this run's turn."""
        if self.go.read(1) != self.GO:
            raise RuntimeError(
                "the turns' coordinator went away (its go pipe closed): run round_compare.py --paired rather than "
                "round_profile.py --turns by hand"
            )
        self.holding = True

    def give(self) -> None:
        """End this run's turn, if it holds one."""
        if self.holding:
            self.done.write(self.DONE)
            self.holding = False


class Rounds:
    """Each round's CPU and page faults, per party and for the whole process, and with :class:`Turns` the lock-step.

    A round is open from its ``RoundLoop.train`` call to the next round's (or the federation's end), so the
    process's share counts what the loop does after the round (evaluation, checkpoint) too.
    """

    def __init__(self, turns: Turns | None) -> None:
        self.turns = turns
        self.setting = "plain"
        self.accounts: dict[str, dict[int, dict[str, Any]]] = {"plain": {}, "secure": {}}
        """Per setting and round: ``process`` (the process's usage in the round) and ``parties`` (each one's)."""
        self._open: tuple[int, float, float, resource.struct_rusage] | None = None
        self._lock = threading.Lock()

    def begin(self, round_number: int) -> None:
        """Round `round_number` of the current setting starts: the last one ends, and with turns this run waits."""
        self.end()
        if self.turns is not None:
            self.turns.take()
        self._open = (round_number, time.monotonic(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF))

    def end(self) -> None:
        """The open round (if any) ends: its process usage is kept, and with turns the other run's may start."""
        if self._open is not None:
            round_number, started, cpu, before = self._open
            account = self.accounts[self.setting].setdefault(round_number, {"parties": {}})
            account["process"] = {
                "cpu_seconds": time.process_time() - cpu,
                **usage_since(before, resource.RUSAGE_SELF),
                "span": [started, time.monotonic()],
            }
            self._open = None
        if self.turns is not None:
            self.turns.give()

    def add(self, party: str, round_number: int, cpu: float, usage: dict[str, float]) -> None:
        """One interval of `party`'s work on round `round_number`: its thread's CPU seconds and usage."""
        with self._lock:
            account = self.accounts[self.setting].setdefault(round_number, {"parties": {}})
            totals = account["parties"].setdefault(party, dict.fromkeys(["cpu_seconds", *usage], 0.0))
            totals["cpu_seconds"] += cpu
            for key, value in usage.items():
                totals[key] += value

    def loop(self, train: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        """The aggregator's ``RoundLoop.train``, each call beginning a round."""

        @functools.wraps(train)
        def round_started(loop: Any, round_number: int, *arguments: Any, **keywords: Any) -> dict[str, Any]:
            self.begin(round_number)
            return train(loop, round_number, *arguments, **keywords)

        return round_started

    def party(self, timed: Callable[..., Any]) -> Callable[..., Any]:
        """round_bench's ``BenchCollaborator._timed`` (one interval of a party's round), its thread's usage added."""

        @functools.wraps(timed)
        def interval(collaborator: Any, round_number: int, run: Callable[[], Any]) -> Any:
            before, cpu = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time()
            try:
                return timed(collaborator, round_number, run)
            finally:
                spent = time.thread_time() - cpu
                self.add(collaborator.config.name, round_number, spent, usage_since(before, resource.RUSAGE_THREAD))

        return interval

    def configuration(self, run: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        """round_bench's ``run_configuration`` (one federation, plain or secure: its third argument)."""

        @functools.wraps(run)
        def federation(*arguments: Any, **keywords: Any) -> dict[str, Any]:
            self.setting = "secure" if (arguments[2] if len(arguments) > 2 else keywords["secure"]) else "plain"
            try:
                return run(*arguments, **keywords)
            finally:
                self.end()

        return federation


def traced(configuration: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """round_bench's `configuration` (one federation), its live memory's peak added to its result (MiB)."""

    @functools.wraps(configuration)
    def run(*arguments: Any, **keywords: Any) -> dict[str, Any]:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = configuration(*arguments, **keywords)
        _, peak = tracemalloc.get_traced_memory()
        return {**result, "live_peak_mb": (peak - start) / 2**20, "live_start_mb": start / 2**20}

    return run


def command(
    tree: Path, out: Path, bench_arguments: list[str], *, live_memory: bool = False, turns: str | None = None
) -> list[str]:
    """The command line of one profiled run of `tree` writing `out` (see the module's notes)."""
    options = (["--live-memory"] if live_memory else []) + (["--turns", turns] if turns else [])
    return [sys.executable, str(Path(__file__).resolve()), str(tree), str(out), *options, "--", *bench_arguments]


def environment(tree: Path) -> dict[str, str]:
    """This process's environment with `tree` first on PYTHONPATH, so that its run imports the tree's ``fedfair``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tree", type=Path, help="the source tree whose round_bench runs")
    parser.add_argument("out", type=Path, help="where the profile's JSON goes")
    parser.add_argument("--live-memory", action="store_true", help="trace every allocation for the live peaks")
    parser.add_argument("--turns", help="GO_FD,DONE_FD: take turns round by round with another run")
    args = parser.parse_args(argv[:split])
    turns = None
    if args.turns is not None:
        go, _, done = args.turns.partition(",")
        turns = Turns(os.fdopen(int(go), "rb", buffering=0), os.fdopen(int(done), "wb", buffering=0))
    tree, out, arguments = args.tree.resolve(), args.out, argv[split + 1 :]
    sys.path.insert(0, str(tree / "benchmarks"))
    calls = time_steps()
    rounds = Rounds(turns)
    loop = importlib.import_module("fedfair.runtime.aggregator.loop").RoundLoop
    loop.train = rounds.loop(loop.train)
    bench_json = out.with_suffix(".bench.json")
    import round_bench  # noqa: PLC0415 (the tree's own, found once its folder is on the path)

    # Where the tree keeps its bench party: beside round_bench (6692f28) or in round_bench_parties (later).
    party = (
        getattr(round_bench, "BenchCollaborator", None)
        or importlib.import_module("round_bench_parties").BenchCollaborator
    )
    party._timed = rounds.party(party._timed)
    if args.live_memory:
        tracemalloc.start(1)
        round_bench.run_configuration = traced(round_bench.run_configuration)
    round_bench.run_configuration = rounds.configuration(round_bench.run_configuration)
    status = round_bench.main([*arguments, "--json", str(bench_json)])
    document = {
        "tree": str(tree),
        "bench": json.loads(bench_json.read_text()),
        "steps": calls,
        "rounds": rounds.accounts,
    }
    bench_json.unlink()
    out.write_text(json.dumps(document, indent=1) + "\n")
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
