"""The federated evaluation: one sum of the plan's length, its risks and, at the final round, who is in the
worst-off group, checked against the pooled composition of every site's held-out rows.

The fast test hands the evaluation a driver that returns a sum the test made; the slow one runs a
federation of three institutions' own tables under a [schema] with real gRPC over loopback mutual TLS
(threads of this process), one site missing two rounds, and compares the composition the aggregator
reports, from secure sums only, with `fedfair.fairness.composition` on every site's held-out rows
put together at the c-bar it states.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fedfair.runtime.transport import WireStage
import torch

from fedfair.bundle import load_bundle
from fedfair.core.data import ClientData
from fedfair.core.evaluation import evaluate
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import draft_schema
from fedfair.fairness import tail
from fedfair.fairness.composition import above_threshold_weights, composition
from fedfair.runtime.output_folder import BUNDLE_NAME
from fedfair.runtime.output_folder import FINAL_MODEL_NAME, FINAL_SUMMARY_NAME
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.evaluation import federated_evaluation
from fedfair.runtime.evaluation_figures import Earlier, noise_stds, report_noise_std
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.trainer import LocalTable, check_schema_table
from fedfair.runtime.composition_counts import held_out_levels, joint_suppression, local_counts
from fedfair.runtime.contract import EVALUATION, TRAINING, Stages
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_shared_settings, shared_settings
from fedfair.runtime.plan.privacy import answer_release, composition_release, decoded_noise_std
from fedfair.runtime.transport import pb, pb_grpc
from fedfair.privacy.distributed import Release
from tests.federations import adult_raw_table
from tests.runtime.harness import plan_sections, thread_federation
from tests.runtime.test_plan import schema_plan

NAMES = ["site-a", "site-b", "site-c"]
COLUMNS = ["race", "sex", "income"]
FEATURES = ["age", "education-num", "hours-per-week", "race", "sex", "marital-status"]


class SummingDriver:
    """Stands in for the sum driver: records what it was asked and returns `summed` as the round's sum."""

    def __init__(self, summed: np.ndarray) -> None:
        self.summed = summed
        self.asked: dict[str, Any] = {}

    def run(
        self, round_number: int, stages: Any, participants: frozenset[str], dimension: int, *args: Any, **kw: Any
    ) -> SumOutcome:
        self.asked = {"round": round_number, "stages": stages, "dimension": dimension}
        return SumOutcome(self.summed, 3.0, 0.0, tuple(sorted(participants)))


def test_the_final_evaluation_asks_for_the_plans_length_and_reports_the_composition() -> None:
    plan = schema_plan(composition=["race", "income"])
    columns = plan.counted_columns(plan.training.rounds)
    rng = np.random.default_rng(1)
    races = rng.choice(["White", "Black", "Other"], 300, p=[0.6, 0.38, 0.02])
    table = pd.DataFrame({"race": races, "income": rng.choice(["<=50K", ">50K"], 300)})
    losses = rng.exponential(0.7, 300)
    levels = held_out_levels(plan.schema, columns, table, "site")
    # The template's plan noises its evaluations: the tail sums at the model's c (no noise drawn here).
    query = plan.evaluation.tail_query()
    summed = np.concatenate(
        [
            tail.tail_answers(query, losses, np.zeros(300), np.zeros(300, dtype=np.int64), 0.9),
            local_counts(columns, levels, losses, 0.9, 10),
        ]
    )
    driver = SummingDriver(summed)
    participants = frozenset(NAMES)
    _, result = federated_evaluation(plan, driver, plan.training.rounds, participants, (np.zeros(3), 0.9))
    assert driver.asked == {"round": 50, "stages": EVALUATION, "dimension": plan.evaluation_length(50)}
    assert result["status"] == "done" and result["samples"] == 300 and result["collaborators"] == 3
    reported = result["composition"]
    assert reported["threshold"] == 0.9 and reported["worst_rows"] == int((losses > 0.9).sum())
    shares = {cell["level"]: cell for cell in reported["columns"]["race"]}
    assert shares["Other"]["worst_rows"] is None  # about 6 rows in all: below min_category_count
    expected = {share.cell[0]: share for share in composition(above_threshold_weights(losses, 0.9), {"race": races})}
    assert shares["White"]["worst_share"] == expected["White"].worst_share
    # An earlier evaluation asks for the threshold sums alone and reports no composition.
    driver = SummingDriver(summed[: query.length])
    _, earlier = federated_evaluation(plan, driver, 10, participants, (np.zeros(3), 0.9))
    assert driver.asked["dimension"] == query.length and "composition" not in earlier
    # Each figure is stated with the interval of the noise its epsilon gives: the final at report_epsilon,
    # the earlier one at interim_report_epsilon, noisier (the same answers, without the counts).
    assert result["report_epsilon"] == 1.0 and earlier["report_epsilon"] == 0.2
    assert result["worst_risk_low"] <= result["worst_risk"] <= result["worst_risk_high"]
    final_alone = report_noise_std(plan, len(plan.collaborators), (), 3, final=True)
    assert earlier["noise_std"] == report_noise_std(plan, len(plan.collaborators), (), 3, final=False)
    # (RDP calibration: at a fifth of the epsilon, between 4 and 5 times the noise)
    assert 4 * final_alone < earlier["noise_std"] < 5 * final_alone and final_alone < result["noise_std"]


