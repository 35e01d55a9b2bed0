"""How much of the paper study ``fedfair reproduce`` runs: each profile's grids, rhos, seeds and rounds."""

from __future__ import annotations

from dataclasses import dataclass

from fedfair.core.config import DEFAULT_SERVER_MOMENTUM
from fedfair.research.arguments import PAPER_EPSILONS

TABLE_RHO = 0.1
"""The rho of the paper's FedMinMax table."""

DEFAULT_EPSILON = 0.05
"""FedSRCVaR's epsilon where a figure does not vary it (the paper's tau figure and table use 0.05)."""


@dataclass(frozen=True)
class Profile:
    """How much of the study to run: the grids, the rhos, the seeds and the rounds."""

    name: str
    rounds: int
    seeds: int
    rhos: tuple[float, ...]
    trade_off_rhos: tuple[float, ...]
    epsilons: tuple[float, ...]
    taus: tuple[int, ...]
    lr_scales: tuple[float, ...]
    """Step sizes every method tries, as multiples of its default step (fedfair's default is
    tuned to the objective's curvature; the paper's absolute grid assumes its own scaling).
    One grid for all, as the paper runs every approach over the same learning rates: at rho = 0.1
    the smallest steps, which barely move the model from its near-uniform start, can win."""
    fedsrcvar_epsilons: tuple[float, ...]
    """FedSRCVaR's epsilon near 0 in Figure 2, chosen on validation as the paper does."""
    fedavg_local_steps: tuple[int, ...]
    model: str = "logreg"
    adversary_lrs: tuple[float, ...] = (0.1,)
    """BPF's and FedMinMax's adversary step sizes (`--adversary-lr`), tried with every step multiple."""
    server_momenta: tuple[float, ...] = (DEFAULT_SERVER_MOMENTUM, 0.0)
    """The server momenta of FedSRCVaR and of the fairness baselines in `OWN_GRIDS`, each with its own
    default step (`momentum_step_scale`): where the best held-out worst group is a model barely moved from
    its start (RAND HIE at rho = 0.1), the plain step at the smallest multiple wins; where it must be fitted
    (MNIST), momentum does."""
    ladders: bool = False
    """Whether every method is tuned by the protocol of `fedfair.research.tuning` (absolute ladders, the same for
    the knobs all share, searched by the edge rule) instead of the grids above (multiples of each method's default
    step), which it then ignores."""


PROFILES = {
    "quick": Profile(
        name="quick",
        rounds=150,
        seeds=2,
        rhos=(0.1, 0.3, 0.5, 0.7),
        trade_off_rhos=(0.1, 0.5),
        epsilons=PAPER_EPSILONS,
        taus=(1, 5, 10),
        lr_scales=(1.0, 0.25, 0.05),
        fedsrcvar_epsilons=(0.01, 0.05),
        fedavg_local_steps=(1, 3),
        adversary_lrs=(0.1, 1.0, 10.0),
    ),
    "full": Profile(
        name="full",
        rounds=1000,
        seeds=3,
        rhos=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
        trade_off_rhos=(0.1, 0.3, 0.5, 0.7),
        epsilons=PAPER_EPSILONS,
        taus=(1, 5, 10),
        lr_scales=(2.0, 1.0, 0.25, 0.05, 0.01),
        fedsrcvar_epsilons=(0.001, 0.005, 0.01, 0.05),
        fedavg_local_steps=(3, 8, 15),
        model="mlp",
        adversary_lrs=(0.1, 1.0, 10.0),
    ),
    "table": Profile(
        name="table",
        rounds=400,
        seeds=3,
        rhos=(TABLE_RHO,),
        trade_off_rhos=(),
        epsilons=(),
        taus=(),
        lr_scales=(1.0, 0.25, 0.05, 0.01),
        fedsrcvar_epsilons=(DEFAULT_EPSILON,),
        fedavg_local_steps=(1, 3),
        model="mlp",
        adversary_lrs=(0.1, 1.0, 10.0),
    ),
}
PROFILES["figure1"] = Profile(
    name="figure1",
    rounds=200,
    seeds=2,
    rhos=(0.1, 0.3, 0.5, 0.7),
    trade_off_rhos=(),
    epsilons=(),
    taus=(),
    lr_scales=(1.0, 0.25, 0.05),
    fedsrcvar_epsilons=(0.01, 0.05),
    fedavg_local_steps=(1, 3),
    model="mlp",
    adversary_lrs=(0.1, 1.0),
)
"""quick: every figure on Adult in minutes; full: the paper's grids; table: only the comparison at
rho = 0.1 and epsilon = 0.05 with the MLP, the setting of the paper's headline claim; figure1: the
paper's Figure 1 panel (every method's worst-group risk, mean risk and disparity over rho) on a
smaller grid than full, so that every dataset fedfair holds fits on a few cores; tuned: figure1's rounds, seeds
and rhos, every method tuned by the protocol of `fedfair.research.tuning` (the same absolute ladders for the
knobs all share, its own knobs' ladders reaching their limit cases, no choice on an unmarked edge)."""
PROFILES["tuned"] = Profile(**{**PROFILES["figure1"].__dict__, "name": "tuned", "ladders": True})


# ---------------------------------------------------------------- the study
