"""The ServerApp: FedSRCVaR's strategy for the rounds the run config asks, then the held-out risks."""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedfair.flower import FedSRCVaRStrategy, initial_arrays, output_model
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
        seed=seed,
        min_nodes=SITES,
    )
    rounds = int(config["num-server-rounds"])
    strategy.start(grid, initial_arrays(model, seed=seed), num_rounds=rounds)
    theta, c = strategy.output()
    risks = held_out_risks(output_model(model, theta))
    print(f"FedSRCVaR after {rounds} rounds: c = {c:.4f}, held-out risks {risks}", flush=True)
    if config["result-file"]:
        result = {"rounds": rounds, "c": c, "theta": theta.tolist(), **risks}
        Path(str(config["result-file"])).write_text(json.dumps(result))
