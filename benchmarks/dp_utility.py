"""What distributed DP buys: utility of FedSRCVaR with no DP, local DP and distributed DP, secure aggregation on.

Two federations, logistic regression, FedSRCVaR (one local step per round, the profile's step sizes
and total batch 1024):
  - Adult by race, 3 sites (eps 0.1, rho 0.3, as benchmarks/dp_bench.py), 1 colluding site;
  - Census-Income in 51 sites by state of previous residence (eps 0.05, rho 0.1), 5 colluding sites.
Modes, at DP epsilon 1, 3 and 8 (delta 1e-5, the plan's rounds):
  - none: no DP (the reference);
  - local: every site runs DP-SGD with its own Gaussian noise, theta and c clipped jointly at C = 20
    (today's `[privacy]`, RDP accountant);
  - distributed: no local noise; theta clipped at C = 20 and c separately at its own bound, every site
    Poisson-samples at q = 1024 / N, and the sites add Skellam noise inside the secure sum, calibrated so
    that the shares no single reader knows (n - max(colluders, 1) of them) carry the whole noise
    (`fedfair.privacy.distributed`).
Equal weights (`[influence] weights = "equal"`: every site sends its update with weight 1, the server
divides by the number of sites), Adult, distributed, at each epsilon, calibrated two ways: "equal-batch"
as before, as if each weight were the site's batch (one record moving the sum by lr C), and "equal" from
the true per-record sensitivity lr C / min b_k (`InfluenceSettings.weight_per_record`); `--equal-only`
runs only these rows.
Rows {dataset, sites, colluders, mode, weights, epsilon, delta, worst_group_risk, mean_risk, accuracy} (held-out,
averaged iterate; each noised row the mean of `--repeats` runs with fresh noise, beside the standard
deviation of the worst-group risk over them), plus the epsilon the sites' accountants report, the threshold c, the noise standard
deviation of the decoded weighted sum and the seconds. `targets` compares distributed at epsilon 1 with
no DP. Adult's secure sums run the masking protocol; Census-Income's 51 parties add their encodings
directly (`SecureSum(masked=False)`: the masks cancel exactly, so the decoded sums are the same, and the
protocol's key agreement costs two seconds a round).

`encoding` times, at d = 10^6 and interleaved (best of 5, CPU seconds): one mask stream's keystream
(what masking costs per pair), a plain encode plus one mask, the noised encode (rotation, rounding,
Skellam noise) plus one mask, and the reference sampler: numpy's own Skellam (two PTRS Poisson draws
from PCG64, no cryptography) for as many coordinates. The issue's target, noised encode + mask within
2x the keystream, measures the cost of drawing any Poisson variate against AES in counter mode (numpy's
sampler alone is tens of times the keystream), not fedfair's code; `noised_vs_reference` compares the
noised encode + mask with a plain encode + mask plus numpy's sampler, what a non-cryptographic noised
encoder would cost at the least. `--quick` runs 200 rounds instead of 1000. `--bits K [K]` runs only the
word-size rows: no DP and distributed at epsilon 1, both federations, in 64-bit and K-bit words (16 and/or 32),
every site's batch agreed as its weight (`EncodingConfig.weights`), and each row's relative difference from
the 64-bit one; `--dataset-repeats DATASET N` runs one dataset's rows N times instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from published import publish
from fedfair.core import server
from fedfair.core.data import client_batch_sizes
from fedfair.core.update import Update
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.distributed import noise_excess
from fedfair.research.experiment import final_report, load_federation
from fedfair.research.flags import config_from_flags
from fedfair.research.methods import SECURE_CLIP, secure_sum
from fedfair.secagg import prg
from fedfair.secagg.encode import Encoder, EncodingConfig, largest_safe_fractional_bits
from fedfair.secagg.noise import NoiseConfig
from fedfair.secagg.rotation import rotation_key
from fedfair.simulation.rounds import run_fedsrcvar
from fedfair.simulation.secure import DistributedDP, SecureSum, plan_sample_rate

EPSILONS = (1.0, 3.0, 8.0)
DELTA = 1e-5
CLIP = 20.0
"""theta's clip bound in both modes: dp_bench's, above most of Adult's per-sample gradient norms."""

