"""The figures of the run report (:mod:`fedfair.runtime.report.page`), drawn with matplotlib as inline SVG.

Each function takes plain numbers (the report has read them from the output folder) and
gives a matplotlib Figure through the object-oriented API and no pyplot state, so no display
is needed and nothing is shared between threads. Every plotted series carries a ``gid`` of
``"panel:series"`` (``risk:worst``, ``threshold:c``, ``epsilon:site-a``; a stage's bars are
the container labelled with the stage): a test finds a series by it and compares it with the
JSON lines it came from. A line's gid is also the id of its group in the SVG, so a test can
find it in the rendered page too. This module is imported only when a
report is drawn, so ``fedfair report --help`` never loads matplotlib.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import matplotlib
from matplotlib.axes import Axes
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

WIDTH = 7.5
"""Inches; every figure has the page's width, so they line up."""

PRIOR_LABEL = "class-prior classifier's worst-group risk"


def risks(
    rounds: Sequence[int],
    worst: Sequence[float],
    mean: Sequence[float],
    spans: Sequence[tuple[float, float]],
    prior: float | None,
    mean_bounds: Sequence[float],
    resolved: Sequence[bool] | None = None,
) -> Figure:
    """Held-out worst-group and mean risk at each evaluated round, each with its interval when it has one.

    `spans` is each worst-group risk's (below, above) extent of its interval, `mean_bounds` each mean's 95%
    half-width (0 for an exact mean: no bar); the class-prior classifier's worst-group risk is the reference
    line when it is known (`prior` None: no line). `resolved` (default: all) says which worst-group risks the
    noise resolved: the line joins only those (``risk:worst``); the others are grey points with grey bars
    (``risk:unresolved``, ``risk:unresolved_interval``), not drawn as progress.
    """
    figure = Figure(figsize=(WIDTH, 3.4), layout="constrained")
    axis = figure.subplots()
    known = np.ones(len(rounds), dtype=bool) if resolved is None else np.asarray(resolved, dtype=bool)
    at, values = np.asarray(rounds), np.asarray(worst, dtype=np.float64)
    lows = values - np.asarray([span[0] for span in spans], dtype=np.float64)
    highs = values + np.asarray([span[1] for span in spans], dtype=np.float64)
    axis.vlines(
        at[known], lows[known], highs[known], color="tab:red", linewidth=2, alpha=0.4, label="its interval",
        gid="risk:interval",
    )  # fmt: skip
    axis.plot(
        at[known], values[known], marker="o", markersize=4, color="tab:red", label="worst-group risk", gid="risk:worst"
    )
    if not known.all():
        axis.vlines(
            at[~known], lows[~known], highs[~known], color="grey", linewidth=2, alpha=0.3,
            gid="risk:unresolved_interval",
        )  # fmt: skip
        axis.plot(
            at[~known], values[~known], linestyle="none", marker="o", markersize=4, color="grey",
            label="worst-group risk, not resolved", gid="risk:unresolved",
        )  # fmt: skip
    axis.plot(rounds, mean, marker="s", markersize=4, color="tab:blue", label="mean risk", gid="risk:mean")
    bounds, means = np.asarray(mean_bounds, dtype=np.float64), np.asarray(mean, dtype=np.float64)
    barred = bounds > 0.0
    if barred.any():
        # No loss is negative: a mean's interval stops at 0.
        lower, upper = np.maximum(means - bounds, 0.0)[barred], (means + bounds)[barred]
        axis.vlines(at[barred], lower, upper, color="tab:blue", linewidth=2, alpha=0.3, gid="risk:mean_interval")
    if prior is not None:
        axis.axhline(prior, color="grey", linestyle="--", linewidth=1, label=PRIOR_LABEL, gid="risk:prior")
    axis.set_xlabel("round")
    axis.set_ylabel("held-out risk (cross-entropy)")
    _finish(axis)
    return figure


def thresholds(rounds: Sequence[int], c: Sequence[float], c_average: Sequence[float]) -> Figure:
    """The threshold c after each applied round and its running average c-bar (the output model's)."""
    figure = Figure(figsize=(WIDTH, 2.8), layout="constrained")
    axis = figure.subplots()
    axis.plot(rounds, c, marker=".", color="tab:purple", label="c", gid="threshold:c")
    axis.plot(rounds, c_average, linestyle="--", color="tab:green", label="c-bar (average)", gid="threshold:c_average")
    axis.set_xlabel("round")
    axis.set_ylabel("threshold c")
    _finish(axis)
    return figure


def epsilons(series: Mapping[str, tuple[Sequence[int], Sequence[float]]]) -> Figure:
    """Each site's cumulative DP epsilon as it reported it, by round (`series`: site -> (rounds, epsilons))."""
    figure = Figure(figsize=(WIDTH, 2.8), layout="constrained")
    axis = figure.subplots()
    for name, (rounds, values) in series.items():
        axis.plot(rounds, values, marker=".", drawstyle="steps-post", label=name, gid=f"epsilon:{name}")
    axis.set_xlabel("round")
    axis.set_ylabel("epsilon spent")
    _finish(axis)
    return figure


def stage_times(rounds: Sequence[int], stages: Mapping[str, Sequence[float]]) -> Figure:
    """Seconds per stage in each round, stacked (`stages`: stage -> seconds, one per round, 0 when it did not run)."""
    figure = Figure(figsize=(WIDTH, 3.0), layout="constrained")
    axis = figure.subplots()
    bottom = [0.0] * len(rounds)
    for stage, seconds in stages.items():
        axis.bar(rounds, seconds, bottom=bottom, label=stage)
        bottom = [below + value for below, value in zip(bottom, seconds, strict=True)]
    axis.set_xlabel("round")
    axis.set_ylabel("seconds")
    _finish(axis)
    return figure


def trade_off(models: Mapping[str, tuple[float, float]], uniform: str) -> Figure:
    """Each model of the exact comparison as a point (mean risk, worst-group risk), h̄ among them as the reference.

    `models` maps a name to its (mean, worst) risks on the same held-out rows; `uniform` names h̄'s: its worst-group
    risk is drawn as a dashed line (``tradeoff:uniform``), so a point above it is beaten by a model that learnt
    nothing on the figure the federation minimises. Each point's gid is ``tradeoff:<name>``.
    """
    figure = Figure(figsize=(WIDTH, 3.4), layout="constrained")
    axis = figure.subplots()
    for name, (mean, worst) in models.items():
        marker = "*" if name == uniform else "o"
        axis.plot([mean], [worst], marker=marker, markersize=9, linestyle="none", label=name, gid=f"tradeoff:{name}")
        axis.annotate(name, (mean, worst), textcoords="offset points", xytext=(6, 4), fontsize=8)
    axis.axhline(
        models[uniform][1], color="grey", linestyle="--", linewidth=1, label=f"{uniform}'s worst-group risk",
        gid="tradeoff:uniform",
    )  # fmt: skip
    axis.set_xlabel("mean risk (held-out rows)")
    axis.set_ylabel("worst-group risk")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="best")
    return figure


def _finish(axis: Axes) -> None:
    axis.grid(alpha=0.3)
    # Rounds are whole numbers: no tick at round 1.5.
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.legend(fontsize=7, loc="best")


def svg(figure: Figure) -> str:
    """`figure` as an ``<svg>`` element to put inline in HTML.

    Text kept as text (the page's fonts, searchable), no XML prolog, no DOCTYPE and no metadata (the latter name
    matplotlib's web site).
    """
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]
