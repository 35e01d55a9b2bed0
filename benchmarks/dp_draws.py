"""A DP study's runs kept as they finish, so that an interrupted study resumes where it stopped.

A DP run's noise and Poisson samples come from the OS's CSPRNG, not from its seed: the same flags give a new
draw each time, so no run is cached by its flags alone. `Draws` keeps every draw of a (split, flags) key in the
order it was trained, one JSON line each, and a resumed study takes the first draws it needs from the file
before it trains more. On a shared machine a study of many DP runs (`benchmarks/dp_stretch.py --select`) then
accrues across sessions instead of starting again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Key = tuple[str, ...]
"""A run's split followed by its flags."""


class Draws:
    """Each key's draws so far, appended to a JSON-lines file as each one finishes (no file: kept in memory)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.kept: dict[Key, list[dict[str, Any]]] = {}

    def open(self, path: Path) -> None:
        """Keep the draws in `path` from now on, after reading the draws an earlier study left there."""
        self.path = path
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    self.kept.setdefault(tuple(record["key"]), []).append(record["result"])

    def take(
        self, split: str, flags: Sequence[str], count: int, train: Callable[[], dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The first `count` draws of (split, flags): those kept, then `train()`'s, each kept as it finishes."""
        key = (split, *flags)
        kept = self.kept.setdefault(key, [])
        while len(kept) < count:
            result = train()
            kept.append(result)
            if self.path is not None:
                with self.path.open("a") as handle:
                    handle.write(json.dumps({"key": list(key), "result": result}) + "\n")
        return kept[:count]
