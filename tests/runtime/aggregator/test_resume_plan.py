"""A refused ``--resume`` names the settings that differ from the checkpoint's plan, flags included."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.pki.roster import canonical_json
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.aggregator.checkpoint import load_checkpoint, save_checkpoint
from fedfair.runtime.aggregator.start import prepare
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_aggregator_plan, plan_content, plan_digest
from tests.runtime.harness import new_workspace, plan_sections

NAMES = ["site-a", "site-b", "site-c"]


@pytest.mark.parametrize("manifest", [False, True])
def test_the_kept_plan_content_is_what_the_plan_digest_fingerprints(tmp_path: Path, manifest: bool) -> None:
    """Otherwise a checkpoint could keep one plan and be checked against another. The content holds
    the allowed names and the manifest's digest, not where things lie: a moved workspace resumes."""
    workspace = make_workspace(tmp_path, NAMES, plan=plan_sections(), manifest=manifest)
    plan = load_aggregator_plan(workspace.plan)
    assert (plan.manifest is not None) is manifest
    assert hashlib.sha256(canonical_json(plan_content(plan))).hexdigest() == plan_digest(plan)
    federation = plan_content(plan)["federation"]
    assert federation["collaborators"] == NAMES and ("manifest" in federation) is manifest
    moved = dataclasses.replace(plan, aggregator=dataclasses.replace(plan.aggregator, output=tmp_path / "moved"))
    assert plan_content(moved) == plan_content(plan)


def first_start(plan: AggregatorPlan) -> None:
    """What a fresh start leaves in the output folder: its round-0 checkpoint."""
    checkpoint = prepare(plan, resume=False)
    assert checkpoint is not None and checkpoint.plan == plan_content(plan)
    save_checkpoint(plan.aggregator.output, checkpoint)


def test_resume_without_the_first_starts_flag_names_the_overridden_setting(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 3})
    first_start(load_aggregator_plan(workspace.plan, {"training": {"rounds": 400}}))  # --rounds 400
    with pytest.raises(ConfigError) as refused:
        prepare(load_aggregator_plan(workspace.plan), resume=True)  # --resume without --rounds
    message = str(refused.value)
    assert "written under another plan" in message
    assert "checkpoint -> now: training.rounds: 400 -> 3)" in message
    assert "command-line overrides such as --rounds or --collaborators are part of the plan" in message
    # With the same flag it resumes.
    resumed = prepare(load_aggregator_plan(workspace.plan, {"training": {"rounds": 400}}), resume=True)
    assert resumed is not None and resumed.round == 0


def test_a_checkpoint_that_keeps_only_the_digest_says_so_and_resumes_into_one_that_keeps_the_plan(
    tmp_path: Path,
) -> None:
    workspace = new_workspace(tmp_path, NAMES)
    plan = load_aggregator_plan(workspace.plan)
    output = plan.aggregator.output
    checkpoint = prepare(plan, resume=False)
    assert checkpoint is not None
    save_checkpoint(output, dataclasses.replace(checkpoint, plan=None))  # as fedfair wrote them before
    kept_only_the_digest = (
        "keeps only the plan's digest, so the settings that differ cannot be named; checkpoints written from now "
        "on keep the plan itself"
    )
    with pytest.raises(ConfigError, match=kept_only_the_digest):
        prepare(load_aggregator_plan(workspace.plan, {"training": {"rounds": 9}}), resume=True)
    resumed = prepare(plan, resume=True)
    assert resumed is not None and resumed.plan == plan_content(plan)
    save_checkpoint(output, resumed)
    assert load_checkpoint(output, plan_digest(plan)).plan == plan_content(plan)


@pytest.mark.parametrize(("planned", "held"), [("scaffold", "none"), ("none", "scaffold")])
def test_a_checkpoint_whose_state_disagrees_with_the_plans_drift_correction_is_refused(
    tmp_path: Path, planned: str, held: str
) -> None:
    """The rounds read drift correction from the state (its control variate), the plan's checks from the plan: a
    checkpoint under this plan's digest whose state was made under the other setting is refused at start, naming
    both, rather than running rounds of another length than the plan was checked at."""
    workspace = new_workspace(tmp_path, NAMES)
    plan, other = (load_aggregator_plan(workspace.plan, {"training": {"drift_correction": x}}) for x in (planned, held))
    first_start(plan)
    resumed = prepare(plan, resume=True)  # the state the plan made agrees with it
    assert resumed is not None and (resumed.state.control is not None) is (planned == "scaffold")
    made_otherwise = initial_state(other)  # round 0's state as the other setting makes it
    assert (made_otherwise.control is not None) is (held == "scaffold")
    save_checkpoint(plan.aggregator.output, dataclasses.replace(resumed, state=made_otherwise))
    with pytest.raises(ConfigError) as refused:
        prepare(plan, resume=True)
    said = str(refused.value)
    variate = "a control variate (drift correction)" if held == "scaffold" else "no control variate (no drift"
    assert f"holds {variate}" in said and f'[training] drift_correction = "{planned}"' in said, said
    assert "resume with the plan the checkpoint was written under" in said
