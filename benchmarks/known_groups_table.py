"""docs/paper.md's known-groups table, from the known_groups.csv files `benchmarks/known_groups.py` writes (issue 96).

Each column is one (folder, group column) pair named on the command line as HEADING=FOLDER:COLUMN; each row a model:
the stopped methods, FedMinMax told that column's groups (the reference that knows them), h̄ and the base rate.
A cell is the model's worst known group's mean risk (that group), then its highest group error rate, each averaged
over the test seeds (`known_groups.worst_group`); "not measured" where the folder has no rows for it. E.g.

    python benchmarks/known_groups_table.py "Adult, by race=docs/figures/tuned_adult_all_rho:race" \\
        "Adult, by sex=docs/figures/tuned_adult_all_rho:sex" \\
        "Census-Income, by race=docs/figures/tuned_census_all_rho:race"
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedfair.fairness.references import BASE_RATE, UNIFORM
from fedfair.research.known_groups import fedminmax_label, worst_group
from fedfair.research.reproduce import read_csv
from fedfair.research.study import METHOD_LABELS

METHODS = ("fedsrcvar", "term", "deltafl", "propfair", "fedavgm", "fedavg")
TOLD = "FedMinMax, told the column"
"""The reference's row: in each column, FedMinMax told that column's groups."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("columns", nargs="+", metavar="HEADING=FOLDER:COLUMN")
    args = parser.parse_args()
    specs = []
    for spec in args.columns:
        heading, _, place = spec.partition("=")
        folder, _, column = place.rpartition(":")
        if not (heading and folder and column):
            parser.error(
                f"{spec!r} is not HEADING=FOLDER:COLUMN, e.g. 'Adult, by race=docs/figures/tuned_adult_all_rho:race'"
            )
        specs.append((heading, read_csv(Path(folder) / "known_groups.csv"), column))
    print(
        "| worst known group's mean risk (the group); highest group error, mean of the seeds | "
        + " | ".join(heading for heading, _, _ in specs)
        + " |"
    )
    print("|---" * (len(specs) + 1) + "|")
    for model in [METHOD_LABELS[method] for method in METHODS] + [TOLD, UNIFORM, BASE_RATE]:
        cells = []
        for _, rows, column in specs:
            worst = worst_group(rows, fedminmax_label(column) if model == TOLD else model, column)
            if worst is None:
                cells.append("not measured")
                continue
            error = "" if worst.error is None else f"; {worst.error:.3f}"
            groups = "every group" if model == UNIFORM else ", ".join(worst.groups)  # h̄ is ln K on every row
            cells.append(f"{worst.risk:.4f} ({groups}){error}")
        print(f"| {model} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
