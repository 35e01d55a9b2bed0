"""How a benchmark script publishes its figures: one JSON document, printed and, with ``--json
PATH``, written, stamped with what ran it (the command, the machine, the date) so that
``benchmarks/report.py`` can say where every figure in ``docs/benchmarks.md`` comes from."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any


def provenance(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The command (as run from the repository root), the machine and the date of a measurement."""
    script = Path(sys.argv[0])
    arguments = list(sys.argv[1:] if argv is None else argv)
    return {
        "command": " ".join(["python", f"benchmarks/{script.name}", *arguments]),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": metadata.version("torch"),
        },
        "date": dt.date.today().isoformat(),
    }


def publish(document: Mapping[str, Any], path: Path | None, argv: Sequence[str] | None = None) -> None:
    """Print `document` with its provenance as JSON and, given a `path`, write it there too."""
    text = json.dumps({**document, "provenance": provenance(argv)}, indent=2)
    print(text)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
