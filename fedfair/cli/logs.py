"""``fedfair logs PATH``: filter or follow a party's structured log, as text or JSON lines.

PATH is an aggregator's output folder (its ``events.jsonl``, the schema of
:data:`fedfair.runtime.observe.events.EVENTS`) or any party's log file (``NAME.log``,
``aggregator.log``), whose lines are read as ``log`` events of the same shape: ``event``,
``time``, ``level``, ``message``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.runtime.observe.events import EVENTS
from fedfair.runtime.output_folder import EVENTS_NAME
from fedfair.runtime.observe.logs import LOG_LEVELS

FOLLOW_SECONDS = 0.5
"""How often ``--follow`` looks for new lines."""

LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"
"""How logging's default ``asctime`` writes a line's time (fedfair.runtime.observe.logs.LOG_FORMAT), local time."""

NAMED = ("name", "participants", "contributors", "collaborators", "held_up_by", "epsilon")
"""The fields of an event that name sites: ``--site`` keeps the events whose fields name it."""


def _source(path: Path) -> Path:
    """The file to read for `path`: a folder's events.jsonl, or the file itself."""
    if path.is_dir():
        events = path / EVENTS_NAME
        if not events.is_file():
            raise ConfigError(
                f"{path} holds no {EVENTS_NAME}: give an aggregator's output folder, or a party's log file "
                "(a collaborator's NAME.log beside its config)"
            )
        return events
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: give an aggregator's output folder or a party's log file")
    return path


def _log_line(line: str) -> dict[str, Any] | None:
    """A text log line as a ``log`` event, or None for a continuation line (a traceback's)."""
    parts = line.split(" ", 3)
    if len(parts) < 3 or parts[2] not in (*LOG_LEVELS, "CRITICAL"):
        return None
    try:
        moment = dt.datetime.strptime(f"{parts[0]} {parts[1]}", LOG_TIME)
    except ValueError:
        return None
    message = parts[3] if len(parts) > 3 else ""
    return {"event": "log", "time": round(moment.timestamp(), 3), "level": parts[2], "message": message}


class Reader:
    """The records of one file, read on from where the last read stopped (so ``--follow`` sees only new ones)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.json = path.suffix == ".jsonl"
        self.offset = 0
        self.pending: dict[str, Any] | None = None
        """A text log's last record, held until the next line shows whether more of its message follows."""

    def read(self, *, final: bool = False) -> Iterator[dict[str, Any]]:
        """The whole lines added since the last read; `final`: also a held text record."""
        with self.path.open("rb") as stream:
            stream.seek(self.offset)
            data = stream.read()
        whole = data[: data.rfind(b"\n") + 1]  # a line without its newline is still being written
        self.offset += len(whole)
        for raw in whole.decode("utf-8", errors="replace").splitlines():
            if not raw.strip():
                continue
            if self.json:
                try:
                    yield json.loads(raw)
                except ValueError as error:
                    raise ConfigError(f"{self.path}: a line is not JSON ({error}): {raw[:80]}") from None
                continue
            record = _log_line(raw)
            if record is None:
                if self.pending is not None:
                    self.pending["message"] += "\n" + raw
                continue
            if self.pending is not None:
                yield self.pending
            self.pending = record
        if final and self.pending is not None:
            yield self.pending
            self.pending = None


def passes(record: dict[str, Any], args: argparse.Namespace) -> bool:
    """Whether `record` passes the command line's filters."""
    if args.event and record.get("event") not in args.event:
        return False
    if args.round is not None and record.get("round") != args.round:
        return False
    if args.level is not None and "level" in record:
        order = (*LOG_LEVELS, "CRITICAL")
        if order.index(record["level"]) < order.index(args.level):
            return False
    if args.site is not None:
        if record.get("event") == "log":
            return args.site in str(record.get("message", ""))
        return any(_names(record.get(key), args.site) for key in NAMED)
    return True


def _names(value: Any, site: str) -> bool:
    if isinstance(value, str):
        return value == site
    if isinstance(value, (list, tuple, dict)):
        return site in value
    return False