CASES = {
    "adult": (
        ["--dataset", "adult", "--partition", "race", "--clients", "3", "--epsilon", "0.1", "--rho", "0.3"],
        1,
        True,
    ),
    "census-income": (
        [
            "--dataset",
            "census-income",
            "--partition",
            "previous_state",
            "--clients",
            "51",
            "--epsilon",
            "0.05",
            "--rho",
            "0.1",
        ],
        5,
        False,
    ),
}
"""dataset: (flags, colluders, whether the secure sums run the masking protocol)."""


class EqualWeights:
    """A secure sum of every update sent with weight 1 (`weights = "equal"`) instead of its batch b_k."""

    def __init__(self, inner: SecureSum) -> None:
        self.inner = inner

    @property
    def noise_stds(self) -> list[float]:
        """The inner sum's noise standard deviation per round."""
        return self.inner.noise_stds

    def __call__(self, updates: list[Update]) -> server.Aggregate:
        return self.inner([dataclasses.replace(update, weight=1.0) for update in updates])


WEIGHTS = ("declared", "equal-batch", "equal")
"""How the rows weight and calibrate: batch weights; equal weights calibrated as if they were batches; equal
weights calibrated to the true per-record sensitivity."""


def agreed_encoding(batches: list[int], modulus_bits: int) -> EncodingConfig:
    """The secure sum's encoding in `modulus_bits`-bit words with every site's batch agreed as its weight."""
    agreed = tuple(float(batch) for batch in batches)
    most = max(agreed)
    bits = largest_safe_fractional_bits(SECURE_CLIP, modulus_bits, len(agreed), most, agreed)
    return EncodingConfig(SECURE_CLIP, most, bits, modulus_bits, weights=agreed)


def run(
    dataset: str, mode: str, epsilon: float, rounds: int, weights: str = "declared", modulus_bits: int | None = None
) -> dict[str, Any]:
    flags, colluders, masked = CASES[dataset]
    config = config_from_flags([*flags, "--model", "logreg", "--rounds", str(rounds)])
    federation = load_federation(config)
    sites = len(federation.train)
    sizes = [client.size for client in federation.train]
    rate = plan_sample_rate(config.training, sizes)
    batches = client_batch_sizes(sizes, config.training.batch_size)  # b_k as make_learners sets it
    # What one record's step is scaled by: w_k / b_k, 1 / min b_k under equal weights.
    weight_per_record = 1.0 / min(batches) if weights == "equal" else 1.0
    encoding = secure_sum(federation).encoding if modulus_bits is None else agreed_encoding(batches, modulus_bits)
    privacy: PrivacyConfig | None = None
    summed = SecureSum(encoding, masked=masked)
    if mode == "local":
        privacy = PrivacyConfig(enabled=True, target_epsilon=epsilon, max_grad_norm=CLIP, delta=DELTA, accountant="rdp")
    elif mode == "distributed":
        privacy = PrivacyConfig(
            enabled=True,
            target_epsilon=epsilon,
            max_grad_norm=CLIP,
            delta=DELTA,
            accountant="rdp",
            mode="distributed",
            sample_rate=rate,
        )
        plan = DistributedDP(
            privacy, config.training.local, config.objective, rate, rounds, colluders, weight_per_record
        )
        summed = SecureSum(encoding, distributed=plan, masked=masked)
    aggregate = EqualWeights(summed) if weights != "declared" else summed
    started = time.process_time()
    result = run_fedsrcvar(federation, config.objective, config.training, aggregate=aggregate, privacy=privacy)
    seconds = time.process_time() - started
    report = final_report(config, federation, result.state.theta_average, result.state.c_average)
    test = report["test"]
    spent = [float(site["epsilon"]) for site in result.privacy.values()]
    row = {
        "dataset": dataset,
        "sites": sites,
        "colluders": colluders,
        # Equal-weights rows under their own mode, so that they sit beside the batch-weighted ones, not over them.
        "mode": mode if weights == "declared" else f"{mode}, {weights} weights",
        "weights": weights,
        "weight_per_record": weight_per_record,
        "epsilon": epsilon if mode != "none" else "inf",
        "delta": DELTA,
        "worst_group_risk": test["worst_risk"],
        "mean_risk": test["mean_risk"],
        "accuracy": test["accuracy"],
        "rho": config.objective.rho,
        "rounds": rounds,
        "c": report["c"],
        "epsilon_spent": max(spent) if spent else 0.0,
        "noise_std": aggregate.noise_stds[-1] if mode == "distributed" else None,
        "noise_excess": noise_excess(sites, sites, colluders) if mode == "distributed" else None,
        "masked": masked,
        "modulus_bits": encoding.modulus_bits,
        "fractional_bits": summed.training_noise.fractional_bits if summed.training_noise else encoding.fractional_bits,
        "cpu_seconds": seconds,
    }
    print(
        f"dp_utility: {dataset} {mode} {weights} weights eps {epsilon:g}: worst {test['worst_risk']:.4f} mean {test['mean_risk']:.4f} "
        f"acc {test['accuracy']:.4f} ({seconds:.0f} s)",
        file=sys.stderr,
    )
    return row


