"""The light list of method names is the methods' own: same names, order and kinds."""

from __future__ import annotations

from fedfair.research.method_names import LOSS_METHODS, METHOD_NAMES, MOMENTUM_METHODS, RHO_FREE_METHODS
from fedfair.research.methods import METHODS


def test_the_method_names_are_the_methods_registry_in_its_order() -> None:
    assert tuple(METHODS) == METHOD_NAMES
    assert tuple(name for name, method in METHODS.items() if method.rho_free) == RHO_FREE_METHODS
    assert tuple(name for name, method in METHODS.items() if method.reads_losses) == LOSS_METHODS
    assert tuple(name for name, method in METHODS.items() if method.server_momentum is not None) == MOMENTUM_METHODS
