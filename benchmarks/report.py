"""Writes docs/benchmarks.md and its figures from the benchmarks' JSON in benchmarks/results/ (what
`make bench` writes there).

    python benchmarks/report.py [--results DIR] [--out PATH] [--check]

For each result file the page says what the benchmark measures, the command, machine and date that
measured it, one headline table putting fedfair beside its comparison, a plot where the JSON holds a
trend (PNGs under figures/benchmarks/ beside the page), and a link to the raw JSON for every other
figure. Every figure is read from a file; nothing is typed in by hand, so the page cannot drift from
the measurements. A result file without a section of its own is shown as a table of its figures.
`--check` writes nothing and exits 1 when the page is not what the files give or a figure it shows is
missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from report_learning import census_fairness, convergence_bench, dp_bench, dp_bits, dp_utility, dp_utility_equal
from report_eval_error import eval_error
from report_learning import influence_bench, noised_statistics, reference_gap, server_step_bench, simulation_speed
from report_bounded import input_bound_cost
from report_dp_stretch import dp_baseline, dp_stretch
from report_gpu import gpu_bench
from report_plots import save
from report_runtime import (
    allocator_ab,
    attack_matrix,
    demo_seeds,
    federation_bench,
    flower_bench,
    flower_masking,
    step_overhead,
    verify_bench,
    recheck_cost,
    verify_soundness_cost,
    round_bench,
    round_compare,
    round_compare_paired,
    secagg_bench,
    startup_bench,
    wire_width,
)
from report_tables import Plot, Section, table
from report_words import dp_utility_bits

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
FIGURES = Path("figures") / "benchmarks"
"""Where the figures go, relative to the page."""
DEPTH = 3
"""Nesting levels of a document without a section of its own shown as rows; deeper ones are left to the JSON."""

Shows = Callable[[str, Mapping[str, Any]], Section]
"""How one result file becomes its section on the page."""


def elsewhere(shows: Shows, where: str) -> Shows:
    """`shows` for a run on another machine than this one (a lent GPU machine), or of another scope: the same
    section, its title saying where or what, so that both runs keep a heading of their own."""

    def shown_there(name: str, document: Mapping[str, Any]) -> Section:
        section = shows(name, document)
        return replace(section, title=f"{section.title}, {where}")

    return shown_there


SECTIONS: dict[str, Shows] = {
    "startup_bench": startup_bench,
    "demo_seeds": demo_seeds,
    "round_bench": round_bench,
    "round_bench_processes": round_bench,
    "round_bench_cpu50": elsewhere(round_bench, "50 sites by CPU"),
    "round_compare": round_compare,
    "round_compare_paired": round_compare_paired,
    "allocator_ab": allocator_ab,
    "round_bench_processes_d1e8": wire_width,
    "round_bench_plain32_d1e7": wire_width,
    "round_bench_processes_d1e7": wire_width,
    "secagg_bench": secagg_bench,
    "verify_bench": verify_bench,
    "verify_soundness_cost": verify_soundness_cost,
    "recheck_cost": recheck_cost,
    "input_bound_cost": input_bound_cost,
    "dp_bench": dp_bench,
    "dp_bench_resnet_cpu": dp_bench,
    "step_overhead": step_overhead,
    "dp_utility": dp_utility,
    "dp_utility_equal": dp_utility_equal,
    "dp_bits": dp_bits,
    "dp_utility_16bit": dp_utility_bits,
    "dp_utility_32bit": dp_utility_bits,
    "noised_statistics": noised_statistics,
    "eval_error": eval_error,
    "census_fairness": census_fairness,
    "dp_stretch_adult": dp_stretch,
    "dp_stretch_rand_hie": dp_stretch,
    "dp_stretch_census_income": dp_stretch,
    "dp_fedavg_adult": dp_baseline,
    "dp_fedavgm_adult": dp_baseline,
    "dp_fedavg_census_income": dp_baseline,
    "dp_fedavgm_census_income": dp_baseline,
    "dp_term_adult": dp_baseline,
    "dp_term_census_income": dp_baseline,
    "dp_propfair_adult": dp_baseline,
    "dp_deltafl_adult": dp_baseline,
    "dp_propfair_census_income": dp_baseline,
    "dp_deltafl_census_income": dp_baseline,
    "convergence_bench": convergence_bench,
    "server_step_bench": server_step_bench,
    "reference_gap": reference_gap,
    "influence_bench": influence_bench,
    "federation_bench": federation_bench,
    "flower_bench": flower_bench,
    "flower_bench_simulation": flower_bench,
    "flower_masking": flower_masking,
    "simulation_speed": simulation_speed,
    "dp_bench_h100": elsewhere(dp_bench, "on a machine with an H100 GPU"),
    "gpu_bench_h100": elsewhere(gpu_bench, "on one H100"),
    "simulation_speed_h100_cuda": elsewhere(simulation_speed, "on the H100 GPU"),
    "simulation_speed_h100_cpu": elsewhere(simulation_speed, "on the H100 machine's CPU"),
    "attack_matrix": attack_matrix,
}
"""Each result file's section, in the order the page shows them: cost first, then learning, then security."""

