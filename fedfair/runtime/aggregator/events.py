"""The operator's machine-readable view: ``events.jsonl`` beside the checkpoints.

One JSON object per line, each with ``event`` (its kind) and ``time`` (seconds since
the epoch). The kinds and their fields:

The stream only ever grows: a resumed run appends to it (a ``start`` with ``resume``
true), so a round re-run after a crash appears twice and the later line describes
the model the checkpoints hold. Lines are flushed as written, so ``tail -f`` works.
Nothing in it is more than the aggregator already knows: names, timings, sizes and
aggregate figures, never a site's update.

Why: docs/design.md, "Inside the aggregator".
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

EVENTS_NAME = "events.jsonl"


class EventLog:
    """Appends events to `folder`/events.jsonl (thread-safe: gRPC threads and the round loop share it)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / EVENTS_NAME
        self._lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> None:
        """Append one event line; `fields` must be JSON values (NaN and infinities are written as null)."""
        record = {"event": event, "time": round(time.time(), 3), **fields}
        line = json.dumps(_finite(record), sort_keys=True, allow_nan=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as stream:
                stream.write(line)


def _finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def read_events(folder: Path) -> list[dict[str, Any]]:
    """Every event of `folder`/events.jsonl, oldest first (empty if there is none)."""
    path = folder / EVENTS_NAME
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
