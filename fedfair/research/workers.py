"""The worker processes that studies (`fedfair sweep`, `fedfair reproduce`) fan their runs out to.

Workers are forked from a fresh server process, never from the caller. Why: on a machine
with a GPU, PyTorch's autograd engine starts per-device threads at the caller's first
backward pass (a benchmark's, a notebook's), and a child forked after that refuses every
backward pass ("Unable to handle autograd's threading in combination with fork-based
multiprocessing"); CUDA itself cannot be used in a forked child either. The server imports
the simulation once, so each worker still starts without importing PyTorch again.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

# What the server imports before it forks workers: everything a run needs, PyTorch included.
_PRELOADED = ["fedfair.simulation.rounds"]


def process_pool(workers: int) -> ProcessPoolExecutor:
    """`workers` processes, each free to train on the CPU or the GPU whatever the caller did first."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOADED)
    return ProcessPoolExecutor(max_workers=workers, mp_context=context)
