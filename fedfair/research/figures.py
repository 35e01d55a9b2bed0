"""The reproduction's figures, drawn from its CSV tables (so a figure shows exactly what its table says).

Each function takes the rows of one table as :func:`fedfair.research.reproduce.read_csv`
returns them and gives a matplotlib Figure (the object-oriented API with the Agg canvas:
no pyplot state, no display needed). Every plotted series carries a ``gid`` of
``"metric:label"``, so a test can find it and compare it with the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.axes import Axes
from matplotlib.figure import Figure

PANELS = (("worst_risk", "worst-group risk"), ("mean_risk", "mean risk"), ("disparity", "disparity"))
"""Figure 2 and 4's panels: the table column and its axis label."""

UNIFORM_LABEL = "uniform classifier (ln K)"

COLOURS = (*(f"C{index}" for index in range(10)), "black", "olive")
"""One colour per method of a figure: matplotlib's ten, then two more, so the twelve methods of a full Figure 1
panel each get their own (the ten alone gave CVaR-SGD FedSRCVaR's blue)."""


CENTRALIZED_MARK = "(central)"
"""What the label of a centralized method carries (`study.METHOD_LABELS`): its line is drawn dashed."""


def _styles(methods: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each method's colour, line and marker.

    A centralized method is dashed with square markers, a federated one solid with round ones, so a panel tells
    the two kinds apart even where colours are hard to.
    """
    return {
        method: {
            "color": COLOURS[index % len(COLOURS)],
            "linestyle": "--" if CENTRALIZED_MARK in method else "-",
            "marker": "s" if CENTRALIZED_MARK in method else "o",
        }
        for index, method in enumerate(methods)
    }


def _series(rows: Sequence[Mapping[str, str]], key: str) -> dict[str, list[Mapping[str, str]]]:
    grouped: dict[str, list[Mapping[str, str]]] = {}
    for row in rows:
        grouped.setdefault(row[key], []).append(row)
    return grouped


def risks_versus_rho(rows: Sequence[Mapping[str, str]], uniform: float, title: str) -> Figure:
    """Worst-group risk, mean risk and disparity versus rho, one line per method, mean +- std over seeds.

    The uniform classifier's risk as the reference line on the two risk panels.
    """
    figure = Figure(figsize=(15, 4.5), layout="constrained")
    axes = figure.subplots(1, len(PANELS))
    by_method = _series(rows, "method")
    styles = _styles(list(by_method))
    for axis, (metric, label) in zip(axes, PANELS, strict=True):
        for method, series in by_method.items():
            ordered = sorted(series, key=lambda row: float(row["rho"]))
            rhos = [float(row["rho"]) for row in ordered]
            means = [float(row[f"{metric}_mean"]) for row in ordered]
            spreads = [float(row[f"{metric}_std"]) for row in ordered]
            drawn = axis.errorbar(rhos, means, yerr=spreads, markersize=3, capsize=2, label=method, **styles[method])
            drawn.lines[0].set_gid(f"{metric}:{method}")
        if metric != "disparity":
            axis.axhline(
                uniform, color="grey", linestyle="--", linewidth=1, label=UNIFORM_LABEL, gid=f"{metric}:uniform"
            )
        axis.set_xlabel("rho (protected group fraction)")
        axis.set_ylabel(f"held-out {label}")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(title)
    return figure


def trade_off(rows: Sequence[Mapping[str, str]], title: str) -> Figure:
    """FedSRCVaR's worst-group against mean risk over epsilon, one curve per rho (paper Figure 3)."""
    figure = Figure(figsize=(6.5, 5), layout="constrained")
    axis = figure.subplots()
    for rho, series in _series(rows, "rho").items():
        ordered = sorted(series, key=lambda row: float(row["epsilon"]))
        means = [float(row["mean_risk_mean"]) for row in ordered]
        worsts = [float(row["worst_risk_mean"]) for row in ordered]
        (line,) = axis.plot(means, worsts, marker="o", markersize=3, label=f"rho = {rho}")
        line.set_gid(f"worst_risk:{rho}")
        for row, x, y in zip(ordered, means, worsts, strict=True):
            if row["epsilon"] in ("0.001", "0.1", "1"):
                axis.annotate(f"eps {row['epsilon']}", (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    _risk_axes(axis, "held-out", legend_size=8)
    figure.suptitle(f"epsilon trade-off: {title}", fontsize=9)
    return figure


def table(rows: Sequence[Mapping[str, str]], title: str) -> Figure:
    """The table at one rho (paper's FedMinMax table): mean +- std of each metric per method."""
    figure = Figure(figsize=(9, 0.6 + 0.4 * len(rows)), layout="constrained")
    axis = figure.subplots()
    axis.axis("off")
    columns = ("worst_risk", "mean_risk", "disparity", "accuracy")
    cells = [
        [row["method"], *(f"{float(row[f'{c}_mean']):.4f} +- {float(row[f'{c}_std']):.4f}" for c in columns)]
        for row in rows
    ]
    axis.table(cellText=cells, colLabels=["method", *columns], loc="center")
    figure.suptitle(f"rho = {rows[0]['rho']}: {title}", fontsize=9)
    return figure


def composition(rows: Sequence[Mapping[str, str]], column: str, title: str) -> Figure:
    """Each (group, label) cell's share of the worst group at each rho beside its share of everyone.

    The paper's composition table as bars; `rows` come from the composition CSV.
    """
    cells = list(dict.fromkeys((row[column], row["label"]) for row in rows))
    by_rho = _series(rows, "rho")
    figure = Figure(figsize=(max(6.0, 1.1 * len(cells)), 4.5), layout="constrained")
    axis = figure.subplots()
    width = 0.8 / (len(by_rho) + 1)
    positions = range(len(cells))
    overall = {(row[column], row["label"]): float(row["overall_share"]) for row in rows}
    for index, (rho, series) in enumerate(by_rho.items()):
        share = {(row[column], row["label"]): row for row in series}
        means = [100 * float(share[cell]["worst_share_mean"]) if cell in share else 0.0 for cell in cells]
        spreads = [100 * float(share[cell]["worst_share_std"]) if cell in share else 0.0 for cell in cells]
        bars = axis.bar(
            [p + index * width for p in positions], means, width, yerr=spreads, label=f"worst {float(rho):g}"
        )
        for bar in bars:
            bar.set_gid(f"worst_share:{rho}")
    bars = axis.bar(
        [p + len(by_rho) * width for p in positions],
        [100 * overall[cell] for cell in cells],
        width,
        color="grey",
        label="everyone",
    )
    for bar in bars:
        bar.set_gid("overall_share")
    ticks = [p + width * len(by_rho) / 2 for p in positions]
    axis.set_xticks(ticks, [f"{g}\n{label}" for g, label in cells], fontsize=7, rotation=30, ha="right")
    axis.set_ylabel("% of the group")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3, axis="y")
    figure.suptitle(f"who is in the worst group: {title}", fontsize=9)
    return figure


def fronts(rows: Sequence[Mapping[str, str]], uniform: float, title: str) -> Figure:
    """Worst-group against mean risk of every validation point, one panel per rho, each method's front a line.

    `rows` come from the fronts CSV (`fedfair.research.fronts`): a method's points are drawn faint, its front
    (the points marked on_front, by mean risk) as a line, its chosen point as a star; diverged points are
    left out and counted in the legend. The uniform classifier's risk ln K is the reference line.
    """
    by_rho = _series(rows, "rho")
    methods = list(dict.fromkeys(row["method"] for row in rows))
    colours = {method: style["color"] for method, style in _styles(methods).items()}
    figure = Figure(figsize=(max(4.2 * len(by_rho), 6.5), 4.5), layout="constrained")
    for axis, (rho, panel) in zip(figure.subplots(1, len(by_rho), squeeze=False)[0], by_rho.items(), strict=True):
        _frame_fronts(axis, panel, uniform)
        for method, series in _series(panel, "method").items():
            kept = [row for row in series if row["diverged"] == "False"]
            lost = len(series) - len(kept)
            colour = colours[method]
            points = axis.scatter(
                [float(row["mean_risk"]) for row in kept],
                [float(row["worst_risk"]) for row in kept],
                s=10,
                color=colour,
                alpha=0.25,
            )
            points.set_gid(f"points:{rho}:{method}")
            front = sorted((row for row in kept if row["on_front"] == "True"), key=lambda row: float(row["mean_risk"]))
            label = method if not lost else f"{method} ({lost} diverged)"
            (line,) = axis.plot(
                [float(row["mean_risk"]) for row in front],
                [float(row["worst_risk"]) for row in front],
                marker="o",
                markersize=3,
                color=colour,
                label=label,
            )
            line.set_gid(f"front:{rho}:{method}")
            for row in series:
                if row["chosen"] == "True" and row["diverged"] == "False":
                    axis.plot(
                        float(row["mean_risk"]),
                        float(row["worst_risk"]),
                        marker="*",
                        markersize=10,
                        color=colour,
                        gid=f"chosen:{rho}:{method}",
                    )
        axis.axhline(uniform, color="grey", linestyle="--", linewidth=1, label=UNIFORM_LABEL, gid=f"uniform:{rho}")
        axis.set_title(f"rho = {rho}", fontsize=9)
        _risk_axes(axis, "validation", legend_size=6)
    figure.suptitle(f"Pareto fronts over each method's grid (validation rows; star: chosen)\n{title}", fontsize=9)
    return figure


def _risk_axes(axis: Axes, rows: str, legend_size: int) -> None:
    """Label a worst-group against mean risk panel, on `rows` ("held-out" or "validation"), with its grid and legend."""
    axis.set_xlabel(f"{rows} mean risk")
    axis.set_ylabel(f"{rows} worst-group risk")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=legend_size)


def _frame_fronts(axis: Axes, panel: Sequence[Mapping[str, str]], uniform: float) -> None:
    """Frame a panel on the fronts and ln K, counting the grid points it leaves out.

    A grid's worst points that did not diverge can still be two orders of magnitude above its front (TERM's
    largest tilts at the largest steps), and would shrink every front to a dot.
    """
    kept = [(float(row["mean_risk"]), float(row["worst_risk"])) for row in panel if row["diverged"] == "False"]
    front = [(float(row["mean_risk"]), float(row["worst_risk"])) for row in panel if row["on_front"] == "True"]
    if not front:
        return
    means, worsts = [mean for mean, _ in front], [worst for _, worst in front] + [uniform]
    x_pad = 0.08 * (max(means) - min(means)) or 0.02
    y_pad = 0.08 * (max(worsts) - min(worsts)) or 0.02
    x_low, x_high, y_low, y_high = min(means) - x_pad, max(means) + x_pad, min(worsts) - y_pad, max(worsts) + y_pad
    axis.set_xlim(x_low, x_high)
    axis.set_ylim(y_low, y_high)
    beyond = sum(not (x_low <= mean <= x_high and y_low <= worst <= y_high) for mean, worst in kept)
    if beyond:
        note = f"{beyond} grid points beyond the axes (fronts.csv lists them)"
        axis.text(0.98, 0.02, note, transform=axis.transAxes, ha="right", va="bottom", fontsize=6, color="grey")


def save(figure: Figure, path: Path) -> Path:
    """Write `figure` as a PNG (the Agg canvas: no display, no global pyplot state)."""
    FigureCanvasAgg(figure)  # attaches itself as the figure's canvas
    figure.savefig(path, format="png", dpi=110)
    return path
