"""How few bits a coordinate dp_utility's distributed-DP federations can travel in, and at what cost.

For each federation of `benchmarks/dp_utility.py` (its flags, colluders, clip and Poisson rate, the plan's
rounds) and each word size k in {64, 32, 16}, the training noise is fitted to the words
(`fedfair.privacy.ring.Ring`: the most precise fractional bits f whose noised sum of every site wraps
with probability at most 2^-40, counted in delta) for a largest weight of the biggest site's expected batch
(what dp_utility's sites send, every site's batch agreed as its weight) and, for smaller ones, unagreed. Each row gives f,
one record's sensitivity in encoded units after rounding, and the noise's standard deviation relative to
the 64-bit fit's, in real units: above 1, the words cost utility (the rounding inflation, which the
calibration pays for with more noise). A ring no f fits is reported as such (the plan would be refused).
Nothing is trained: the figures are the calibration's.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from dp_utility import CASES, CLIP, DELTA
from published import publish
from fedfair.core.data import client_batch_sizes
from fedfair.core.errors import ConfigError
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.distributed import TrainingNoise
from fedfair.privacy.ring import Ring
from fedfair.research.experiment import load_federation
from fedfair.research.flags import config_from_flags
from fedfair.simulation.secure import DistributedDP

ROUNDS = 1000
EPSILON = 1.0
SMALL_WEIGHTS = (1.0, 10.0)
"""Largest weights below dp_utility's, where a site's vector is small enough for 16-bit words."""


def real_noise_std(noise: TrainingNoise) -> float:
    """The calibrated noise's standard deviation in real units: sqrt(2 mu) / 2^f."""
    return math.sqrt(2.0 * noise.release.mu) * 2.0**-noise.fractional_bits


def rows_for(dataset: str) -> list[dict[str, Any]]:
    """The fitted noise of `dataset`'s federation at every word size and largest weight."""
    flags, colluders, _ = CASES[dataset]
    config = config_from_flags([*flags, "--model", "logreg", "--rounds", str(ROUNDS)])
    federation = load_federation(config)
    sizes = [client.size for client in federation.train]
    rate = config.training.batch_size / sum(sizes)
    privacy = PrivacyConfig(
        enabled=True,
        target_epsilon=EPSILON,
        max_grad_norm=CLIP,
        delta=DELTA,
        accountant="rdp",
        mode="distributed",
        sample_rate=rate,
    )
    plan = DistributedDP(privacy, config.training.local, config.objective, rate, ROUNDS, colluders)
    dimension = int(federation.train[0].features.shape[1]) + 2  # logistic regression's weights, bias and c
    wide = plan.noise(dimension)
    sites = len(sizes)
    batches = tuple(float(batch) for batch in client_batch_sizes(sizes, config.training.batch_size))
    rows = []
    for weight in (*SMALL_WEIGHTS, max(batches)):
        agreed = batches if weight == max(batches) else ()
        for bits in (64, 32, 16):
            row: dict[str, Any] = {"dataset": dataset, "sites": sites, "max_weight": weight, "modulus_bits": bits}
            row["agreed_weights"] = bool(agreed)
            try:
                noise = plan.noise(dimension, Ring(bits, sites, sites - colluders, weight, agreed))
            except ConfigError as error:
                rows.append({**row, "fits": False, "reason": str(error)})
                continue
            rows.append(
                {
                    **row,
                    "fits": True,
                    "fractional_bits": noise.fractional_bits,
                    "sensitivity_units": noise.release.l2,
                    "noise_std_vs_64_bit": real_noise_std(noise) / real_noise_std(wide),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    rows = [row for dataset in CASES for row in rows_for(dataset)]
    for row in rows:
        fitted = (
            f"f = {row['fractional_bits']}, noise x{row['noise_std_vs_64_bit']:.3f} of the 64-bit fit"
            if row["fits"]
            else "does not fit"
        )
        print(
            f"dp_bits: {row['dataset']} max_weight {row['max_weight']:g} in {row['modulus_bits']}-bit words: {fitted}",
            file=sys.stderr,
        )
    publish(
        {"benchmark": "dp_bits", "epsilon": EPSILON, "delta": DELTA, "rounds": ROUNDS, "rows": rows}, args.json, argv
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
