"""The files a collaborator keeps per federation, and the final model bundle it receives at FINISHED.

Each is kept beside the collaborator's config as NAME.FEDERATION.SUFFIX (the bindings of
:mod:`fedfair.runtime.collaborator.record`, the model bundle). The bundle is checked as
`fedfair predict` would load it; a failure to keep it costs the file, never the finished run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import grpc

from fedfair.bundle import load_bundle
from fedfair.core.errors import ConfigError, WireError
from fedfair.core.files import atomic_write
from fedfair.runtime.collaborator.config import CollaboratorConfig

logger = logging.getLogger("fedfair.collaborator")

BUNDLE_SUFFIX = "model_bundle.pt"
"""The federation's final model bundle is kept as NAME.FEDERATION.model_bundle.pt beside the config."""


def kept_path(config: CollaboratorConfig, federation_id: str, suffix: str) -> Path:
    """A file this collaborator keeps for one federation: beside its config, NAME.FEDERATION.SUFFIX."""
    return config.source.parent / f"{config.name}.{federation_id}.{suffix}"


def receive_bundle(name: str, path: Path, fetch: Callable[[], bytes]) -> None:
    """Fetch the final model bundle (`fetch`, the FINISHED task's input) and keep it at `path`, checked as
    `fedfair predict` would load it (plain tensors and JSON only); a failure costs the file, never the
    finished run."""
    try:
        payload = fetch()
        atomic_write(path, lambda stream: stream.write(payload))
        load_bundle(path)
    except (grpc.RpcError, WireError, ConfigError, OSError) as error:
        path.unlink(missing_ok=True)
        reason = error.code().name if isinstance(error, grpc.RpcError) else str(error)
        logger.warning(
            "%s: could not keep the federation's model bundle (%s); ask the aggregator's operator for "
            "model_bundle.pt from its output folder",
            name,
            reason,
        )
        return
    logger.info(
        "%s: the federation's model bundle is in %s (use it: fedfair predict --model %s --data TABLE "
        "--out PREDICTIONS.csv)",
        name,
        path,
        path,
    )