def test_a_repeated_model_is_decoded_with_the_noise_each_site_may_have_sent() -> None:
    plan = schema_plan(composition=["race", "income"])
    final, columns, names = plan.training.rounds, plan.counted_columns(plan.training.rounds), ("a", "b", "c")
    floor, colluders = plan.survivor_floor(len(plan.collaborators)), plan.secure_aggregation.max_colluding

    def std(release: Release, summands: int) -> float:
        return decoded_noise_std(release, floor, colluders, summands)

    kept, alone = answer_release(plan.privacy, (), final=False), composition_release(plan.privacy, columns)
    joint = answer_release(plan.privacy, columns)
    assert noise_stds(plan, len(plan.collaborators), final, columns, names, None) == (std(joint, 3), std(joint, 3))
    # Every site answered the model at round 10: its kept answer (interim epsilon) and the counts alone.
    assert noise_stds(plan, len(plan.collaborators), final, columns, names, Earlier("m", 10, frozenset(names))) == (
        std(kept, 3),
        std(alone, 3),
    )
    # One site did not (or it is not known who did): it may have sent either, so the larger noise counts for it.
    risks, counts = noise_stds(
        plan, len(plan.collaborators), final, columns, names, Earlier("m", 10, frozenset(names[:2]))
    )
    assert risks == pytest.approx(math.hypot(std(kept, 2), max(std(kept, 1), std(joint, 1))), rel=1e-12)
    assert counts == pytest.approx(math.hypot(std(alone, 2), std(joint, 1)), rel=1e-12)
    assert noise_stds(plan, len(plan.collaborators), final, columns, names, Earlier("m", 10, None))[1] == pytest.approx(
        std(joint, 3)
    )
    # Without composition the final query is the earlier one's: the kept answer goes again whole, and its noise,
    # interim_report_epsilon's, not report_epsilon's, is what the final figures carry.
    assert noise_stds(plan, len(plan.collaborators), final, (), names, Earlier("m", 10, frozenset(names))) == (
        std(kept, 3),
        0.0,
    )
    assert std(kept, 3) > 4 * std(answer_release(plan.privacy, ()), 3)


def institutions(table: pd.DataFrame) -> list[pd.DataFrame]:
    """Three sites cut from Adult; only the third holds Amer-Indian-Eskimo rows, 20 of them, of which 5 are
    held out (the split is drawn within each race): a pooled count below min_category_count."""
    rare = table["race"] == "Amer-Indian-Eskimo"
    common = table[~rare & table["race"].isin(["White", "Black", "Asian-Pac-Islander"])]
    return [common.iloc[:2400], common.iloc[2400:4400], pd.concat([common.iloc[4400:6000], table[rare].iloc[:20]])]


MISSED = (6, 7)
"""The training rounds site-c misses (its task stream unanswered): inside the window rounds 5 to 8 average."""


