"""Model bundles.

A trained model with its architecture, encoder, threshold, plan, metrics and provenance in one file that reads
as tensors and JSON only, and `fedfair predict` / `evaluate` on it.

- ``write_bundle(path, bundle)`` / ``load_bundle(path)``: the file (``torch.load(weights_only=True)``).
- ``Bundle.build_model(allowed=...)``: the trained ``nn.Module``, ready to predict; a model that a
  factory builds needs that "package.module:function" in ``allowed`` (``--allow-factory``), since
  importing it runs code.
- ``fedfair.bundle.commands``: the commands' functions (``fedfair.cli.predict``: their command lines);
  ``evaluate_composition`` also says who is in the worst-off group, cell by cell of the table's
  columns (``fedfair.bundle.composition``).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedfair.bundle.format import (
        BUNDLE_VERSION,
        Bundle,
        builtin_architecture,
        factory_architecture,
        load_bundle,
        make_provenance,
        write_bundle,
    )

__all__ = [
    "BUNDLE_VERSION",
    "Bundle",
    "builtin_architecture",
    "factory_architecture",
    "load_bundle",
    "make_provenance",
    "write_bundle",
]


def __getattr__(name: str) -> Any:
    """The names of :mod:`fedfair.bundle.format`, imported on first use.

    It loads PyTorch, which ``fedfair predict --help`` (and anything else that only names this package) should
    not wait for.
    """
    if name in __all__:
        from fedfair.bundle import format as bundle_format

        return getattr(bundle_format, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
