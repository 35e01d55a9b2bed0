"""fedfair: federated learning that protects every large enough subgroup.

Minimises RCVaR (a blend of the mean loss and the mean loss of the worst
rho-fraction of all samples) with FedSRCVaR, exchanging only the model and one
scalar threshold, under secure aggregation.

From Python: ``fedfair.RCVaRLoss`` is the objective as a loss module for any
training loop; ``fedfair.api.federate`` trains your own model across institutions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedfair.core.objective import RCVaRLoss

__version__ = "0.1.0"

__all__ = ["RCVaRLoss", "__version__"]


def __getattr__(name: str) -> object:
    # Loaded on first use: `import fedfair` (the CLI, plan reading) must not pay for importing torch.
    if name == "RCVaRLoss":
        from fedfair.core.objective import RCVaRLoss

        return RCVaRLoss
    raise AttributeError(f"module 'fedfair' has no attribute {name!r}")