def site_c_misses_rounds(name: str, collaborator: Collaborator) -> None:
    """site-c leaves every training task of the MISSED rounds unanswered, as a site cut off the network would."""
    if name != "site-c":
        return
    start, step = collaborator.start_round, collaborator.step

    def absent_start(stub: pb_grpc.FederationStub, binding: pb.Binding, stages: Stages) -> None:
        if not (binding.round in MISSED and stages is TRAINING):
            start(stub, binding, stages)

    def absent_step(stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        if not (task.binding.round in MISSED and WireStage.of(task.binding) in TRAINING.uploads):
            step(stub, task)

    collaborator.start_round = absent_start  # type: ignore[method-assign]
    collaborator.step = absent_step  # type: ignore[method-assign]


@pytest.mark.slow
def test_the_federated_composition_is_the_pooled_one_but_for_suppressed_cells(tmp_path: Path) -> None:
    """site-c misses two rounds of the averaging window, so its own mean of its rounds' c is not c-bar: every
    site counts at the evaluated model's c-bar, the threshold the record states, all the same.

    Plain sums: under verified secure aggregation a site that missed a round cannot check the models after it and
    sits the rest out (the closed chain, tests/runtime/collaborator/test_chain_anchor.py), so no site could both
    miss rounds and count; which c a site counts at does not depend on how the sums are added."""
    table = adult_raw_table()
    schema = draft_schema(table, "income", FEATURES)
    paths = []
    for name, site in zip(NAMES, institutions(table), strict=True):
        paths.append(tmp_path / "tables" / f"{name}.csv")
        paths[-1].parent.mkdir(exist_ok=True)
        site.to_csv(paths[-1], index=False)
    workspace = make_workspace(
        tmp_path / "federation",
        NAMES,
        plan=plan_sections(
            # Steps large enough for c-bar to come down from the bound into the losses within a few rounds.
            objective={"bound": 3.0},
            training={"rounds": 8, "local_steps": 5, "lr": 0.5, "threshold_lr": 0.5, "batch_fraction": 0.05},
            quorum={"min_collaborators": 2, "grace_factor": 2.0},
            secure_aggregation={"enabled": False},
            evaluation={"composition": COLUMNS},
        ),
        data={name: {"csv": str(path), "group": "race"} for name, path in zip(NAMES, paths, strict=True)},
    )
    workspace.plan.write_text(workspace.plan.read_text() + "\n" + schema.to_toml())
    with thread_federation(workspace, collaborator=site_c_misses_rounds) as federation:
        federation.join(300)
    assert not federation.errors, federation.errors
    log = read_round_log(workspace.output)
    assert [record["round"] for record in log if "site-c" not in record["contributors"]] == list(MISSED)
    final = log[-1]["evaluation"]
    assert final["status"] == "done" and final["collaborators"] == 3
    reported = final["composition"]
    assert json.loads((workspace.output / FINAL_SUMMARY_NAME).read_text())["evaluation"]["composition"] == reported

    # Each site's held-out rows and losses under the evaluated model (theta-bar, c-bar), as each site has them.
    output = torch.load(workspace.output / FINAL_MODEL_NAME, weights_only=True)
    c = output["c_average"]
    assert reported["threshold"] == c
    bundle = load_bundle(workspace.output / BUNDLE_NAME)
    assert bundle.encoder is not None
    encoder = Encoder.from_mapping(bundle.encoder, "the bundle")
    model = bundle.build_model()
    shared = load_shared_settings(shared_settings(federation.plan))
    held_out = []
    for name in NAMES:
        config = load_collaborator_config(workspace.configs[name])
        rows = check_schema_table(config, shared, LocalTable(None, pd.read_csv(config.data.csv))).test
        features, labels = encoder.encode(rows, name)
        assert labels is not None
        data = ClientData(name, torch.from_numpy(features), torch.from_numpy(labels).long())
        held_out.append((rows, evaluate(model, output["theta_average"], data).losses))
    losses = np.concatenate([site_losses for _, site_losses in held_out])
    above = losses > c
    assert reported["worst_rows"] == int(above.sum()) and reported["rows"] == losses.size
    # The premise: site-c's own mean of the c its rounds of the window trained on (each round starts from the c
    # the one before left) would count other rows than c-bar does.
    started = {record["round"] + 1: record["c"] for record in log if "c" in record}
    own = float(np.mean([started[round_number] for round_number in (5, 8)]))
    assert np.sum((held_out[2][1] > own) != (held_out[2][1] > c)) >= 5, (own, c)

    minimum = schema.min_category_count
    suppressed = exact = 0
    for column in COLUMNS:
        values = np.concatenate([rows[column].to_numpy(dtype=str) for rows, _ in held_out])
        pooled = {share.cell[0]: share for share in composition(above_threshold_weights(losses, c), {column: values})}
        levels = (
            schema.classes
            if column == schema.label
            else next(entry.categories for entry in schema.columns if entry.name == column)
        )
        assert levels is not None
        for index, cell in enumerate(reported["columns"][column]):
            level = cell["level"]
            assert level == levels[index]
            for key, share_key, worst in (("worst_rows", "worst_share", True), ("rows", "overall_share", False)):
                site_counts = [
                    (np.bincount(pd.Index(levels).get_indexer(rows[column][site_losses > c]), minlength=len(levels)),
                     np.bincount(pd.Index(levels).get_indexer(rows[column]), minlength=len(levels)))
                    for rows, site_losses in held_out
                ]  # fmt: skip
                true = sum(int(counts[0 if worst else 1][index]) for counts in site_counts)
                sent = sum(
                    int(counts[0 if worst else 1][index]) if joint_suppression(*counts, minimum)[index] else 0
                    for counts in site_counts
                )
                if sent < minimum:
                    # Below the rule, at a site or in the sum: suppressed, never a number.
                    assert cell[key] is None and cell[share_key] is None, (column, level, key)
                    suppressed += 0 < true
                elif sent == true:
                    share = pooled[level]
                    assert cell[key] == (share.worst_rows if worst else share.rows), (column, level, key)
                    assert cell[share_key] == (share.worst_share if worst else share.overall_share)
                    exact += 1
                else:
                    assert cell[key] == sent  # some site withheld a few rows of this cell: what the others sent
    # The 5 held-out Amer-Indian-Eskimo rows are present in the pooled rows, and never reported as a number.
    eskimo = next(cell for cell in reported["columns"]["race"] if cell["level"] == "Amer-Indian-Eskimo")
    assert eskimo["rows"] is None and eskimo["worst_rows"] is None
    assert suppressed >= 2 and exact >= 8
    assert all(
        cell[key] is None or cell[key] >= minimum
        for cells in reported["columns"].values()
        for cell in cells
        for key in ("worst_rows", "rows")
    )
