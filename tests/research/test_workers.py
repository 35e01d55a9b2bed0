"""Study workers (fedfair.research.workers) on a machine with a GPU: they still train after the caller ran autograd.

Skipped cleanly on machines without CUDA: a CPU build of PyTorch starts no device threads,
so forking after a backward pass is harmless there and the failure cannot show.
"""

from __future__ import annotations

import math

import torch

from fedfair.research.experiment import load_federation
from fedfair.research.flags import parse_flags
from fedfair.research.sweep import grid_configs, sweep
from tests.core.gpu_helpers import GPU_ONLY

pytestmark = GPU_ONLY


def test_sweep_workers_train_after_the_caller_ran_a_backward_pass() -> None:
    # The caller's first backward pass starts autograd's per-device threads; a worker forked
    # from it afterwards would refuse its own backward pass.
    weight = torch.ones(3, requires_grad=True)
    (weight * 2.0).sum().backward()
    configs = grid_configs(parse_flags(["--rounds", "5", "--dataset", "adult", "--device", "cuda"]), [0.1], [0.2, 0.5])
    rows = sweep(configs, load_federation(configs[0]), jobs=2)
    assert [row["rho"] for row in rows] == [0.2, 0.5]
    assert all(math.isfinite(row["worst_risk"]) for row in rows)
