"""docs/benchmarks.md's section of benchmarks/eval_error.py: the noised worst-group risk against the exact value."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

from report_plots import error_versus_rows
from report_tables import Plot, Section, count, fixed, percent, table


EVAL_DESIGNS = {
    "tree": "loss-histogram tree (first)",
    "c-bar": "one tail sum read at c-bar (before)",
    "layers10": "10 layered tail sums",
    "layers30": "30 layered tail sums (used)",
    "layers60": "60 layered tail sums",
}
"""eval_error's designs, as a reader knows them."""


def eval_error(name: str, document: Mapping[str, Any]) -> Section:
    """The noised evaluation's worst-group risk against the exact value, per design, size and epsilon."""
    rows = [
        [
            EVAL_DESIGNS.get(row["design"], row["design"]),
            count(row["rows"]),
            f"{row['epsilon']:g}",
            fixed(row["rmse"]),
            fixed(row["mean_half_width"]),
            percent(row["coverage"], 0),
            fixed(row["expected_half_width"]),
        ]
        for row in document["rows"]
    ]
    lines = table(
        ["design", "held-out rows", "epsilon", "RMS error", "mean 95% half-width", "coverage", "predicted"], rows
    )
    goal = document["goal"]
    lines += [
        "",
        f"Over {document['repeats']} fresh noises per row; the exact value is the worst-group risk (rho "
        f'{document["rho"]:g}) of the losses clipped at {document["loss_cap"]:g}. "predicted" is the half-width '
        "`fedfair data check` prints (the noise alone, at c = 0, reached 1.96 sd below and the simultaneous "
        "high end's z above: `tail.expected_half_width`). Goal: at "
        f"{count(goal['rows'])} rows and epsilon {goal['epsilon']:g}, a half-width of at most "
        f"{goal['half_width']:g} and coverage of at least {percent(goal['coverage'], 0)}"
        + (
            f" (to within {percent(goal['coverage_tolerance'], 1)}, 3 binomial standard deviations of the noises)"
            if "coverage_tolerance" in goal
            else ""
        )
        + f": measured {fixed(goal['measured_half_width'])} and {percent(goal['measured_coverage'], 0)} "
        f"({'met' if goal['met'] else 'not met'}).",
    ]
    if "caps" in document:
        lines += ["", *cap_trade_off(document["caps"])]
    if "shapes" in document:
        lines += ["", *loss_shapes(document["shapes"])]
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for row in document["rows"]:
        if row["mean_half_width"] is not None:
            panel = panels.setdefault(f"epsilon {row['epsilon']:g}", {})
            panel.setdefault(EVAL_DESIGNS.get(row["design"], row["design"]), []).append(
                (float(row["rows"]), float(row["mean_half_width"]))
            )
    plot = Plot(
        f"{name}_half_width_vs_rows.png",
        "The stated 95% half-width of the noised worst-group risk against the held-out rows, per design and epsilon",
        partial(error_versus_rows, panels, float(goal["half_width"])),
    )
    return Section(
        "Noised evaluation: the worst-group risk's error and its interval against the exact value",
        "The final evaluation's worst-group risk under [privacy] report_epsilon, released as the loss-histogram "
        "tree, as one tail sum read at the trained threshold c-bar, or as layered tail sums below the cap, on a "
        "logistic regression's real losses over "
        "Adult rows (the release simulated with the calibrated noise): the RMS error against the exact value, the "
        "stated 95% half-width, and how often that interval covered the exact value.",
        lines,
        (plot,),
    )


def loss_shapes(shapes: Mapping[str, Any]) -> list[str]:
    """eval_error's loss shapes: per setting, how often the answered and the resolved intervals cover."""
    rows = [
        [
            row["shape"],
            f"{row['rho']:g}",
            count(row["rows"]),
            f"{row['epsilon']:g}",
            str(row["sites"]),
            percent(row["answered"], 0),
            percent(row["coverage"], 1),
            percent(row["resolved"], 0),
            percent(row["coverage_resolved"], 1),
            fixed(row["mean_half_width"]),
            fixed(row["bias_over_half_width"], 2),
            percent(row["width_zero"], 0),
        ]
        for row in shapes["rows"]
    ]
    header = ["loss shape", "rho", "held-out rows", "epsilon", "sites", "answered", "coverage", "resolved"]
    lines = table([*header, "coverage (resolved)", "mean 95% half-width", "|bias| / half-width", "width 0"], rows)
    return [
        f"Loss shapes beyond smooth ones (30 layered tail sums, {shapes['repeats']:,} noises each, c-bar off the "
        "quantile as a trained one is): coverage of the exact clipped worst-group risk over the draws the report "
        "answers and over those it calls resolved, the mean half-width and the point's mean error against it (both "
        "over the resolved draws), and the share of intervals of width 0.",
        "",
        *lines,
        "",
        f"Goal: coverage of at least {percent(shapes['coverage'], 0)} of the answered and of the resolved draws in "
        "every setting, no interval of width 0, and a mean error at most a quarter of the half-width: "
        f"{'met' if shapes['met'] else 'not met'}.",
    ]


def cap_trade_off(caps: Mapping[str, Any]) -> list[str]:
    """eval_error's loss caps: per cap, model and size, what clipping takes off against what the noise adds."""
    rows = [
        [
            f"{row['cap']:.3g} (true class at {percent(math.exp(-row['cap']))})",
            row["model"],
            count(row["rows"]),
            fixed(row["clip_bias"]),
            fixed(row["mean_half_width"]),
            fixed(row["reach"]),
            percent(row["coverage_unclipped"], 0),
            percent(row["mean_cap_share_high"], 0),
        ]
        for row in caps["rows"]
    ]
    header = ["loss cap", "model", "held-out rows", "clipping bias", "mean 95% half-width", "reach"]
    lines = table([*header, "coverage of the unclipped value", "worst group above the cap (at most)"], rows)
    reach = ", ".join(f"{float(cap):.3g}: {fixed(value)}" for cap, value in caps["mean_reach"].items())
    return [
        "The loss cap's trade-off (30 layered tail sums, epsilon "
        f"{caps['epsilon']:g}): the clipping bias is the unclipped worst-group risk less the clipped one, the "
        "reach that bias plus the half-width, and the last column the mean share of the worst group the report "
        "says may lie above the cap (one-sided 97.5%).",
        "",
        *lines,
        "",
        f"Mean reach per cap at {count(min(row['rows'] for row in caps['rows']))} rows over the models some cap "
        f"resolves ({', '.join(caps.get('resolvable', ()))}): {reach}; "
        f"the cap chosen, with the least: {float(caps['chosen']):.3g}.",
    ]
