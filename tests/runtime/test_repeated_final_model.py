"""A final evaluation on a model the sites already answered: the kept words again, the counts a release of their own.

Two rounds with ``average_from = 0.5`` average one iterate, theta^2, which round 1's evaluation already
evaluated (its theta-bar is the model the next round starts from). The final evaluation asks for the same
answers plus the worst group's composition. Each site must not answer the same model afresh (a second
noise draw on one model would let the two be averaged), so it sends its kept words again and adds the counts
as their own release, charged once to its ledger. Three institutions over loopback mutual TLS under a
[schema] and noised evaluations, in threads of the test (the real gRPC server, real `Collaborator`s): nothing
here depends on their being processes, whose start-ups would cost most of the test's CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.datasets.schema import draft_schema
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.plan.privacy import answer_release, composition_release, decoded_noise_std
from tests.federations import adult_raw_table
from tests.runtime.harness import plan_sections, thread_federation
from tests.runtime.test_noised_statistics import FEATURES, NAMES

pytestmark = pytest.mark.slow


def test_a_final_model_answered_before_gets_its_kept_words_and_the_counts_as_their_own_release(tmp_path: Path) -> None:
    table = adult_raw_table()[[*FEATURES, "income"]]
    paths = {name: tmp_path / f"{name}.csv" for name in NAMES}
    for index, path in enumerate(paths.values()):
        table.iloc[index * 700 : (index + 1) * 700].to_csv(path, index=False)
    workspace = make_workspace(
        tmp_path / "federation",
        NAMES,
        plan=plan_sections(
            training={"rounds": 2, "average_from": 0.5},
            quorum={"min_collaborators": 3},
            evaluation={"every": 1, "composition": ["sex", "income"]},
            privacy={"report_epsilon": 1.0, "interim_report_epsilon": 0.5, "budget": 10.0},
        ),
        data={name: {"csv": str(path)} for name, path in paths.items()},
    )
    schema = draft_schema(table, "income", FEATURES)
    workspace.plan.write_text(workspace.plan.read_text() + "\n" + schema.to_toml())
    plan = load_aggregator_plan(workspace.plan)
    columns = plan.counted_columns(2)

    with thread_federation(workspace) as federation:
        federation.join()
    assert not federation.errors, federation.errors
    assert federation.exits == dict.fromkeys(NAMES, 0) and federation.summary["aborted_rounds"] == 0

    log = read_round_log(workspace.output)
    first, final = log[0]["evaluation"], log[1]["evaluation"]
    assert first["status"] == "done" and final["status"] == "done", (first, final)
    assert final["model"] == first["model"]  # the same theta-bar, evaluated twice
    # The shared part is the earlier answer itself: the same words over the same survivors decode the same.
    for key in ("worst_risk", "worst_risk_low", "worst_risk_high", "mean_risk", "samples", "noise_std"):
        assert final[key] == first[key], key
    assert final["report_epsilon"] == first["report_epsilon"] == 0.5  # what the kept answer spent
    assert final["answers_of_round"] == 1 and "answers_of_round" not in first
    counts = composition_release(plan.privacy, columns)
    composition = final["composition"]
    assert composition["epsilon"] == 1.0 and composition["rows"] is not None
    # The counts' noise is their own release's (not the joint answer's), summed over the three sites.
    floor = plan.survivor_floor(3)
    assert composition["noise_std"] == pytest.approx(decoded_noise_std(counts, floor, 0, 3), rel=1e-12)
    joint = decoded_noise_std(answer_release(plan.privacy, columns), floor, 0, 3)
    assert composition["noise_std"] < joint
    for name in NAMES:
        entries = open_ledger(load_collaborator_config(workspace.configs[name])).releases()
        answers = [entry for entry in entries if entry["kind"] == "evaluate"]
        interim = answer_release(plan.privacy, (), final=False)
        assert [(e["round"], e["mu"], e["l2"]) for e in answers] == [
            (1, interim.mu, interim.l2),
            (2, counts.mu, counts.l2),  # exactly one more charge: the counts alone
        ], answers
