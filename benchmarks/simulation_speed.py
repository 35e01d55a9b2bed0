"""How fast the in-process federation runs: rounds/s, per-step overhead, a full paper sweep.

Prints JSON (and writes it with --json PATH):
  {"device": "cpu", "rounds_per_s": {"3": x, "51": x, "51-dirichlet": x}, "rounds_per_s_loop": {...},
   "vectorised_speedup": {...}, "setup_s": {...}, "modes": {...}, "step_overhead_ratio": x,
   "sweep": {"points", "rounds", "seconds"}}
`rounds_per_s` is the simulation as it runs (clients vectorised where they can be,
`modes` says which ran) and `rounds_per_s_loop` the loop over learners, both timed
in this run over the rounds after the first (building the learners, `setup_s`, is
timed apart): 3 clients by race, 51 near-equal (iid) clients, and 51 uneven ones
(Dirichlet label skew, so the padded batches carry the most padding), all on Adult
with logistic regression and tau = 1.
`step_overhead_ratio` is the time of one LocalLearner.step divided by a bare
forward/backward/update on the same batch, measured in the same run: how much
the core's bookkeeping costs on a small model. Target: the 14 x 9 sweep of 1,000
rounds in under 5 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from published import publish
from fedfair.core.config import ObjectiveConfig
from fedfair.core.models import build_model, per_sample_loss
from fedfair.core.objective import RCVaRThreshold
from fedfair.research.experiment import load_federation
from fedfair.research.flags import config_from_flags, parse_flags
from fedfair.simulation.rounds import make_learners, run_fedsrcvar
from fedfair.research.arguments import PAPER_EPSILONS, PAPER_RHOS
from fedfair.research.sweep import grid_configs, sweep


@dataclass(frozen=True)
class Speed:
    """One timed simulation: rounds/s after the first round, the time before it, and how clients ran."""

    rounds_per_s: float
    setup_s: float
    mode: str


def rounds_per_second(
    clients: int, partition: str, rounds: int, *, vectorise: bool = True, device: str = "cpu"
) -> Speed:
    """Time `rounds` rounds; the first round's end splits setup (learners, first step) from the steady pace."""
    flags = ["--partition", partition, "--clients", str(clients), "--rounds", str(rounds), "--device", device]
    config = config_from_flags(flags)
    config = replace(config, simulation=replace(config.simulation, record_every=0))
    federation = load_federation(config)
    finished: list[float] = []
    started = time.perf_counter()
    result = run_fedsrcvar(
        federation,
        config.objective,
        config.training,
        on_round=lambda _: finished.append(time.perf_counter()),
        vectorise=vectorise,
    )
    mode = "vectorised" if result.vectorised else f"loop ({result.loop_reason})"
    return Speed((rounds - 1) / (finished[-1] - finished[0]), finished[0] - started, mode)


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
    parser.add_argument(
        "--device", default="cpu", help="where the rounds/s simulations train (cpu, cuda); the sweep stays on the CPU"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)

    rounds = 200 if args.quick else 1000
    # (key, clients, partition): the loop at 51 clients is slow, so it runs a fifth of the rounds.
    settings = [("3", 3, "race"), ("51", 51, "iid"), ("51-dirichlet", 51, "dirichlet")]
    fast = {
        key: rounds_per_second(clients, partition, rounds, device=args.device) for key, clients, partition in settings
    }
    loop = {
        key: rounds_per_second(
            clients, partition, rounds if clients < 10 else max(rounds // 5, 50), vectorise=False, device=args.device
        )
        for key, clients, partition in settings
    }
    results: dict[str, object] = {
        "device": args.device,
        "rounds_per_s": {key: speed.rounds_per_s for key, speed in fast.items()},
        "rounds_per_s_loop": {key: speed.rounds_per_s for key, speed in loop.items()},
        "vectorised_speedup": {key: fast[key].rounds_per_s / loop[key].rounds_per_s for key in fast},
        "setup_s": {key: speed.setup_s for key, speed in fast.items()},
        "modes": {key: speed.mode for key, speed in fast.items()},
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
    publish(results, args.json)


if __name__ == "__main__":
    main()
