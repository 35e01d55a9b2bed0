"""Progress of long research commands (`simulate`, `sweep`, `launch`): one way, two renderings.

On a terminal a `tqdm` bar with the rate and the time left; when the stream is a
pipe or a file (CI logs, `| tee`, `nohup`) a bar's carriage returns would make one
unreadable line, so it prints whole lines instead: one each time another tenth of
the work is done, and at least every `interval_s` seconds while it is slow, each
with the elapsed time and the ETA.

A `Progress` is also where log lines go while it runs (`write`), so that a child
process's log and the bar do not overwrite each other on a terminal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Never, Self, TextIO

from tqdm import tqdm

from fedfair.runtime.report.verdicts import LINE

PLAIN_STEPS = 10
"""Piped output prints a line each time another 1/PLAIN_STEPS of the work is done."""

PLAIN_INTERVAL_SECONDS = 30.0
"""... and at least this often while the work is slow, so a log shows it is alive."""


LINE_WIDTH = LINE
"""The longest plain progress line (the longest line for people, :data:`~fedfair.runtime.report.verdicts.LINE`)."""


def fitted(heads: Sequence[str], note: str, width: int) -> str:
    """A line of at most `width` characters: the first of `heads` (fullest first) that fits with the whole `note`.

    Failing that, the last (shortest) head with as many of the note's leading clauses as fit (a clause ends at a
    comma outside parentheses, so "worst-group risk 0.83 (95% interval 0.78 to 0.91, round 120)" stays whole);
    failing that, the head alone.
    """
    for head in heads:
        line = f"{head}, {note}" if note else head
        if len(line) <= width:
            return line
    head, kept = heads[-1], ""
    for clause in clauses(note):
        longer = f"{kept}, {clause}" if kept else clause
        if len(head) + 2 + len(longer) > width:
            break
        kept = longer
    return f"{head}, {kept}" if kept else head


def clauses(text: str) -> list[str]:
    """`text` cut at each ", " outside parentheses."""
    found, depth, start = [], 0, 0
    for index, character in enumerate(text):
        depth += {"(": 1, ")": -1}.get(character, 0)
        if depth == 0 and text.startswith(", ", index):
            found.append(text[start:index])
            start = index + 2
    return [*found, text[start:]] if text else []


def format_duration(seconds: float) -> str:
    """`MM:SS` or `H:MM:SS`, the way the bar writes its ETA."""
    return str(tqdm.format_interval(max(seconds, 0.0)))


class Progress:
    """How far a run of `total` units (rounds, grid points) has got, on `stream` (default stderr).

    `update(done, note)` moves it to an absolute position (`note`, e.g. "c=0.41", is shown
    beside it); `write(text)` prints log text without garbling the bar; `close()` (or
    leaving a `with` block) ends it. A terminal gets a bar, anything else periodic lines.
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        unit: str = "round",
        stream: TextIO | None = None,
        log: TextIO | None = None,
        interval_s: float = PLAIN_INTERVAL_SECONDS,
        hold_last: bool = False,
    ) -> None:
        self.total = max(total, 0)
        self.hold_last = hold_last
        """Hold the last line back, with the latest note, until other text is written or close(): a process's
        final round may be followed by more than one evaluation (the periodic one, then the final), and its 100%
        line is printed once, with the last of them."""
        self.label = label
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.log = log if log is not None else sys.stdout
        self.interval_s = interval_s
        self.done = 0
        self.started = self.last_line = time.monotonic()
        # The ETA is measured from the first finished unit on: start-up (imports, processes
        # starting) would otherwise count as work and inflate it for the whole run.
        self._first: tuple[float, int] | None = None
        self._next_step = 1
        self._printed = 0
        self._printed_note = ""
        self._held: str | None = None
        """The note of a last line held back (see :meth:`update`), or None."""
        self._closed = False
        self._bar: tqdm[Never] | None = None
        if _is_terminal(self.stream):
            self._bar = tqdm(
                total=self.total, desc=label, unit=unit, file=self.stream, dynamic_ncols=True, smoothing=0.1
            )

    @property
    def is_bar(self) -> bool:
        """Whether this renders as a terminal bar (else as periodic lines)."""
        return self._bar is not None

    def update(self, done: int, note: str = "") -> None:
        """`done` units of `total` are finished; `note` is a short status shown beside the count."""
        done = min(max(done, self.done), self.total)
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(done - self.done)
            self.done = done
            return
        now = time.monotonic()
        if self._first is None and done > 0:
            self._first = (now, done)
        self.done = done
        step_reached = self.total > 0 and done * PLAIN_STEPS >= self._next_step * self.total
        finished = done == self.total and self._printed < done
        # The last line comes once: at the end the work's result (the final round's evaluation) may still
        # be on its way, so a last line whose note is the one already shown waits for it, or for close().
        if finished and (self.hold_last or (note == self._printed_note and note != "")):
            self._held = note
            return
        # A note that comes after the last line (the final round's evaluation) is the result: shown once more.
        result = done == self.total == self._printed and note != "" and note != self._printed_note
        if step_reached or finished or result or now - self.last_line >= self.interval_s:
            self._print(now, done, note)

    def _print(self, now: float, done: int, note: str) -> None:
        self._next_step = done * PLAIN_STEPS // self.total + 1 if self.total else 1
        self.last_line = now
        self._printed, self._printed_note, self._held = done, note, None
        self.stream.write(self.line(now, note) + "\n")
        self.stream.flush()

    def line(self, now: float, note: str = "") -> str:
        """The plain progress line: count, percentage, elapsed, ETA (or the total time when done), and `note`.

        At most :data:`LINE_WIDTH` characters: a longer one says less (:func:`fitted`), as a log or a terminal of
        80 to 120 columns would otherwise wrap it.
        """
        elapsed = now - self.started
        percent = 100.0 * self.done / self.total if self.total else 100.0
        counted = f"{self.label}: {self.done}/{self.total} {self.unit}s ({percent:.0f}%)"
        if self.done >= self.total:
            timings = [f"done in {format_duration(elapsed)}"]
        else:
            eta = (
                "ETA unknown"
                if self.done == 0
                else f"ETA {format_duration(self.seconds_per_unit(now) * (self.total - self.done))}"
            )
            timings = [f"{format_duration(elapsed)} elapsed, {eta}", eta]
        return fitted([f"{counted}, {timing}" for timing in timings], note, LINE_WIDTH)

    def seconds_per_unit(self, now: float) -> float:
        """Time per unit since the first one finished (from the start while only one has)."""
        if self._first is not None and self.done > self._first[1]:
            since, done_then = self._first
            return (now - since) / (self.done - done_then)
        return (now - self.started) / max(self.done, 1)

    def write(self, text: str) -> int:
        """Print log text on `log` (above the bar on a terminal). Pass whole lines: one call, one line.

        A held last line (see :meth:`update`) is printed first: it is what happened before this text.
        """
        if self._held is not None:
            self._print(time.monotonic(), self.done, self._held)
        if self._bar is not None:
            tqdm.write(text.rstrip("\n"), file=self.log)
        else:
            self.log.write(text)
            self.log.flush()
        return len(text)

    def flush(self) -> None:
        """Each `write` is flushed already; here so that a Progress can stand in for a log stream."""

    def close(self) -> None:
        """End the bar (it stays on screen with its final count); piped output needs nothing more."""
        if self._closed:
            return
        self._closed = True
        if self._held is not None:
            self._print(time.monotonic(), self.done, self._held)
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # a closed stream
        return False
