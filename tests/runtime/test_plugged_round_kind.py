"""A round kind declared in the tests, with a stage of its own before VERIFY, runs through a real federation (issue 92).

The echo kind (tests/secagg/echo_round.py) is the masked round with one stage more between the survivors'
signatures and the unmasking: the aggregator calls every survivor that signed with a fresh nonce, and each answers
SHA-256 of its session, its party id and the nonce, which the aggregator checks. It plugs in from here alone:
registered by name (``register_round_kind``), its collaborator steps the masked round's (``register_kind_steps``),
and named by the plan (``[secure_aggregation] round_kind``). No file under fedfair/ names it and no schema edit
numbers it: on the wire it is (TRAIN, step 6), its place in the declaration, and real gRPC over loopback mutual
TLS carries it between an aggregator and three sites in threads. The toy kind of tests/secagg/test_round_kinds.py
(a plain sum in two stages, no VERIFY) plugs in the same way with no collaborator steps of its own, every runtime
lookup of its stages reads its declaration, and its federation ends on the plain federation's model.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.collaborator.steps import KIND_STEPS, register_kind_steps
from fedfair.runtime.aggregator.progress_line import stage_noun
from fedfair.runtime.peer.uplink import input_limit
from fedfair.runtime.contract import Aggregations, EVALUATION, aggregations, training_stages
from fedfair.core.errors import ConfigError
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, shared_content
from fedfair.runtime.plan.learning_settings import SecureAggregationSettings
from fedfair.runtime.report.data import stage_label
from fedfair.runtime.transport import EVALUATE, TRAIN, WireStage, make_binding, pb
from fedfair.secagg.round import ROUND_KINDS, SecureRound, register_round_kind, roster_input
from fedfair.secagg.masked_round import SECURE_ROUND
from tests.runtime.harness import adult_split, new_workspace, replay, thread_federation
from tests.secagg.echo_round import ECHO, ECHO_ROUND, ECHOED, ECHOED_LOCK
from tests.secagg.test_round_kinds import toy_kind
from tests.runtime.test_plan import aggregator_plan
from tests.runtime.test_processes import final_model, trajectory_bounds

NAMES = ("site-a", "site-b", "site-c")
KIND = ECHO_ROUND.name


@pytest.fixture
def echo_registered() -> Iterator[SecureRound]:
    """The echo kind, registered with the masked round's collaborator steps for the test; taken out after."""
    kind = register_round_kind(ECHO_ROUND)
    register_kind_steps(KIND, KIND_STEPS[SECURE_ROUND.name])
    ECHOED.clear()
    yield kind
    ROUND_KINDS.pop(KIND, None)
    KIND_STEPS.pop(KIND, None)


def two_applied_rounds(folder: Path, secure: Mapping[str, object]) -> tuple[Workspace, list[dict[str, Any]]]:
    """A federation of the three sites in threads, over real gRPC and TLS, under the `secure` [secure_aggregation]:
    its workspace and round log, once both its training rounds were applied with every site's contribution."""
    workspace = new_workspace(
        folder, NAMES, training={"rounds": 2}, quorum={"min_collaborators": 3}, secure_aggregation=secure
    )
    with thread_federation(workspace) as federation:
        federation.join(240)
    assert not federation.errors, federation.errors
    assert set(federation.exits.values()) == {0}, federation.exits
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied", "applied"]
    assert all(record["contributors"] == list(NAMES) for record in log)
    return workspace, log


def test_the_echo_kind_is_bound_on_the_wire_by_its_place_in_the_declaration(echo_registered: SecureRound) -> None:
    training = training_stages(SecureAggregationSettings(round_kind=KIND))
    assert training.protocol is echo_registered
    assert training.wire(ECHO) == WireStage(TRAIN.aggregation, 6)  # after the five masked stages before it
    assert training.name(training.wire(ECHO)) == "STAGE_ECHO_TEST_ECHO"
    # UNMASK moved one step on, the verifying stages with it: no number in the schema moved.
    assert [training.name(stage) for stage in training.uploads][5:] == [
        "STAGE_ECHO_TEST_ECHO",
        "STAGE_UNMASK",
        "STAGE_VERIFY_CLAIM",
        "STAGE_VERIFY_TAGS",
    ]
    assert Aggregations(training, EVALUATION).name(WireStage(TRAIN.aggregation, 7)) == "STAGE_UNMASK"


@pytest.mark.slow
def test_a_stage_added_before_verify_runs_through_a_real_federation(
    tmp_path: Path, echo_registered: SecureRound
) -> None:
    workspace, log = two_applied_rounds(tmp_path, {"round_kind": KIND})
    plan = load_aggregator_plan(workspace.plan)
    assert plan.secure_aggregation.training_kind == KIND
    # Every survivor echoed in every training round (sessions 2 r; evaluations keep the masked round), and the
    # echo stage's answers were timed.
    with ECHOED_LOCK:
        assert sorted(ECHOED) == [(2, NAMES), (4, NAMES)]
    for record in log:
        answered = record["answer_seconds"]["STAGE_ECHO_TEST_ECHO"]
        assert set(answered) == set(NAMES) and None not in answered.values(), answered

    # The round's result is the plain sum: number for number what the simulation's code gives for these
    # contributors, within the encoding's error carried through the rounds.
    expected = replay(plan, adult_split(3), list(NAMES), log)
    final = final_model(workspace)
    theta_bound, c_bound = trajectory_bounds(log, plan)
    assert (final["theta"] - expected.theta).abs().max().item() <= theta_bound
    assert abs(final["c"] - expected.c) <= c_bound


