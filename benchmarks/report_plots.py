"""The benchmark page's figures, drawn from the benchmarks' JSON and nothing else.

Each function takes rows already read from one result file and returns a matplotlib Figure (the
object-oriented API: no pyplot state, no display). `save` writes a PNG without the matplotlib
version in its metadata, so a figure's file changes only when its data or its drawing does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Point = tuple[float, float, float]
"""(x, y, standard deviation of y; 0 when the JSON holds none)."""


def save(figure: Figure, path: Path) -> None:
    """Write `figure` as a PNG at `path` (its folder created), 100 dpi, no software stamp."""
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=100, metadata={"Software": None})


def round_cost(rows: Sequence[Mapping[str, float | bool]], collaborators: str) -> Figure:
    """round_bench's median round wall time against the number of parties, plain and secure, one line
    per model dimension, on log-log axes (a slope there is the exponent of the growth)."""
    figure = Figure(figsize=(6.5, 4.2), layout="constrained")
    axis = figure.subplots()
    for dimension in sorted({int(row["dimension"]) for row in rows}):
        for secure in (False, True):
            chosen = sorted(
                (row for row in rows if row["dimension"] == dimension and row["secure"] == secure),
                key=lambda row: float(row["parties"]),
            )
            axis.plot(
                [float(row["parties"]) for row in chosen],
                [float(row["round_seconds"]) for row in chosen],
                marker="o",
                linestyle="-" if secure else "--",
                label=f"{'secure' if secure else 'plain'} aggregation, d = {dimension:,}",
            )
    parties = sorted({int(row["parties"]) for row in rows})
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xticks(parties, [str(n) for n in parties])
    axis.set_xticks([], minor=True)
    axis.set_xlabel(f"parties n (collaborators as {collaborators})")
    axis.set_ylabel("median round wall time (s), no local training")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    return figure


def risk_versus_epsilon(
    panels: Mapping[str, Mapping[str, Sequence[Point]]], references: Mapping[str, float], reference_label: str
) -> Figure:
    """Held-out worst-group risk against the DP epsilon: one panel per key of `panels`, one line per
    setting in it (error bars where a standard deviation is given), and the panel's run without DP
    (`references`) as a dashed line."""
    figure = Figure(figsize=(5.5 * len(panels), 4.2), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, (panel, lines) in zip(axes, panels.items(), strict=True):
        epsilons: set[float] = set()
        for label, points in lines.items():
            ordered = sorted(points)
            epsilons.update(point[0] for point in ordered)
            axis.errorbar(
                [point[0] for point in ordered],
                [point[1] for point in ordered],
                yerr=[point[2] for point in ordered],
                marker="o",
                capsize=3,
                label=label,
            )
        if panel in references:
            axis.axhline(references[panel], color="grey", linestyle="--", linewidth=1, label=reference_label)
        axis.set_xscale("log")
        axis.set_xticks(sorted(epsilons), [f"{epsilon:g}" for epsilon in sorted(epsilons)])
        axis.set_xticks([], minor=True)
        axis.set_xlabel("DP epsilon (delta 1e-5)")
        axis.set_ylabel("held-out worst-group risk")
        axis.set_title(panel)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    return figure


def curves(panels: Mapping[str, Mapping[str, Mapping[int, float]]], ylabel: str) -> Figure:
    """One line per method of a value against the round, one panel per key of `panels`."""
    figure = Figure(figsize=(5.5 * len(panels), 4.2), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, (panel, lines) in zip(axes, panels.items(), strict=True):
        for label, curve in lines.items():
            rounds = sorted(curve)
            axis.plot(rounds, [curve[round_] for round_ in rounds], marker=".", label=label)
        axis.set_xlabel("round")
        axis.set_ylabel(ylabel)
        axis.set_title(panel)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    return figure


def error_versus_rows(panels: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]], goal: float) -> Figure:
    """The stated 95% half-width of the worst-group risk against the held-out rows (log-log): one panel per
    epsilon, one line per design, and the goal's half-width as a dashed line."""
    figure = Figure(figsize=(4.2 * len(panels), 3.8), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, (panel, lines) in zip(axes, panels.items(), strict=True):
        for label, points in lines.items():
            ordered = sorted(points)
            axis.plot([point[0] for point in ordered], [point[1] for point in ordered], marker="o", label=label)
        axis.axhline(goal, color="grey", linestyle="--", linewidth=1, label=f"+/- {goal:g}")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("held-out rows")
        axis.set_ylabel("95% half-width of the worst-group risk")
        axis.set_title(panel)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    return figure
