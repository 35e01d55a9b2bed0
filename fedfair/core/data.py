"""A collaborator's samples and the two rules that tie its mini-batches to the federation.

`client_seed` and the batch-size rules are shared by the simulation and the real
collaborator process, which is what makes a federation of processes draw the same
mini-batches as the in-process simulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedfair.core.errors import ConfigError


@dataclass(frozen=True)
class ClientData:
    """One collaborator's samples: standardised features and class labels."""

    name: str
    features: torch.Tensor
    labels: torch.Tensor

    @property
    def size(self) -> int:
        """n_k, the number of samples (rows of `features`, entries of `labels`)."""
        return int(self.labels.shape[0])


def client_batch_sizes(sizes: Sequence[int], total: int) -> list[int]:
    """b_k proportional to n_k summing to `total` (largest remainders), each in [1, n_k]; 0 gives n_k."""
    if total == 0:
        return list(sizes)
    if total < len(sizes):
        raise ConfigError(f"batch size {total} is smaller than the {len(sizes)} clients; each needs at least 1 sample")
    if total > sum(sizes):
        raise ConfigError(f"batch size {total} exceeds the {sum(sizes)} training samples; lower --batch-size or pass 0")
    exact = np.asarray(sizes, dtype=np.float64) * total / sum(sizes)
    shares = np.maximum(np.floor(exact).astype(int), 1)
    for index in np.argsort(-(exact - np.floor(exact)), kind="stable"):
        if shares.sum() >= total:
            break
        shares[index] += 1
    return [int(min(share, size)) for share, size in zip(shares, sizes)]


def local_batch_size(num_samples: int, fraction: float) -> int:
    """b_k = round(fraction * n_k), at least 1: proportional to n_k without knowing the others' sizes."""
    return int(min(max(round(fraction * num_samples), 1), num_samples))


def client_seed(seed: int, index: int) -> int:
    """Collaborator `index`'s sampler seed.

    Distinct per client, and the same in the simulation and in the real collaborator process, so both draw the
    same mini-batches.
    """
    return seed * 1_000_003 + index