@pytest.mark.slow
def test_a_toy_kind_without_a_verifying_stage_sums_as_the_plain_federation_does(tmp_path: Path) -> None:
    """The toy kind (two stages of its own, no VERIFY) registered from the tests and named by the plan runs a real
    federation whose final model is the plain-sum federation's, to the precision each sum's encoding allows.

    Both federations train the same sites from the same seeds, so each site's update is the same in both; the toy
    sum adds the fixed-point words, the plain one float32 values in float64. Each round log's mean update error
    bound says how far its sum may be from the exact one, and :func:`trajectory_bounds` carries it through the
    rounds: the two final models are within the sum of their bounds, and each within its own of the replay.
    """
    register_round_kind(toy_kind("toy-federation"))
    outcomes = {}
    toy_stages = ["STAGE_TOY_FEDERATION_HELLO", "STAGE_TOY_FEDERATION_SEND"]
    try:
        for label, secure in (("toy", {"round_kind": "toy-federation"}), ("plain", {"enabled": False})):
            workspace, log = two_applied_rounds(tmp_path / label, secure)
            if label == "toy":  # every training round ran the toy kind's two stages, and nothing else
                assert all(sorted(record["answer_seconds"]) == toy_stages for record in log), log
            plan = load_aggregator_plan(workspace.plan)
            expected = replay(plan, adult_split(3), list(NAMES), log)
            outcomes[label] = final_model(workspace), trajectory_bounds(log, plan), expected
    finally:
        ROUND_KINDS.pop("toy-federation", None)
    (toy, (toy_theta, toy_c), expected), (plain, (plain_theta, plain_c), _) = outcomes["toy"], outcomes["plain"]
    # The toy sum's bound is the encoding's error carried (2.8e-7 here), the plain sum's its float32 rounding
    # (1.9e-5); the two models differed by 1.2e-8 when measured.
    assert 0 < toy_theta < 1e-5
    assert (toy["theta"] - plain["theta"]).abs().max().item() <= toy_theta + plain_theta
    assert abs(toy["c"] - plain["c"]) <= toy_c + plain_c
    assert (toy["theta"] - expected.theta).abs().max().item() <= toy_theta
    assert abs(toy["c"] - expected.c) <= toy_c


def test_a_plan_names_only_a_registered_kind_where_nothing_else_names_one(echo_registered: SecureRound) -> None:
    """A kind unknown to this process, a bounded plan, or a plain one is refused naming the fix; unset is the digest's."""
    assert aggregator_plan(secure_aggregation={"round_kind": KIND}).secure_aggregation.training_kind == KIND
    with pytest.raises(ConfigError, match=r"no round kind named 'nobody' is registered \(registered: .*secagg-v3"):
        aggregator_plan(secure_aggregation={"round_kind": "nobody"})
    with pytest.raises(ConfigError, match="round_kind names a secure round, but enabled = false"):
        aggregator_plan(secure_aggregation={"enabled": False, "round_kind": KIND})
    with pytest.raises(ConfigError, match="each name the training round's kind; keep one"):
        aggregator_plan(secure_aggregation={"round_kind": KIND, "input_bound": "two_verifiers", "auditor": "audit-co"})
    unset = aggregator_plan()
    assert unset.secure_aggregation.training_kind == SECURE_ROUND.name
    assert "round_kind" not in shared_content(unset)["secure_aggregation"]  # older plans' digests are unchanged
    assert (
        shared_content(aggregator_plan(secure_aggregation={"round_kind": KIND}))["secure_aggregation"]["round_kind"]
        == KIND
    )


def test_a_registered_toy_kind_is_named_bound_and_capped_by_its_declaration_alone() -> None:
    """The toy kind of tests/secagg/test_round_kinds.py, registered the same way and named by a plan: every runtime
    lookup of a stage (its wire binding, its name, its input cap, its progress noun, its report words) reads it."""
    toy = register_round_kind(toy_kind("toy-wire"))
    try:
        secure = aggregator_plan(secure_aggregation={"round_kind": "toy-wire"}).secure_aggregation
        federation = aggregations(secure)
        hello, send = WireStage(TRAIN.aggregation, 1), WireStage(TRAIN.aggregation, 2)
        assert federation.training.uploads == (hello, send) and federation.spec(send) is toy.sum_stages[1]
        assert federation.training.masked == federation.training.committed == send
        assert [federation.name(stage) for stage in (TRAIN, hello, send)] == [
            "STAGE_TRAIN",
            "STAGE_TOY_WIRE_HELLO",
            "STAGE_TOY_WIRE_SEND",
        ]
        assert federation.name(WireStage(EVALUATE.aggregation, 1)) == "STAGE_EVAL_ADVERTISE_KEYS"  # evaluations: masked
        task = pb.Task(binding=make_binding("f", 1, send), action=pb.ACTION_RUN)
        assert input_limit(task, federation, 3, 1000, 0) == roster_input(3, 0)
        assert stage_noun(True, federation.training, send) == "plain inputs"
        assert stage_noun(False, federation.training, send) == "updates"
        assert stage_label("STAGE_TOY_WIRE_HELLO") == "saying hello"
    finally:
        ROUND_KINDS.pop("toy-wire", None)
