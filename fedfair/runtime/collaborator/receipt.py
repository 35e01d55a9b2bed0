"""The files a collaborator keeps per federation, and the final model bundle it receives at FINISHED.

Each is kept beside the collaborator's config as NAME.FEDERATION.SUFFIX (the bindings of
:mod:`fedfair.runtime.collaborator.input_record`, the model bundle). The bundle is checked as
`fedfair predict` would load it; a failure to keep it costs the file, never the finished run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from fedfair.bundle import load_bundle
from fedfair.core.errors import ConfigError, WireError
from fedfair.core.files import atomic_write
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.failures import EXIT_INCOMPLETE

logger = logging.getLogger("fedfair.collaborator")

BUNDLE_SUFFIX = "model_bundle.pt"
"""The federation's final model bundle is kept as NAME.FEDERATION.model_bundle.pt beside the config."""


def kept_path(config: CollaboratorConfig, federation_id: str, suffix: str) -> Path:
    """A file this collaborator keeps for one federation: beside its config, NAME.FEDERATION.SUFFIX."""
    return config.source.parent / f"{config.name}.{federation_id}.{suffix}"


def receive_bundle(name: str, path: Path, fetch: Callable[[], bytes]) -> Mapping[str, Any] | None:
    """Fetch the final model bundle (`fetch`, the FINISHED task's input) and keep it at `path`.

    It is checked as `fedfair predict` would load it (plain tensors and JSON only).

    Returns:
        The bundle's provenance (rounds run, applied rounds each institution contributed to), or None
        when no bundle could be kept: a failure costs the file, never the finished run.
    """
    try:
        payload = fetch()
        atomic_write(path, lambda stream: stream.write(payload))
        provenance = load_bundle(path).provenance
    except (grpc.RpcError, WireError, ConfigError, OSError) as error:
        path.unlink(missing_ok=True)
        reason = error.code().name if isinstance(error, grpc.RpcError) else str(error)
        logger.warning(
            "%s: could not keep the federation's model bundle (%s); ask the aggregator's operator for "
            "model_bundle.pt from its output folder",
            name,
            reason,
        )
        return None
    logger.info(
        "%s: the federation's model bundle is in %s (use it: fedfair predict --model %s --data TABLE "
        "--out PREDICTIONS.csv)",
        name,
        path,
        path,
    )
    return provenance


def finished_status(name: str, planned: int, provenance: Mapping[str, Any] | None, sent_here: int) -> int:
    """Log a collaborator's closing line at FINISHED and return its exit status.

    The bundle's provenance counts, across every process of this site, the applied rounds whose sum
    held its update; without a bundle only this process's uploads are known. A model built from fewer
    than the `planned` rounds with this site's update ends with :data:`EXIT_INCOMPLETE`, not 0.

    Args:
        name: this collaborator's name.
        planned: the pinned plan's number of rounds.
        provenance: what :func:`receive_bundle` returned.
        sent_here: training rounds this process uploaded an update for.
    """
    if provenance is not None:
        contributed = int(provenance.get("contributions", {}).get(name, 0))
        counted = f"its model holds this institution's update in {contributed} of {planned} rounds"
    else:
        contributed = sent_here
        counted = f"this process sent an update in {contributed} of its {planned} rounds (no bundle to count)"
    if contributed >= planned:
        logger.info("%s: the federation has finished; %s", name, counted)
        return 0
    logger.warning(
        "%s: the federation has finished, but %s: rounds aborted or ran without this site; the aggregator's "
        "rounds.jsonl says which and why (exit %d)",
        name,
        counted,
        EXIT_INCOMPLETE,
    )
    return EXIT_INCOMPLETE
