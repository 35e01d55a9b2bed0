"""Log lines of the runtime processes (aggregator, collaborators): one format, on stderr and optionally a file."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
"""The levels ``--log-level`` accepts, quietest last."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def configure_logging(level: str = "INFO", file: Path | None = None) -> None:
    """Lines at `level` and above, with a timestamp, on stderr and (if given) appended to `file`.

    ``force``: a library imported earlier (Opacus does) may already have configured the
    root logger at WARNING, which would silently drop the round-by-round lines.
    """
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(file, encoding="utf-8"))
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, handlers=handlers, force=True)
