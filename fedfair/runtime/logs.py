"""Log lines of the runtime processes (aggregator, collaborators): one format, on stderr."""

from __future__ import annotations

import logging
import sys


def configure_logging() -> None:
    """INFO lines with a timestamp on stderr.

    ``force``: a library imported earlier (Opacus does) may already have configured the
    root logger at WARNING, which would silently drop the round-by-round lines.
    """
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr, force=True
    )
