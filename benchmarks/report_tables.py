"""The pieces docs/benchmarks.md is built from: a section, a plot, a markdown table, a shown number.

Every number on the page passes through one of the formatters here, so a figure reads the same in
every section: a JSON `null` is "n/a", a ratio carries "×", a share carries "%".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure


@dataclass(frozen=True)
class Plot:
    """One figure of the page.

    Args:
        file: the PNG's name under docs/figures/benchmarks/.
        caption: what the figure shows, its alt text on the page.
        draw: builds the figure from the JSON it was given (no pyplot state).
    """

    file: str
    caption: str
    draw: Callable[[], Figure]


@dataclass(frozen=True)
class Section:
    """One benchmark as a reader meets it.

    Args:
        title: the heading, naming what is compared.
        measures: what the benchmark measures and against what (one paragraph).
        body: markdown lines: the headline table first, then notes.
        plots: the figures drawn where the JSON holds a trend, shown after the body.
        tail: markdown lines after the plots, on what they do not show.
    """

    title: str
    measures: str
    body: list[str]
    plots: tuple[Plot, ...] = ()
    tail: tuple[str, ...] = ()


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table; a `|` inside a cell is escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def fixed(value: Any, digits: int = 3) -> str:
    """A JSON value with `digits` decimals; null as "n/a", booleans as yes/no, text as it is."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value:.{digits}f}"
    return str(value)


def ratio(value: Any, digits: int = 2) -> str:
    """A ratio of two measurements, as "1.21×"; null as "n/a"."""
    return "n/a" if value is None else f"{value:.{digits}f}×"


def percent(value: Any, digits: int = 1) -> str:
    """A fraction as a percentage, "9.6 %"; null as "n/a"."""
    return "n/a" if value is None else f"{100 * value:.{digits}f} %"


def milliseconds(seconds: Any) -> str:
    """Seconds shown in milliseconds with three significant digits; null as "n/a"."""
    return "n/a" if seconds is None else f"{1000 * seconds:.3g}"


def count(value: Any) -> str:
    """An integer with thousands separators, "10,000"."""
    return f"{value:,}"
