"""Model bundles: a trained model with its architecture, encoder, threshold, plan, metrics and
provenance in one file that loads without running code, and `fedfair predict` / `evaluate` on it.

- ``write_bundle(path, bundle)`` / ``load_bundle(path)``: the file (``torch.load(weights_only=True)``).
- ``Bundle.build_model()``: the trained ``nn.Module``, ready to predict.
"""

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