HEADER = """# Benchmarks

Generated by `python benchmarks/report.py` from the JSON in `benchmarks/results/` (written by
`make bench`); do not edit by hand. Each section says what one benchmark measures and against what,
names the command that measured it, on which machine and when, shows its headline table (and a plot
where it measured a trend), and links the raw JSON, which holds every other figure. These machines
are shared and noisy: prefer the ratios measured within one run to absolute times.
"""


def figures(document: Mapping[str, Any], prefix: str = "", depth: int = 1) -> Iterator[tuple[str, str]]:
    """(dotted key, shown value) for every scalar down to DEPTH levels; lists are counted."""
    for key, value in document.items():
        name = f"{prefix}{key}"
        if key == "provenance":
            continue
        if isinstance(value, Mapping):
            if depth < DEPTH:
                yield from figures(value, f"{name}.", depth + 1)
        elif isinstance(value, list):
            if value and all(not isinstance(item, (Mapping, list)) for item in value) and len(value) <= 8:
                yield name, ", ".join(shown(item) for item in value)
            else:
                yield name, f"{len(value)} entries (in the JSON)"
        else:
            yield name, shown(value)


def shown(value: Any) -> str:
    """A scalar as a generic table shows it: floats to six significant digits."""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def generic(name: str, document: Mapping[str, Any]) -> Section:
    """A result file no section knows: its figures as rows, titled by its name."""
    return Section(name, "", table(["figure", "value"], ([key, value] for key, value in figures(document))))


def section_of(name: str, document: Mapping[str, Any]) -> Section:
    """The section that shows the result file `name`."""
    return SECTIONS.get(name, generic)(name, document)


def anchor(title: str) -> str:
    """The anchor a markdown renderer gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def provenance(document: Mapping[str, Any]) -> str:
    """The sentence naming the command, date and machine that measured a result file."""
    stamp = document.get("provenance")
    if not isinstance(stamp, Mapping):
        return "(written before benchmarks recorded their command and machine)"
    machine = stamp.get("machine", {})
    return (
        f"Measured by `{stamp.get('command')}` on {stamp.get('date')}: {machine.get('cpus')} CPUs "
        f"({machine.get('processor')}, {machine.get('platform')}), Python {machine.get('python')}, "
        f"torch {machine.get('torch')}."
    )


def ordered(results: Path) -> list[Path]:
    """The result files in the page's order: SECTIONS' order, then any others by name."""
    rank = {name: index for index, name in enumerate(SECTIONS)}
    return sorted(results.glob("*.json"), key=lambda path: (rank.get(path.stem, len(rank)), path.stem))


Shown = tuple[str, Section, str]
"""One result file on the page: its name, its section, its provenance sentence."""


def sections(results: Path) -> list[Shown]:
    """Every `*.json` in `results` as the page shows it, in the page's order."""
    shown = []
    for path in ordered(results):
        document = json.loads(path.read_text())
        shown.append((path.stem, section_of(path.stem, document), provenance(document)))
    return shown


def compose(parts: list[Shown], results: Path, page: Path) -> str:
    """The page's markdown: contents, then each part's section; links relative to `page`."""
    contents = [f"- [{section.title}](#{anchor(section.title)})" for _, section, _ in parts]
    lines = [HEADER, "## Contents", "", *contents, ""]
    for name, section, stamp in parts:
        lines += [f"## {section.title}", ""]
        if section.measures:
            lines += [section.measures, ""]
        lines += [stamp, "", *section.body, ""]
        for plot in section.plots:
            lines += [f"![{plot.caption}]({(FIGURES / plot.file).as_posix()})", ""]
        if section.tail:
            lines += [*section.tail, ""]
        raw = Path(os.path.relpath(results / f"{name}.json", page.parent)).as_posix()
        lines += [f"Every figure of this run: [`{name}.json`]({raw}).", ""]
    return "\n".join(lines)


def render(results: Path, page: Path = PAGE) -> str:
    """The page for every `*.json` in `results`, its links relative to where `page` is written."""
    return compose(sections(results), results, page)


def plots(parts: list[Shown], page: Path) -> list[tuple[Plot, Path]]:
    """Every figure the page shows, with its path under figures/benchmarks/ beside `page`."""
    return [(plot, page.parent / FIGURES / plot.file) for _, section, _ in parts for plot in section.plots]


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the page and its figures; 0 when done or up to date, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="the benchmarks' JSON (default benchmarks/results)"
    )
    parser.add_argument("--out", type=Path, default=PAGE, help="the page to write (default docs/benchmarks.md)")
    parser.add_argument("--check", action="store_true", help="only check that the page and its figures are up to date")
    args = parser.parse_args(argv)
    parts = sections(args.results)
    page = compose(parts, args.results, args.out)
    figures_shown = plots(parts, args.out)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != page or not all(path.is_file() for _, path in figures_shown):
            print(f"{args.out} is not what {args.results} gives; run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(page)
    for plot, path in figures_shown:
        save(plot.draw(), path)
    print(f"wrote {args.out} and {len(figures_shown)} figures from {len(parts)} result files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
