"""The statistics before round 1 under the plan's [privacy], end to end over loopback mutual TLS.

Three institutions hold their own CSV tables under one [schema] and a plan with report_epsilon: each
charges the statistics release to its ledger before sending it, adds its share of the noise inside the
secure sum, and the aggregator estimates the encoder from the noised sum, close to the exact one within
what the noise allows. The aggregator and the collaborators run in threads of the test (the real gRPC
server over loopback mutual TLS, real `Collaborator`s): nothing here depends on their being processes,
whose start-ups cost most of a federation's CPU (tests/runtime/test_processes.py runs those).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfair.bundle import load_bundle
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import draft_schema
from fedfair.datasets.statistics import NOISED_STATISTICS_FRACTIONAL_BITS, noised_statistics_vector
from fedfair.runtime.output_folder import BUNDLE_NAME
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.trainer import LocalTable, check_schema_table
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, load_shared_settings, shared_settings
from fedfair.runtime.plan.privacy import decoded_noise_std, statistics_release
from tests.federations import adult_raw_table
from tests.runtime.harness import plan_sections, thread_federation

NAMES = ["site-a", "site-b", "site-c"]
FEATURES = ["age", "education-num", "hours-per-week", "race", "sex"]

pytestmark = pytest.mark.slow


def test_each_site_charges_the_noised_statistics_to_its_ledger_before_round_1(tmp_path: Path) -> None:
    table = adult_raw_table()[[*FEATURES, "income"]]
    paths = []
    for index, name in enumerate(NAMES):
        path = tmp_path / "tables" / f"{name}.csv"
        path.parent.mkdir(exist_ok=True)
        table.iloc[index * 800 : (index + 1) * 800].to_csv(path, index=False)
        paths.append(path)
    schema = draft_schema(table, "income", FEATURES)  # drafted ranges: age [10, 90], hours [0, 100], ...
    workspace = make_workspace(
        tmp_path / "federation",
        NAMES,
        plan=plan_sections(
            training={"rounds": 1}, quorum={"min_collaborators": 3}, privacy={"report_epsilon": 1.0, "budget": 3.0}
        ),
        data={name: {"csv": str(path)} for name, path in zip(NAMES, paths, strict=True)},
    )
    workspace.plan.write_text(workspace.plan.read_text() + "\n" + schema.to_toml())
    plan = load_aggregator_plan(workspace.plan)

    with thread_federation(workspace) as federation:
        federation.join()
    assert not federation.errors, federation.errors
    assert federation.exits == dict.fromkeys(NAMES, 0) and federation.summary["aborted_rounds"] == 0

    release = statistics_release(plan.privacy, schema)
    for name in NAMES:
        ledger = open_ledger(load_collaborator_config(workspace.configs[name])).releases()
        first = ledger[0]  # charged before anything else this site sent
        assert (first["kind"], first["round"], first["mechanism"]) == ("statistics", 0, "skellam"), ledger
        assert (first["mu"], first["l1"], first["l2"]) == (release.mu, release.l1, release.l2)
        assert [entry["kind"] for entry in ledger[1:]] == ["evaluate"]  # the final evaluation, round 1

    # The encoder is the noised sum's: within 6 noise standard deviations of the exact clipped statistics.
    shared = load_shared_settings(shared_settings(plan))
    configs = [load_collaborator_config(workspace.configs[name]) for name in NAMES]
    checked = [check_schema_table(config, shared, LocalTable(None, pd.read_csv(config.data.csv))) for config in configs]
    exact = np.sum([noised_statistics_vector(schema, site.train, site.source) for site in checked], axis=0)
    noise_std = decoded_noise_std(release, plan.survivor_floor(3), 0, 3, NOISED_STATISTICS_FRACTIONAL_BITS)
    encoder = Encoder.from_mapping(load_bundle(workspace.output / BUNDLE_NAME).encoder or {}, "the bundle")
    assert encoder.rows == pytest.approx(exact[0], abs=6 * noise_std + 0.5)
    for column, position in (("age", 1), ("hours-per-week", 7)):
        low, high = next(c.range for c in schema.columns if c.name == column) or (0.0, 0.0)
        half, count = (high - low) / 2, exact[position]
        exact_mean = (low + high) / 2 + half * exact[position + 1] / count
        found = next(c for c in encoder.columns if c.name == column)
        # The mean of u is (S + e_S) / (n + e_n): off by at most |e_S| + |e_n| over n - |e_n|, in units of half.
        bound = half * 12 * noise_std / (count - 6 * noise_std)
        assert found.means[0] == pytest.approx(exact_mean, abs=bound), column
        assert math.isfinite(found.stds[0]) and found.stds[0] > 0