FIELD_CHARACTERS = 72
"""The most characters of one field a text line shows (``--json`` gives every field whole)."""


def _shown(value: Any) -> str:
    """A field's value for a person: numbers to 4 significant digits, lists and maps flat, long ones cut."""
    if isinstance(value, bool) or value is None:
        said = json.dumps(value)
    elif isinstance(value, float):
        said = f"{value:.4g}"
    elif isinstance(value, (str, int)):
        said = str(value)
    elif isinstance(value, dict):
        said = ",".join(f"{key}:{_shown(item)}" for key, item in value.items()) or "-"
    elif isinstance(value, (list, tuple)):
        said = ",".join(_shown(item) for item in value) or "-"
    else:
        said = str(value)
    return said if len(said) <= FIELD_CHARACTERS else said[: FIELD_CHARACTERS - 3] + "..."


def text(record: dict[str, Any]) -> str:
    """`record` as one line for a person: its time (UTC), its kind, then its fields, each cut to a readable length."""
    moment = record.get("time")
    when = (
        dt.datetime.fromtimestamp(moment, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        if isinstance(moment, (int, float))
        else "?"
    )
    if record.get("event") == "log":
        return f"{when} {record.get('level', '?'):<7} {record.get('message', '')}"
    fields = " ".join(f"{key}={_shown(value)}" for key, value in record.items() if key not in ("event", "time"))
    return f"{when} {record.get('event', '?'):<11} {fields}"


def _check_site(site: str, records: list[dict[str, Any]], path: Path) -> None:
    """Refuse a ``--site`` that an event log's roster does not name (a log file names no roster)."""
    roster = {
        str(name) for record in records if record.get("event") == "start" for name in record.get("collaborators", ())
    }
    if roster and site not in roster:
        raise ConfigError(
            f"--site {site}: {path} names no such site; its federation's sites are {', '.join(sorted(roster))}"
        )


def _logs_command(args: argparse.Namespace) -> int:
    reader = Reader(_source(args.path))
    everything = list(reader.read(final=not args.follow))
    if args.site is not None:
        _check_site(args.site, everything, reader.path)
    records = [record for record in everything if passes(record, args)]
    shown = records[-args.tail :] if args.tail else records
    finished = any(record.get("event") == "finish" for record in records)

    def show(record: dict[str, Any]) -> None:
        print(json.dumps(record, sort_keys=True) if args.json else text(record), flush=True)

    for record in shown:
        show(record)
    # Following ends when the aggregator says it finished (an event log), or at Ctrl-C.
    try:
        while args.follow and not finished:
            time.sleep(FOLLOW_SECONDS)
            for record in reader.read():
                finished = finished or record.get("event") == "finish"
                if passes(record, args):
                    show(record)
    except KeyboardInterrupt:
        return 0
    finally:
        sys.stdout.flush()
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair logs PATH [filters] [--follow] [--json]`."""
    parser = subparsers.add_parser(
        "logs",
        help="filter or follow a party's structured log (events.jsonl, or a NAME.log), as text or JSON",
        description="Show a party's structured log: an aggregator's output folder (its events.jsonl) or a log "
        "file of any party, whose lines read as events of kind 'log'. Filters combine; --follow prints new "
        "lines as they come, until the aggregator's 'finish' event (or Ctrl-C).",
    )
    parser.add_argument("path", type=Path, metavar="PATH", help="an aggregator's output folder, or a party's log file")
    parser.add_argument(
        "--event", action="append", choices=[*EVENTS, "log"], metavar="KIND", help="only events of KIND (repeatable)"
    )
    parser.add_argument(
        "--site", metavar="NAME", help="only events (or log lines) that name the site NAME (one of the roster)"
    )
    parser.add_argument("--round", type=int, metavar="N", help="only events of round N")
    parser.add_argument("--level", choices=LOG_LEVELS, help="only log lines at LEVEL or above")
    parser.add_argument("--tail", type=int, default=0, metavar="N", help="only the last N matching lines at first")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new lines as they are written")
    parser.add_argument(
        "--json", action="store_true", help="print each event whole, as one JSON line (default: readable text)"
    )
    parser.set_defaults(handler=_logs_command)