def encoding_costs(dimension: int = 10**6, repeats: int = 5) -> dict[str, Any]:
    """CPU seconds of a mask stream, a plain encode + mask and a noised encode + mask at ``dimension``."""
    plain = Encoder(EncodingConfig(10.0, 1024.0, 16, 64), 10)
    noise = NoiseConfig(mu=1e8, norm_clip=1.0, dimension=dimension, rotation_key=rotation_key("bench", 1, "training"))
    noised = Encoder(dataclasses.replace(plain.config, noise=noise), 10)
    vector = np.linspace(-1.0, 1.0, dimension) * 1e-3
    words = noised.encoded_dimension(dimension) + 1

    def keystream() -> None:
        buffer = np.empty(words, dtype=np.uint64)
        prg.Keystream(os.urandom(32)).read_into(buffer.data.cast("B"))

    def encode_and_mask(encoder: Encoder) -> None:
        encoded = encoder.encode(vector, 512.0)
        prg.apply_masks(encoded, [(os.urandom(32), 1)])

    generator = np.random.default_rng()

    def numpy_skellam() -> None:
        generator.poisson(noise.mu, words - 1) - generator.poisson(noise.mu, words - 1)

    cases = {
        "keystream": keystream,
        "plain": lambda: encode_and_mask(plain),
        "noised": lambda: encode_and_mask(noised),
        "numpy_skellam": numpy_skellam,
    }
    for case in cases.values():
        case()  # compile and warm up
    best = dict.fromkeys(cases, math.inf)
    for _ in range(repeats):
        for name, case in cases.items():
            started = time.process_time()
            case()
            best[name] = min(best[name], time.process_time() - started)
    return {
        "dimension": dimension,
        "encoded_words": words,
        "seconds": best,
        "plain_encode_mask_vs_keystream": best["plain"] / best["keystream"],
        "noised_encode_mask_vs_keystream": best["noised"] / best["keystream"],
        "noised_ns_per_coordinate": best["noised"] / dimension * 1e9,
        "numpy_skellam_vs_keystream": best["numpy_skellam"] / best["keystream"],
        "noised_vs_reference": best["noised"] / (best["plain"] + best["numpy_skellam"]),
    }


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def risk(dataset: str, mode: str, epsilon: float | str) -> float:
        return next(
            r["worst_group_risk"] for r in rows if (r["dataset"], r["mode"], r["epsilon"]) == (dataset, mode, epsilon)
        )

    out: dict[str, Any] = {}
    for dataset in CASES:
        reference = risk(dataset, "none", "inf")
        for mode in ("local", "distributed"):
            out[f"{dataset}_{mode}_eps1_over_none"] = risk(dataset, mode, 1.0) / reference - 1.0
    out["census_distributed_eps1_within_10pct"] = out["census-income_distributed_eps1_over_none"] <= 0.10
    out["adult_distributed_eps1_within_20pct"] = out["adult_distributed_eps1_over_none"] <= 0.20
    return out


def repeated(
    dataset: str,
    mode: str,
    epsilon: float,
    rounds: int,
    repeats: int,
    weights: str = "declared",
    modulus_bits: int | None = None,
) -> dict[str, Any]:
    """`run` `repeats` times: the noise comes from fresh OS entropy every run, so one run's risk is one draw;
    the row reports the mean of each risk and the standard deviation of the worst-group risk."""
    runs = []
    for _ in range(repeats):
        runs.append(run(dataset, mode, epsilon, rounds, weights, modulus_bits))
        # A run's federation and sums sit in reference cycles the collector seldom reaches: Census-Income's
        # held about 700 MB a run until collected (30 runs a row exhausted 24 GB).
        gc.collect()
    row = dict(runs[0])
    for key in ("worst_group_risk", "mean_risk", "accuracy", "c", "epsilon_spent", "cpu_seconds"):
        row[key] = float(np.mean([item[key] for item in runs]))
    row["worst_group_risk_sd"] = (
        float(np.std([item["worst_group_risk"] for item in runs], ddof=1)) if repeats > 1 else 0.0
    )
    row["repeats"] = repeats
    return row


