"""`make demo` over several seeds: FedSRCVaR against FedAvg measured alike, and what the private estimate says.

Runs `fedfair launch --seed S` (what `make demo` runs, with each seed) one seed after another, and reads
back the comparison it keeps beside its report (``comparison.json``): both models' exact worst-group risk on
the same held-out rows, and the federation's own private estimate with its 95% interval. Also counts the
closing console's lines and its longest line (targets: at most 15 lines of at most 120 characters).

Prints JSON (and writes it with --json PATH):
  {"seeds": [{"seed", "fedsrcvar_worst", "fedavg_worst", "rows", "private_worst", "private_low",
              "private_high", "covered", "closing_lines", "widest_line", "seconds"}],
   "fedsrcvar_lower_on_every_seed": bool, "coverage": x, "mean_margin": x}
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from published import publish

ROOT = Path(__file__).resolve().parents[1]


def closing(stdout: str) -> list[str]:
    """The closing console: everything printed after the blank line that follows the progress bar."""
    lines = stdout.rstrip("\n").splitlines()
    blank = max(index for index, line in enumerate(lines) if not line.strip())
    return lines[blank + 1 :]


def one_seed(seed: int, folder: Path) -> dict[str, Any]:
    """One `fedfair launch --seed seed` in `folder`: its comparison and the shape of its closing console."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "fedfair.cli", "launch", "--seed", str(seed), "--workdir", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"fedfair launch --seed {seed} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    kept = json.loads((folder / "aggregator" / "output" / "comparison.json").read_text())
    exact, private = kept["exact"], kept["private"]
    ours, theirs = exact["FedSRCVaR"]["worst_risk"], exact["FedAvg"]["worst_risk"]
    low, high = private["worst_risk_low"], private["worst_risk_high"]
    shown = closing(done.stdout)
    return {
        "seed": seed,
        "fedsrcvar_worst": ours,
        "fedavg_worst": theirs,
        "rows": exact["FedSRCVaR"]["rows"],
        "private_worst": private["worst_risk"],
        "private_low": low,
        "private_high": high,
        "covered": low <= ours <= high,
        "closing_lines": len(shown),
        "widest_line": max(len(line) for line in shown),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1 (default 5)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="fedfair-demo-seeds-") as scratch:
        for seed in range(args.seeds):
            runs.append(one_seed(seed, Path(scratch) / f"seed-{seed}"))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    document = {
        "seeds": runs,
        "fedsrcvar_lower_on_every_seed": all(run["fedsrcvar_worst"] < run["fedavg_worst"] for run in runs),
        "mean_margin": sum(run["fedavg_worst"] - run["fedsrcvar_worst"] for run in runs) / len(runs),
        "coverage": sum(run["covered"] for run in runs) / len(runs),
    }
    publish(document, args.json, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
