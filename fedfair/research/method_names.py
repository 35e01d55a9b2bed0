"""The ``--method`` names, and which take which flags, without importing the methods (PyTorch).

The command line lists them in ``--help``, which must start at once; :mod:`fedfair.research.methods`
defines each method under these names, and tests/research/test_method_names.py holds the two equal.
"""

from __future__ import annotations

METHOD_NAMES = (
    "fedsrcvar",
    "fedavg",
    "fedavgm",
    "afl",
    "qfedavg",
    "fedminmax",
    "propfair",
    "term",
    "deltafl",
    "central-erm",
    "central-cvar",
    "bpf",
    "dro",
)
"""Every method by its --method name, in the order the command line lists them."""

RHO_FREE_METHODS = ("fedavg", "fedavgm", "afl", "qfedavg", "fedminmax", "propfair", "term", "deltafl", "central-erm")
"""Methods whose objective has no rho or epsilon: their step size is --baseline-lr, not one scaled by them."""

LOSS_METHODS = ("afl", "qfedavg", "fedminmax", "term", "deltafl")
"""Methods whose server reads the collaborators' losses at theta_t every round (--loss-rows bounds them)."""

MOMENTUM_METHODS = ("fedsrcvar", "fedavgm", "propfair", "term", "deltafl")
"""Methods that take --server-momentum: FedSRCVaR, FedAvgM, and the baselines tuned over the same server steps."""
