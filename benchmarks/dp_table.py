"""DP against DP: every method's held-out worst-decile risk under the same distributed DP, one row a DP test run.

Reads `benchmarks/dp_stretch.py`'s documents of one study: FedSRCVaR's stretch (its rows chosen under DP, or the
tuned choice at one local step where the search kept it) and each baseline's `--as` document (its rows chosen
under DP). Writes dp.csv with the columns `DP_COLUMNS`, each DP run a row: a seed repeats, one row a draw of the
noise (drawn from the OS's CSPRNG, never the seed). E.g.

    python benchmarks/dp_table.py --out docs/figures/tuned_adult_dp/dp.csv benchmarks/results/dp_stretch_adult.json \\
        benchmarks/results/dp_fedavg_adult.json benchmarks/results/dp_fedavgm_adult.json
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.research.study import METHOD_LABELS

DP_COLUMNS = ("method", "rho", "epsilon", "seed", "held_out_worst_risk", "held_out_mean_risk", "held_out_accuracy")
"""dp.csv's columns: the worst risk the table ranks by (issue 78), and the mean risk and accuracy beside it that say
what the ranking buys (issue 96)."""


def chosen_kind(document: Mapping[str, Any]) -> tuple[str, str]:
    """The method a stretch document trained under DP and the kind of its rows that are its DP test runs.

    A baseline's (`--as`) rows are all its choice under DP; FedSRCVaR's are its choice under DP, or, where the
    search chose the point it started from (no rows of their own), that point's "distributed" rows.

    Raises:
        ConfigError: the document has no DP test runs (a stretch run without --select, or no DP at all).
    """
    method = str(document.get("method", "fedsrcvar"))
    kinds = {row["kind"] for row in document["rows"]}
    for kind in (f"distributed, {METHOD_LABELS[method]} chosen under DP", "distributed, chosen under DP"):
        if kind in kinds:
            return method, kind
    if "chosen_under_dp" in document and "distributed" in kinds:
        return method, "distributed"
    raise ConfigError(
        f"{document['dataset']}'s {method} document has no runs chosen under DP: run dp_stretch.py with --select R"
    )


def epsilon_of(flags: Sequence[str]) -> float:
    """The target epsilon a DP run's flags set."""
    return float(flags[list(flags).index("--dp-target-epsilon") + 1])


def dp_rows(documents: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """dp.csv's rows: each document's DP test runs, in the documents' order.

    Raises:
        ConfigError: the documents are of different datasets, or two train the same method.
    """
    if len({document["dataset"] for document in documents}) > 1:
        raise ConfigError("dp.csv holds one study: give the documents of one dataset")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for document in documents:
        method, kind = chosen_kind(document)
        if method in seen:
            raise ConfigError(f"two documents train {method} under DP: give one")
        seen.add(method)
        for run in document["rows"]:
            if run["kind"] == kind:
                rows.append(
                    {
                        "method": METHOD_LABELS[method],
                        "rho": document["rho"],
                        "epsilon": epsilon_of(run["flags"]),
                        "seed": run["seed"],
                        "held_out_worst_risk": run["worst_risk"],
                        "held_out_mean_risk": run["mean_risk"],
                        "held_out_accuracy": run["accuracy"],
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("documents", type=Path, nargs="+", help="dp_stretch.py --json documents of one dataset")
    parser.add_argument("--out", type=Path, required=True, help="where dp.csv goes")
    args = parser.parse_args()
    rows = dp_rows([json.loads(path.read_text()) for path in args.documents])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=DP_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
