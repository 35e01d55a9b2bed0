"""Progress of long commands: periodic whole lines with an ETA when piped, a bar on a terminal."""

from __future__ import annotations

import io
import re

from fedfair.runtime.observe.progress import Progress, format_duration

ETA = re.compile(r"ETA \d\d:\d\d")


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as a console's stderr does."""

    def isatty(self) -> bool:
        return True


def test_piped_progress_prints_a_line_per_tenth_with_an_eta_and_no_carriage_return() -> None:
    piped = io.StringIO()
    with Progress(200, "fedsrcvar", stream=piped, interval_s=3600.0) as shown:
        for done in range(1, 201):
            shown.update(done, f"c={done / 200:.2f}")
        shown.update(200)  # the last position again prints nothing new
    text = piped.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("fedsrcvar: 20/200 rounds (10%)") and lines[0].endswith("c=0.10")
    assert all(ETA.search(line) for line in lines[:-1])
    assert lines[-1].startswith("fedsrcvar: 200/200 rounds (100%), done in ")


def test_the_last_line_is_printed_once_with_the_result_that_follows_the_last_round() -> None:
    """The aggregator's case: round 50 ends with round 45's evaluation still the latest, then the final one comes."""
    piped = io.StringIO()
    with Progress(50, "aggregator", stream=piped, interval_s=3600.0) as shown:
        shown.update(45, "worst 0.90")
        for _ in range(3):  # ticks while the final evaluation runs
            shown.update(50, "worst 0.90")
        shown.update(50, "worst 0.85")
    finals = [line for line in piped.getvalue().splitlines() if line.startswith("aggregator: 50/50")]
    assert len(finals) == 1 and finals[0].endswith("worst 0.85")

    piped = io.StringIO()
    with Progress(50, "aggregator", stream=piped, interval_s=3600.0) as shown:
        shown.update(45, "worst 0.90")
        shown.update(50, "worst 0.90")  # no evaluation follows: the held line comes at close()
    finals = [line for line in piped.getvalue().splitlines() if line.startswith("aggregator: 50/50")]
    assert len(finals) == 1 and finals[0].endswith("worst 0.90")


def test_a_held_last_line_waits_for_the_last_result_and_comes_before_the_next_line() -> None:
    """A process's console: round 50 has a periodic evaluation, then the final one, then a log line."""
    piped = io.StringIO()
    with Progress(50, "aggregator", stream=piped, log=piped, interval_s=3600.0, hold_last=True) as shown:
        shown.update(45, "worst 0.90")
        for note in ("worst 0.90", "worst 0.89 +/- 0.18", "worst 0.88 +/- 0.05"):
            shown.update(50, note)
        assert "50/50" not in piped.getvalue()
        shown.write("final evaluation of round 50\n")
    lines = piped.getvalue().splitlines()
    assert lines[-2].startswith("aggregator: 50/50 rounds (100%), done in ") and lines[-2].endswith("0.88 +/- 0.05")
    assert lines[-1] == "final evaluation of round 50" and sum("50/50" in line for line in lines) == 1


def test_piped_progress_also_prints_when_a_slow_run_passes_the_interval() -> None:
    piped = io.StringIO()
    shown = Progress(1000, "sweep", unit="point", stream=piped, interval_s=0.0)
    shown.update(1)
    shown.update(2)
    assert piped.getvalue().splitlines()[1].startswith("sweep: 2/1000 points (0%)")
    assert ETA.search(piped.getvalue())


def test_a_terminal_gets_a_bar_and_log_lines_above_it() -> None:
    terminal, log = Terminal(), Terminal()
    with Progress(50, "fedsrcvar", stream=terminal, log=log) as shown:
        assert shown.is_bar
        for done in range(1, 51):
            shown.update(done, "c=0.5")
        shown.write("[site-a] a log line\n")
    assert "\r" in terminal.getvalue() and "50/50" in terminal.getvalue()
    assert log.getvalue() == "[site-a] a log line\n"


def test_piped_log_lines_pass_through_unchanged() -> None:
    piped, log = io.StringIO(), io.StringIO()
    shown = Progress(3, "federation", stream=piped, log=log)
    assert not shown.is_bar
    shown.write("[aggregator] listening\n")
    assert log.getvalue() == "[aggregator] listening\n" and piped.getvalue() == ""


def test_durations_read_like_the_bar() -> None:
    assert format_duration(75.3) == "01:15"
    assert format_duration(4000) == "1:06:40"
    assert format_duration(-1) == "00:00"


def test_a_piped_line_with_a_long_note_says_less_rather_than_pass_120_characters() -> None:
    """`make demo`'s lines once ran to 146 characters with the estimate beside them: one that does not fit drops
    the elapsed time, then the note's trailing clauses (never a clause cut in two), and stays within 120."""
    estimate = "worst-group risk 0.83 (95% interval 0.78 to 0.91, round 120), mean 0.44 (0.42 to 0.46)"
    piped = io.StringIO()
    with Progress(300, "federation", stream=piped, interval_s=3600.0) as shown:
        for done in range(1, 301):
            shown.update(done, estimate if done >= 120 else "c=0.41")
    lines = piped.getvalue().splitlines()
    assert len(lines) == 10 and max(len(line) for line in lines) <= 120, [len(line) for line in lines]
    assert re.fullmatch(r"federation: 30/300 rounds \(10%\), \d\d:\d\d elapsed, ETA \d\d:\d\d, c=0.41", lines[0])
    assert re.fullmatch(
        r"federation: 120/300 rounds \(40%\), ETA \d\d:\d\d, worst-group risk 0.83 \(95% interval 0.78 to 0.91, "
        r"round 120\)",
        lines[3],
    ), lines[3]
    short = Progress(300, "federation", stream=io.StringIO())
    assert short.line(short.started, "x" * 200) == "federation: 0/300 rounds (0%), ETA unknown"  # no clause fits