def word_sizes(bits: list[int], rounds: int, repeats: dict[str, int]) -> dict[str, Any]:
    """No DP and distributed DP at epsilon 1 in 64-bit and each of `bits`-bit words, and each one's difference.

    Each dataset's rows run `repeats[dataset]` times.
    """
    rows = [
        repeated(dataset, mode, epsilon, rounds, repeats[dataset], modulus_bits=width)
        for dataset in CASES
        for mode, epsilon in (("none", math.inf), ("distributed", 1.0))
        for width in (64, *bits)
    ]
    return {"rounds": rounds, "repeats": repeats, "rows": rows, "comparisons": comparisons(rows)}


def comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each narrower row against the 64-bit row of its dataset and mode.

    The relative difference in worst-group risk, its standard error from the two rows' standard deviations
    over their runs, and the decoded noise's standard deviation against the 64-bit row's.
    """
    wide = {(row["dataset"], row["mode"]): row for row in rows if row["modulus_bits"] == 64}
    pairs = []
    for row in rows:
        if row["modulus_bits"] == 64:
            continue
        reference = wide[row["dataset"], row["mode"]]
        risk = reference["worst_group_risk"]
        error = math.hypot(
            reference["worst_group_risk_sd"] / math.sqrt(reference["repeats"]),
            row["worst_group_risk_sd"] / math.sqrt(row["repeats"]),
        )
        pairs.append(
            {
                "dataset": row["dataset"],
                "mode": row["mode"],
                "epsilon": row["epsilon"],
                "bits": row["modulus_bits"],
                "fractional_bits": row["fractional_bits"],
                "repeats": row["repeats"],
                "worst_group_risk_64": risk,
                "worst_group_risk": row["worst_group_risk"],
                "relative_difference": row["worst_group_risk"] / risk - 1.0,
                "relative_difference_se": error / risk,
                "noise_std_ratio": row["noise_std"] / reference["noise_std"] if reference["noise_std"] else None,
            }
        )
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="200 rounds instead of 1000")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each noised row, averaged (default 3)")
    parser.add_argument(
        "--dataset-repeats",
        nargs=2,
        action="append",
        default=[],
        metavar=("DATASET", "RUNS"),
        help="with --bits: runs of each of DATASET's rows instead of --repeats",
    )
    parser.add_argument("--equal-only", action="store_true", help="only Adult's equal-weights rows")
    parser.add_argument(
        "--bits", type=int, nargs="+", choices=(16, 32), help="only the word-size rows: these bits against 64"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds = 200 if args.quick else 1000
    if args.bits is not None:
        repeats = dict.fromkeys(CASES, args.repeats) | {name: int(runs) for name, runs in args.dataset_repeats}
        if set(repeats) != set(CASES):
            parser.error(f"--dataset-repeats names one of {', '.join(CASES)}")
        publish(word_sizes(args.bits, rounds, repeats), args.json)
        return
    equal = [
        repeated("adult", "distributed", epsilon, rounds, args.repeats, weights)
        for weights in WEIGHTS[1:]
        for epsilon in EPSILONS
    ]
    if args.equal_only:
        publish({"rows": [run("adult", "none", math.inf, rounds, "equal"), *equal]}, args.json)
        return
    encoding = encoding_costs()
    print(
        f"dp_utility: noised encode + mask {encoding['noised_encode_mask_vs_keystream']:.1f}x the keystream, "
        f"{encoding['noised_vs_reference']:.2f}x a plain one plus numpy's Skellam",
        file=sys.stderr,
    )
    rows = []
    for dataset in CASES:
        rows.append(run(dataset, "none", math.inf, rounds))
        for mode in ("local", "distributed"):
            rows.extend(repeated(dataset, mode, epsilon, rounds, args.repeats) for epsilon in EPSILONS)
    rows.extend(equal)
    publish({"rows": rows, "targets": targets(rows), "encoding": encoding}, args.json)


if __name__ == "__main__":
    main()
