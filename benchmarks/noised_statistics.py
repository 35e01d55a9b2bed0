"""What noising the statistics before round 1 costs: worst-group risk with the exact encoder and with noised ones.

Three institutions cut from Adult's raw table (1,500 / 900 / 400 rows, as the issue's hospitals; a fifth of
each held out), every feature but fnlwgt, the schema `fedfair data schema` drafts (ranges rounded outward
from the table). The exact encoder is `encoder_from_statistics` of the sites' summed exact statistics, as a
plan without report_epsilon builds it; each noised one is `encoder_from_noised_statistics` of the summed
noised layout plus the secure sum's noise at report_epsilon in {0.3, 1, 3}, delta 1e-5: Skellam with the
total mu of the three sites' shares when the plan's floor is 2 survivors and no site colludes (init's
defaults for three sites, `plan_floor`), each share the release's mu / 2, drawn with numpy in encoded units
(2^-12) and decoded. Each encoder encodes every site's rows; FedSRCVaR (logistic regression, eps 0.1,
rho 0.3, 300 rounds, one local step, batch fraction 0.05, the same seed) trains on them in process, and
the pooled held-out worst-group risk at rho 0.3 is reported: the exact encoder's, and per epsilon the mean
and standard deviation over `--repeats` noise draws of the noised ones and of their difference from the
exact one. Also each epsilon's noise standard deviation per coordinate and the largest error in a
column's mean, in units of that column's exact standard deviation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from published import publish
from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.evaluation import evaluate
from fedfair.core.models import build_model
from fedfair.datasets.builtin import adult_table
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.registry import dataset_info
from fedfair.datasets.schema import Schema, draft_schema
from fedfair.datasets.statistics import (
    NOISED_STATISTICS_FRACTIONAL_BITS,
    encoder_from_noised_statistics,
    encoder_from_statistics,
    noised_statistics_vector,
    statistics_vector,
)
from fedfair.fairness import pooled
from fedfair.runtime.plan.privacy import PlanPrivacy, decoded_noise_std, party_mu, plan_floor, statistics_release
from fedfair.secagg import SecurityParameters
from fedfair.simulation.federation import federation_from_arrays
from fedfair.simulation.rounds import run_fedsrcvar

SITES = {"hospital-a": 1500, "hospital-b": 900, "hospital-c": 400}
EPSILONS = (0.3, 1.0, 3.0)
DELTA = 1e-5
FLOOR = plan_floor(len(SITES), 2, SecurityParameters(threshold=2), True)  # quorum 2, no colluders, complete graph
OBJECTIVE = ObjectiveConfig(epsilon=0.1, rho=0.3)
TRAINING = TrainingConfig(rounds=300, local=LocalConfig(local_steps=1, lr=0.5, threshold_lr=0.5), batch_fraction=0.05)


def tables() -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """Each site's training and held-out rows: consecutive slices of Adult's shuffled raw table."""
    table = adult_table(dataset_info("adult")).drop(columns=["fnlwgt"])
    table = table.sample(frac=1.0, random_state=0).reset_index(drop=True)
    train, test, start = {}, {}, 0
    for name, rows in SITES.items():
        site = table.iloc[start : start + rows]
        start += rows
        cut = rows * 4 // 5
        train[name], test[name] = site.iloc[:cut], site.iloc[cut:]
    return train, test


def labelled(encoder: Encoder, rows: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
    """`rows` encoded, features and class indices (every row here has its label)."""
    features, labels = encoder.encode(rows, name)
    assert labels is not None
    return features, labels


def worst_risk(encoder: Encoder, train: dict[str, pd.DataFrame], test: dict[str, pd.DataFrame]) -> float:
    """FedSRCVaR on the sites' rows encoded by `encoder`: the pooled held-out worst-group risk at rho."""
    federation = federation_from_arrays(
        list(SITES),
        [labelled(encoder, train[name], name) for name in SITES],
        [labelled(encoder, test[name], name) for name in SITES],
        len(encoder.class_names),
        None,
    )
    torch.manual_seed(0)
    result = run_fedsrcvar(federation, OBJECTIVE, TRAINING)
    model = build_model("logreg", federation.num_features, federation.num_classes)
    losses = evaluate(model, result.state.theta_average, federation.pooled("test"))
    report = pooled.group_risk_report(np.asarray(losses.losses), np.asarray(losses.correct), OBJECTIVE.rho)
    return float(report.worst_risk)


def noised_sum(schema: Schema, exact: np.ndarray, epsilon: float, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """The decoded noised statistics: `exact` plus the three sites' Skellam shares, and the noise's std."""
    release = statistics_release(PlanPrivacy(report_epsilon=epsilon, delta=DELTA, budget=10.0), schema)
    total_mu = len(SITES) * party_mu(release, FLOOR, 0)
    scale = 2.0**NOISED_STATISTICS_FRACTIONAL_BITS
    noise = (rng.poisson(total_mu, exact.size) - rng.poisson(total_mu, exact.size)) / scale
    return exact + noise, decoded_noise_std(release, FLOOR, 0, len(SITES), NOISED_STATISTICS_FRACTIONAL_BITS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--repeats", type=int, default=5, help="noise draws per epsilon (default 5)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, test = tables()
    whole = pd.concat([*train.values(), *test.values()])  # the draft lists every category the sites hold
    schema = draft_schema(whole, "income", [name for name in whole.columns if name != "income"])
    exact_encoder = encoder_from_statistics(
        schema, np.sum([statistics_vector(schema, rows) for rows in train.values()], axis=0)
    )
    exact_risk = worst_risk(exact_encoder, train, test)
    print(f"noised_statistics: exact statistics: worst-group risk {exact_risk:.4f}", file=sys.stderr)
    noised_layout = np.sum([noised_statistics_vector(schema, rows) for rows in train.values()], axis=0)
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = [{"statistics": "exact", "epsilon": "inf", "worst_group_risk": exact_risk}]
    numeric = [i for i, column in enumerate(schema.columns) if column.kind == "numeric"]
    for epsilon in EPSILONS:
        risks, mean_errors, noise_std = [], [], 0.0
        for _ in range(args.repeats):
            summed, noise_std = noised_sum(schema, noised_layout, epsilon, rng)
            encoder = encoder_from_noised_statistics(schema, summed, noise_std)
            mean_errors.append(
                max(
                    abs(encoder.columns[i].means[0] - exact_encoder.columns[i].means[0])
                    / exact_encoder.columns[i].stds[0]
                    for i in numeric
                )
            )
            risks.append(worst_risk(encoder, train, test))
        row = {
            "statistics": "noised",
            "epsilon": epsilon,
            "delta": DELTA,
            "noise_std": noise_std,
            "worst_group_risk": float(np.mean(risks)),
            "worst_group_risk_sd": float(np.std(risks, ddof=1)) if len(risks) > 1 else 0.0,
            "change_vs_exact": float(np.mean(risks)) - exact_risk,
            "largest_mean_error_in_sds": float(np.max(mean_errors)),
            "repeats": args.repeats,
        }
        rows.append(row)
        print(
            f"noised_statistics: eps {epsilon:g}: noise sd {noise_std:.3g}, worst-group risk "
            f"{row['worst_group_risk']:.4f} +- {row['worst_group_risk_sd']:.4f} ({row['change_vs_exact']:+.4f}), "
            f"mean error up to {row['largest_mean_error_in_sds']:.3f} sd",
            file=sys.stderr,
        )
    publish({"rows": rows, "sites": SITES, "floor": FLOOR}, args.json)


if __name__ == "__main__":
    main()
