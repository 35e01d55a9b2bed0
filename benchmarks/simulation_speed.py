"""How fast the in-process federation runs: rounds/s, per-step overhead, a full paper sweep.

Prints JSON (and writes it with --json PATH):
  {"rounds_per_s": {"3": x, "51": x}, "step_overhead_ratio": x, "sweep": {"points", "rounds", "seconds"}}
`step_overhead_ratio` is the time of one LocalLearner.step divided by a bare
forward/backward/update on the same batch, measured in the same run: how much
the core's bookkeeping costs on a small model. Target: the 14 x 9 sweep of 1,000
rounds in under 5 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from fedfair.core.config import ObjectiveConfig
from fedfair.core.models import build_model, per_sample_loss
from fedfair.core.objective import RCVaRThreshold
from fedfair.research.experiment import config_from_flags, load_federation, parse_flags
from fedfair.research.simulation import make_learners, run_fedsrcvar
from fedfair.research.sweep import PAPER_EPSILONS, PAPER_RHOS, grid_configs, sweep


def rounds_per_second(clients: int, partition: str, rounds: int) -> float:
    config = config_from_flags(["--partition", partition, "--clients", str(clients), "--rounds", str(rounds)])
    config = replace(config, training=replace(config.training, record_every=0))
    federation = load_federation(config)
    started = time.perf_counter()
    run_fedsrcvar(federation, config.objective, config.training)
    return rounds / (time.perf_counter() - started)


def step_overhead_ratio(repeats: int = 2000) -> float:
    config = config_from_flags(["--rounds", "1"])
    federation = load_federation(config)
    _, learners = make_learners(federation, config.training, config.objective)
    learner = learners[0]
    learner.begin(torch.zeros(federation.num_features + 1), config.objective.bound)
    started = time.perf_counter()
    for _ in range(repeats):
        learner.step()
    core = (time.perf_counter() - started) / repeats

    features, labels = learner.features[: learner.batch_size], learner.labels[: learner.batch_size]
    model = build_model("logreg", federation.num_features, 2)
    head = RCVaRThreshold(ObjectiveConfig())
    parameters = [*model.parameters(), head.c]
    started = time.perf_counter()
    for _ in range(repeats):
        grads = torch.autograd.grad(head(per_sample_loss(model(features), labels)).mean(), parameters)
        with torch.no_grad():
            for parameter, grad in zip(parameters, grads):
                parameter.sub_(0.1 * grad)
    bare = (time.perf_counter() - started) / repeats
    return core / bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="a 3 x 3 grid of 200 rounds instead of the paper's grid")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    torch.set_num_threads(1)

    rounds = 200 if args.quick else 1000
    results = {
        "rounds_per_s": {
            "3": rounds_per_second(3, "race", rounds),
            "51": rounds_per_second(51, "iid", max(rounds // 5, 50)),
        },
        "step_overhead_ratio": step_overhead_ratio(500 if args.quick else 2000),
    }
    epsilons, rhos = (PAPER_EPSILONS[:3], PAPER_RHOS[:3]) if args.quick else (PAPER_EPSILONS, PAPER_RHOS)
    configs = grid_configs(parse_flags(["--rounds", str(rounds)]), epsilons, rhos)
    federation = load_federation(configs[0])
    started = time.perf_counter()
    sweep(configs, federation, args.jobs)
    results["sweep"] = {
        "points": len(epsilons) * len(rhos),
        "rounds": rounds,
        "jobs": args.jobs,
        "seconds": time.perf_counter() - started,
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
