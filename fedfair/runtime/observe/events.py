"""The operator's machine-readable view: ``events.jsonl`` beside the checkpoints.

One JSON object per line, each with ``event`` (its kind) and ``time`` (seconds since
the epoch); :data:`EVENTS` is the schema, the one that ``fedfair logs``, the metrics
endpoint, the status page and ``fedfair status`` all read (docs/operations.md).
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
from fedfair.runtime.output_folder import EVENTS_NAME

EVENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "start": (
        ("federation_id", "pid", "resume", "first_round", "rounds", "collaborators", "plan_digest", "auditor"),
        "the aggregator process started (or resumed) serving the plan with this digest (auditor: the input bound's "
        "second verifier, null without the bound)",
    ),
    "monitoring": (("url",), "the monitoring endpoint listens at url (/metrics, /status)"),
    "connect": (("name",), "a collaborator opened its task stream (rate-limited per peer, like the log)"),
    "disconnect": (("name",), "a collaborator's last task stream ended"),
    "waiting": (
        ("round", "goal", "connected", "eligible", "missing", "seconds_left", "stage"),
        "the aggregator waits for collaborators, naming who is missing (every 10 s while it waits; seconds_left "
        "null: no deadline): before a round for `goal` (the quorum, everyone, the auditor), `connected` of "
        "`eligible` there; or at the round's `stage` for its uploads (`goal`: key advertisements, masked inputs, "
        "...), `connected` of `eligible` answered",
    ),
    "waited": (("round", "goal"), "a stage's wait that a `waiting` event named is over (the stage settled or closed)"),
    "round_start": (("round", "participants"), "a round starts with these collaborators: any wait before it is over"),
    "statistics": (("contributors", "rows", "features"), "the statistics aggregation (round 0) made the encoder"),
    "status": (("round", "name", "status", "epsilon"), "a collaborator reported its privacy spent or budget spent"),
    "exclusion": (("round", "name", "reason"), "a collaborator misbehaved and sits out every later round"),
    "readmission": (("round", "name", "reason"), "an operator re-admitted an excluded collaborator (--readmit)"),
    "refusal": (("rpc", "name", "code", "reason", "unlogged"), "a call was refused (rate-limited per caller)"),
    "round": (
        (
            "round",
            "status",
            "participants",
            "contributors",
            "seconds",
            "bytes",
            "objective",
            "epsilon",
            "held_up_by",
        ),
        "a round finished (applied or aborted): stage seconds, bytes received, the latest estimate, shared epsilons",
    ),
    "finish": (("rounds", "output"), "the last round is done and the final model exported"),
    "stop": (
        ("reason", "status"),
        "the aggregator stopped before its last round: why (the error line with its fix, or the signal that "
        "stopped it) and its exit status",
    ),
}
"""Each event kind: the fields it may carry beside ``event`` and ``time``, and what it means.

tests/runtime/test_events_schema.py holds every ``emit`` in fedfair to it, and ``fedfair logs --event`` names
these kinds."""


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


def null_non_finite(value: dict[str, Any] | list[Any], found: list[str], where: str = "") -> None:
    """Set every non-finite float inside `value` (dicts and lists, at any depth) to None, its path added to `found`.

    In place, for a record other writers hold too (:func:`fedfair.runtime.aggregator.checkpoint.append_round_log`);
    an event's fields are copied instead (:meth:`EventLog.emit`). A path reads "evaluation.mean_risk (nan)".
    """
    keys: list[Any] = list(value) if isinstance(value, dict) else list(range(len(value)))
    container: Any = value  # a dict by its keys or a list by its indices: both set by [key]
    for key in keys:
        item = container[key]
        path = f"{where}[{key}]" if isinstance(value, list) else f"{where}.{key}".lstrip(".")
        if isinstance(item, tuple):  # JSON writes a tuple as a list: one it can change in place
            item = container[key] = list(item)
        if isinstance(item, float) and not math.isfinite(item):
            found.append(f"{path} ({item})")
            container[key] = None
        elif isinstance(item, (dict, list)):
            null_non_finite(item, found, path)


def read_events(folder: Path) -> list[dict[str, Any]]:
    """Every event of `folder`/events.jsonl, oldest first (empty if there is none).

    A last line without its newline is one being written now, and is left for the next read.
    """
    return whole_lines(folder / EVENTS_NAME)


def whole_lines(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of `path` but a last one still being written (no newline yet); empty if no file."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    whole = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]
