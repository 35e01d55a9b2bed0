"""Log lines of the runtime processes (aggregator, collaborators): a quiet console and a full log file.

The console of a process is a tool, not a log: it shows one progress bar (round, ETA, the latest
worst-group and mean risk) and the lines worth a person's attention (connections, warnings, and
last the closing line, :data:`CLOSING_LINE`). Per-round lines (a round applied, a round trained, an
evaluation), marked with :func:`per_round`, and routine repeats (a retry while the aggregator starts),
with :data:`LOG_FILE_ONLY`, go to the log file, and to the console only with ``verbose``. Lines at
WARNING and above always reach the console. gRPC's own C-core logging (handshake failures, say,
which the processes report in their own words) is off unless ``GRPC_VERBOSITY`` asks for it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO

from fedfair.core.errors import DISK_FULL
from fedfair.runtime.observe.progress import Progress

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
"""The levels ``--log-level`` accepts, quietest last."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"

ROUND = "fedfair_round"
"""The attribute :func:`per_round` sets on a per-round record: (round, rounds)."""

ESTIMATE = "fedfair_estimate"
"""The attribute :func:`per_round` sets on a record that carries an evaluation: its estimate, in words."""

ROUTINE = "fedfair_routine"
"""The attribute :data:`LOG_FILE_ONLY` sets on a record."""

LOG_FILE_ONLY: Mapping[str, object] = MappingProxyType({ROUTINE: True})
"""The ``extra`` of a line below WARNING that the console shows only with ``verbose``: a routine repeat
whose first occurrence the console already showed."""

CLOSING = "fedfair_closing"
"""The attribute :data:`CLOSING_LINE` sets on a record."""

CLOSING_LINE: Mapping[str, object] = MappingProxyType({CLOSING: True})
"""The ``extra`` of a process's closing line (what it kept, where, the outcome): the console ends its
progress bar first, so that this line is the last one a person reads."""


def per_round(round_number: int, rounds: int, *, note: str | None = None) -> dict[str, Any]:
    """The ``extra`` of a per-round log line: ``logger.info("round %d applied", n, extra=per_round(n, total))``.

    The console moves its bar to `round_number` of `rounds` instead of printing the line, unless the process
    runs with ``verbose``; `note` (the evaluation's estimate in
    :func:`fedfair.runtime.report.verdicts.progress_note`'s form, naming its round) stays beside the bar until
    the next one replaces it.
    """
    extra: dict[str, Any] = {ROUND: (round_number, rounds)}
    if note is not None:
        extra[ESTIMATE] = note
    return extra


class Console(logging.Handler):
    """The console: per-round records move one progress bar, every other record is a line.

    Lines are written through the bar (:meth:`Progress.write`) so that neither garbles the other;
    the bar exists from the first per-round record on, sized by the rounds that record names.
    """

    def __init__(self, label: str, stream: TextIO | None = None, *, verbose: bool = False) -> None:
        super().__init__()
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.verbose = verbose
        self.progress: Progress | None = None
        self.note = ""

    def emit(self, record: logging.LogRecord) -> None:
        """Write `record`, or advance the progress bar for a routine per-round line unless verbose.

        Never raises: a failure goes to logging's own :meth:`handleError`.
        """
        try:
            position = getattr(record, ROUND, None)
            if position is not None:
                self._advance(record, *position)
            routine = position is not None or getattr(record, ROUTINE, False)
            if routine and not self.verbose and record.levelno < logging.WARNING:
                return
            if getattr(record, CLOSING, False) and self.progress is not None:
                self.progress.close()  # its held 100% line comes before the closing line, not after
            text = self.format(record) + "\n"
            if self.progress is not None:
                self.progress.write(text)
            else:
                self.stream.write(text)
                self.stream.flush()
        except Exception:  # noqa: BLE001 -- logging's own contract: a failing handler reports, never raises
            self.handleError(record)

    def _advance(self, record: logging.LogRecord, round_number: int, rounds: int) -> None:
        note = getattr(record, ESTIMATE, None)
        if note is not None:
            self.note = note
        if self.progress is None:
            self.progress = Progress(rounds, self.label, stream=self.stream, log=self.stream, hold_last=True)
        self.progress.update(round_number, self.note)

    def close(self) -> None:
        """End the progress bar, if one was drawn, then close the handler."""
        if self.progress is not None:
            self.progress.close()
        super().close()


class LogFile(logging.FileHandler):
    """A process's log file, every line appended; on a full disk, one warning on stderr, not a traceback a line.

    Lines that do not fit are left out of the file (the console still shows the ones it shows): the process
    goes on, and its next write of state, which must not be lost, stops it with the disk named.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8")
        self.full = False

    def flush(self) -> None:
        """Push the lines to the file; on a full disk, keep them buffered and say so once."""
        with self._unless_full():
            super().flush()

    def close(self) -> None:
        """Close the file; lines a full disk cannot take are lost (already said)."""
        with self._unless_full():
            super().close()

    def handleError(self, record: logging.LogRecord) -> None:
        """Say once that the disk is full; any other failure goes to logging's own report."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            self._say_full(error)
        else:
            super().handleError(record)

    @contextmanager
    def _unless_full(self) -> Iterator[None]:
        """Run the block; a full disk is said once (any other OSError propagates)."""
        try:
            yield
        except OSError as error:
            if error.errno not in DISK_FULL:
                raise
            self._say_full(error)

    def _say_full(self, error: OSError) -> None:
        if not self.full:
            self.full = True
            sys.stderr.write(
                f"fedfair: warning: the disk is full writing {self.baseFilename} ({error.strerror}): the lines that "
                "do not fit are left out of it; free space there\n"
            )


def quiet_grpc() -> None:
    """Turn gRPC's C-core logging off unless GRPC_VERBOSITY already says otherwise.

    Call it before gRPC starts (its core reads the variable when it initialises).
    """
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def configure_logging(
    level: str = "INFO", file: Path | None = None, *, label: str = "rounds", verbose: bool = False
) -> None:
    """Lines at `level` and above.

    On the console (:class:`Console`, per-round lines as a bar unless `verbose`) and, if given, every one of
    them appended to `file`.

    ``force``: a library imported earlier (Opacus does) may already have configured the
    root logger at WARNING, which would silently drop the round-by-round lines.
    """
    quiet_grpc()
    formatter = logging.Formatter(LOG_FORMAT)
    console = Console(label, verbose=verbose)
    handlers: list[logging.Handler] = [console]
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(LogFile(file))
    for handler in handlers:
        handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=handlers, force=True)
