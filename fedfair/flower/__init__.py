"""FedSRCVaR in Flower: a strategy for Flower's server API and a client app that runs Algorithm 1's local steps.

    strategy = FedSRCVaRStrategy(rho=0.2, epsilon=0.1)          # fedfair.api.federate's defaults
    strategy.start(grid, initial_arrays(model_factory), num_rounds=200)
    theta, c = strategy.output()                                   # the suffix-averaged pair
    app = client_app(model_factory, load_data)                     # any PyTorch model and per-sample loss

Same seeds, split and batch schedule: the same (theta, c) as `fedfair.api.federate` (tests/flower/). The
optional extra ``fedfair-rcvar[flower]`` installs Flower; nothing else in fedfair imports this package.
Why, and what stays fedfair's own: docs/flower.md.
"""

from fedfair.flower.client import client_app
from fedfair.flower.settings import FlowerSettings
from fedfair.flower.strategy import FedSRCVaRStrategy, initial_arrays, output_model

__all__ = ["FedSRCVaRStrategy", "FlowerSettings", "client_app", "initial_arrays", "output_model"]
