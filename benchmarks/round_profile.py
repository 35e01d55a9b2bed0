"""One round_bench run of a source tree with each party's steps timed on its own thread's CPU clock.

    python benchmarks/round_profile.py TREE OUT.json [--live-memory] -- ROUND_BENCH_ARGUMENTS...

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
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def main(argv: list[str]) -> int:
    live_memory = argv[2:3] == ["--live-memory"]
    if live_memory:
        argv = argv[:2] + argv[3:]
    if len(argv) < 3 or argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    tree, out, arguments = Path(argv[0]).resolve(), Path(argv[1]), argv[3:]
    sys.path.insert(0, str(tree / "benchmarks"))
    calls = time_steps()
    bench_json = out.with_suffix(".bench.json")
    import round_bench  # noqa: PLC0415 (the tree's own, found once its folder is on the path)

    if live_memory:
        tracemalloc.start(1)
        round_bench.run_configuration = traced(round_bench.run_configuration)
    status = round_bench.main([*arguments, "--json", str(bench_json)])
    document = {"tree": str(tree), "bench": json.loads(bench_json.read_text()), "steps": calls}
    bench_json.unlink()
    out.write_text(json.dumps(document, indent=1) + "\n")
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
