"""The site the record rows attack (TARGET, the fourth of the pinned federation) and what its record says.

Shared by the record scenario's modules (:mod:`attacks.record`, :mod:`attacks.lost_state`,
:mod:`attacks.plan_limits`) and the scenarios that reuse their federations (schedule, outcome, the model chain's rows).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attacks.federation import plan_sections
from attacks.pinned_federation import FEDERATION_ID, FOUR
from fedfair.runtime.collaborator.trainer import TrainerFactory
from fedfair.runtime.local.workspace import Workspace

TARGET = FOUR[-1]
THREE = FOUR[:3]
RUN_SECONDS = 90.0
PROCESS_SECONDS = 120.0


def real(name: str) -> TrainerFactory | None:
    """Each site's real learner on its Adult part."""
    return None


def bindings_path(workspace: Workspace, name: str) -> Path:
    return workspace.configs[name].parent / f"{name}.{FEDERATION_ID}.bindings.json"


def kept_path(workspace: Workspace, name: str) -> Path:
    return workspace.configs[name].parent / f"{name}.{FEDERATION_ID}.train.kept.npz"


def trainings(workspace: Workspace, name: str) -> int | None:
    """The training rounds `name`'s record counts (None: no readable record)."""
    try:
        return int(json.loads(bindings_path(workspace, name).read_text())["trainings"])
    except (OSError, ValueError, KeyError):
        return None


def sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@contextmanager
def trained_lines() -> Iterator[list[str]]:
    """The collaborators' "trained ... local steps" lines (INFO) while the block runs, one per training."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "local steps on batches" in message:
                lines.append(message)

    logger = logging.getLogger("fedfair.collaborator")
    handler, level = Collect(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def process_federation_plan(rounds: int, quorum: int, *, secure: bool = False) -> dict[str, dict[str, Any]]:
    """The plan of the rows with a collaborator process: `rounds` rounds of `quorum` sites or more."""
    return plan_sections(secure=secure, rounds=rounds, quorum=quorum, timeout=15.0)
