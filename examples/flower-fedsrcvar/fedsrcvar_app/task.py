"""The task both apps share: the model, Adult split by race, the held-out worst-decile risk."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional

from fedfair.core.objective import cvar
from fedfair.datasets import load_dataset, partition

if TYPE_CHECKING:  # the model factory imports without Flower, so fedfair's own runtime can name it in a plan
    from flwr.app import Context

SITES = 3
"""White, Black and Other: the paper's split of Adult by race."""


def model() -> nn.Module:
    """The model every site trains: an MLP over Adult's 107 standardised features."""
    return nn.Sequential(nn.Linear(107, 32), nn.ReLU(), nn.Linear(32, 2))


def adult_by_race() -> list[tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]:
    """Each site's (training rows, held-out rows), in partition order."""
    dataset = load_dataset("adult")
    sites = []
    for split in partition(dataset, "race", SITES, seed=0):
        train = (
            torch.from_numpy(dataset.x_train[split.train_index]),
            torch.from_numpy(dataset.y_train[split.train_index]),
        )
        test = (torch.from_numpy(dataset.x_test[split.test_index]), torch.from_numpy(dataset.y_test[split.test_index]))
        sites.append((train, test))
    return sites


def site_rows(context: Context) -> tuple[torch.Tensor, torch.Tensor]:
    """The training rows of the site this SuperNode is (its node config's partition-id)."""
    return adult_by_race()[int(context.node_config["partition-id"])][0]


@torch.no_grad()
def held_out_risks(trained: nn.Module) -> dict[str, float]:
    """Mean and worst-decile (CVaR at 0.1) cross-entropy over every site's held-out rows pooled."""
    features = torch.cat([test[0] for _, test in adult_by_race()])
    labels = torch.cat([test[1] for _, test in adult_by_race()])
    losses = functional.cross_entropy(trained(features), labels, reduction="none").double().numpy()
    return {"mean_risk": float(losses.mean()), "worst_decile_risk": cvar(losses, 0.1)}
