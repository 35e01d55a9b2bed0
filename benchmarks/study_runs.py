"""What one run of each pending tuned study costs: CPU seconds of `fedfair.research.runs.execute`.

Prints JSON (and writes it with --json PATH): {"rounds": R, "runs": {NAME: {"cpu_s": x, "worst_risk": y}}}.
Each run is a validation run as `fedfair reproduce --profile tuned` plans it (docs/paper.md's Pending
list): MNIST by digit, Census-Income by race and in 51 sites, FedSRCVaR (epsilon 0.01, gamma 0.01) and
TERM (tilt 1, --loss-rows as the study reads), step 0.01, 3 local steps, no server momentum.
The clock is `time.process_time` around `execute` alone, torch on one thread, the data loaded
before it (a study loads it once per process). To compare two versions of the code, run this
script from each tree in turn, a few times, interleaved.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from published import publish
from fedfair.research.runs import Run, execute, federation_for

SPLITS = {
    "mnist": ("--dataset", "mnist", "--partition", "class", "--clients", "10", "--model", "mlp"),
    "census": ("--dataset", "census-income", "--model", "mlp"),
    "census51": ("--dataset", "census-income", "--partition", "previous_state", "--clients", "51", "--model", "mlp"),
}
LOSS_ROWS = {"mnist": "512", "census": "8192", "census51": "8192"}
METHODS = {
    "fedsrcvar": ("--bound", "1", "--server-momentum", "0", "--epsilon", "0.01", "--gamma", "0.01"),
    "term": ("--server-momentum", "0", "--tilt", "1"),
}


def study_run(split: str, method: str, rounds: int) -> Run:
    """The validation run of `method` on `split` at `rounds` rounds, with the flags `reproduce` gives it."""
    rows = ("--loss-rows", LOSS_ROWS[split]) if method == "term" else ()
    common = ("--rho", "0.1", "--rounds", str(rounds), "--seed", "0", *rows)
    steps = ("--lr", "0.01", "--threshold-lr", "0.01", "--local-steps", "3")
    return Run((*SPLITS[split], "--method", method, *common, *steps, *METHODS[method]), "validation")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="rounds per run (the tuned profile's: 200)")
    parser.add_argument("--only", default="", help="comma-separated NAMEs, e.g. census-fedsrcvar (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    wanted = {name for name in args.only.split(",") if name}
    runs: dict[str, dict[str, float]] = {}
    for split in SPLITS:
        for method in METHODS:
            name = f"{split}-{method}"
            if wanted and name not in wanted:
                continue
            run = study_run(split, method, args.rounds)
            federation_for(run.flags, run.split)
            started = time.process_time()
            result = execute(run)
            runs[name] = {"cpu_s": round(time.process_time() - started, 2), "worst_risk": result["worst_risk"]}
    publish({"rounds": args.rounds, "runs": runs}, args.json)


if __name__ == "__main__":
    main()
