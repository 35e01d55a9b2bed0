"""The ServerApp: FedSRCVaR's strategy for the rounds the run config asks, then the held-out risks."""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import Context
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp

from fedfair.flower import FedSRCVaRStrategy, initial_arrays, output_model
from fedfair.flower.secaggplus import train_with_secaggplus
from fedsrcvar_app.task import SITES, held_out_risks, model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train, then report the averaged model's held-out risks.

    Here the pooled test rows stand in for the private worst-group report a fedfair federation computes
    inside the secure sum.
    """
    config = context.run_config
    seed = int(config["seed"])
    strategy = FedSRCVaRStrategy(
        rho=float(config["rho"]),
        epsilon=float(config["epsilon"]),
        local_steps=int(config["local-steps"]),
        lr=float(config["lr"]),
        threshold_lr=float(config["threshold-lr"]),
        batch_size=int(config["batch-size"]),
        batch_fraction=float(config["batch-fraction"]) or None,
        seed=seed,
        min_nodes=SITES,
    )
    rounds = int(config["num-server-rounds"])
    start = initial_arrays(model, seed=seed)
    if config["secaggplus"]:
        # Each site's weight b_k is at most the total batch, so max_weight = the total scales no update up.
        workflow = SecAggPlusWorkflow(num_shares=SITES, reconstruction_threshold=2, max_weight=strategy.batch_size)
        train_with_secaggplus(strategy, grid, context, start, rounds, workflow)
    else:
        strategy.start(grid, start, num_rounds=rounds)
    theta, c = strategy.output()
    risks = held_out_risks(output_model(model, theta))
    print(f"FedSRCVaR after {rounds} rounds: c = {c:.4f}, held-out risks {risks}", flush=True)
    if config["result-file"]:
        last = strategy.state
        assert last is not None  # the rounds set it
        result = {
            "rounds": rounds,
            "c": c,
            "theta": theta.tolist(),
            "last_c": last.c,
            "last_theta": last.theta.tolist(),
            **risks,
        }
        Path(str(config["result-file"])).write_text(json.dumps(result))
