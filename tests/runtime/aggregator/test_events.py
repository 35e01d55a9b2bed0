"""The operator's events stream: one strict JSON object per line, appended, readable line by line."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from fedfair.runtime.output_folder import EVENTS_NAME
from fedfair.runtime.observe.events import EventLog, read_events


def test_events_are_strict_json_lines_even_from_many_threads(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    log.emit("round", round=1, seconds={"total": float("nan")}, participants=("a", "b"))
    threads = [threading.Thread(target=log.emit, args=("connect",), kwargs={"name": f"n{i}"}) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = (tmp_path / EVENTS_NAME).read_text().splitlines()
    assert len(lines) == 21
    parsed = [json.loads(line) for line in lines]  # strict: a NaN would not parse in other readers
    assert parsed[0]["seconds"] == {"total": None} and parsed[0]["participants"] == ["a", "b"]
    assert all("time" in event for event in parsed)
    assert sorted(event["name"] for event in parsed[1:]) == sorted(f"n{i}" for i in range(20))
    assert read_events(tmp_path) == parsed
    assert read_events(tmp_path / "missing") == []
