"""Only the pinned plan's rounds and evaluations are answered, and refusals do not flood the log (issue 51, 2 and 6).

A collaborator answers an evaluation only in a round its plan's ``[evaluation] every`` names, each for one
model (the input record's rule, across restarts), and refuses any other before anything is downloaded,
computed or charged. The lines an aggregator's tasks make it write are rate-limited by kind, the skipped ones
counted, so a flood of refused tasks adds a bounded number of lines.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.aggregator.network import serve
from fedfair.runtime.peer import connection
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.input_record import InputRecord
from fedfair.runtime.collaborator.stored_answer import StoredAnswer
from fedfair.runtime.peer.retries import RetryPolicy
from fedfair.runtime.collaborator.rounds import check_scheduled
from fedfair.runtime.plan import aggregator_plan as plan
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest
from fedfair.runtime.plan.evaluation import EvaluationSettings
from fedfair.runtime.rate_limits import LineBudget, RateLimit
from fedfair.runtime.transport import make_binding, pb
from tests.runtime.harness import new_workspace, thread_federation
from tests.runtime.test_plan import aggregator_plan
from fedfair.runtime.transport import WireStage
from tests.runtime.wire_stages import WIRE

NAMES = ["site-a", "site-b", "site-c"]


@pytest.mark.parametrize(
    ("every", "due"),
    [(0, [10]), (1, list(range(1, 11))), (3, [3, 6, 9, 10]), (5, [5, 10]), (20, [10])],
)
def test_the_schedule_is_every_n_rounds_and_the_last(every: int, due: list[int]) -> None:
    settings = EvaluationSettings(every=every)
    assert [round_number for round_number in range(-1, 13) if settings.due(round_number, 10)] == due


def shared_settings(rounds: int, every: int) -> plan.SharedSettings:
    built = aggregator_plan(training={"rounds": rounds}, evaluation={"every": every})
    return plan.load_shared_settings(plan.shared_settings(built))


@pytest.mark.parametrize(
    ("round_number", "kind", "message"),
    [
        (0, "train", r"round 0 \(train\) is before the plan's first, 1"),
        (11, "train", r"round 11 \(train\) is past the plan's last round, 10"),
        (11, "evaluate", r"round 11 \(evaluate\) is past the plan's last round, 10"),
        (0, "evaluate", r"round 0 \(evaluate\) is before the plan's first, 1"),
        (4, "evaluate", r"round 4 is not one the pinned plan evaluates \(\[evaluation\] every = 3: every 3 rounds "),
    ],
)
def test_a_round_outside_the_schedule_is_refused_naming_it(round_number: int, kind: str, message: str) -> None:
    with pytest.raises(RefusedError, match=message) as refused:
        check_scheduled(shared_settings(10, 3), round_number, kind)
    assert refused.value.reason is Refusal.INPUT_BOUND


def test_every_scheduled_round_passes_and_no_other_evaluation() -> None:
    shared = shared_settings(10, 0)
    for round_number in range(1, 11):
        check_scheduled(shared, round_number, "train")
    check_scheduled(shared, 10, "evaluate")
    with pytest.raises(RefusedError, match=r"\[evaluation\] every = 0: only after the last round, 10"):
        check_scheduled(shared, 9, "evaluate")


def test_a_scheduled_evaluation_is_answered_for_one_model_only_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "site-a.fed.bindings.json"
    shared = shared_settings(10, 5)
    check_scheduled(shared, 5, "evaluate")
    answer = StoredAnswer(np.linspace(0.0, 1.0, 4), 1.0)
    InputRecord(path, "fed", reset=True).view(5, "evaluate", "model-a").keep(answer)
    restarted = InputRecord(path, "fed")  # a new process reads the record back
    again = restarted.view(5, "evaluate", "model-a").stored  # the same ask gets the same bits, nothing fresh
    assert again is not None and again.vector is not None and again.vector.tobytes() == answer.vector.tobytes()
    with pytest.raises(RefusedError, match=r"round 5 \(evaluate\) was already answered for another model"):
        restarted.view(5, "evaluate", "model-a-plus-one-ulp")


@pytest.mark.slow
def test_an_aggregator_asking_every_round_gets_only_the_plans_one_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Three real collaborators over mutual TLS, [privacy] report_epsilon on, a plan with ``every = 0``; the
    aggregator's loop asks an evaluation after every round. Each site answers (and charges) only round 3's."""
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": 3, "average_from": 0.0},
        evaluation={"every": 0},
        privacy={"report_epsilon": 1.0, "budget": 10.0},
    )
    monkeypatch.setattr(RoundLoop, "evaluation_due", lambda loop, round_number: True)
    with caplog.at_level(logging.INFO, "fedfair.collaborator"), thread_federation(workspace) as federation:
        federation.join(300)
    lines = [record.getMessage() for record in caplog.records if record.name == "fedfair.collaborator"]
    assert not federation.errors, federation.errors
    evaluations = {record["round"]: record["evaluation"] for record in read_round_log(workspace.output)}
    assert evaluations[3]["status"] == "done"
    assert [evaluations[r]["status"] for r in (1, 2)] == ["aborted", "aborted"]  # every site refused them
    for name in NAMES:
        path = workspace.configs[name].parent / f"{name}.{federation.plan.federation_id}.bindings.json"
        record = json.loads(path.read_text())
        charged = open_ledger(load_collaborator_config(workspace.configs[name])).releases()
        assert [entry["round"] for entry in charged] == [3]  # nothing charged for the refused ones
        assert [entry["round"] for key, entry in record["inputs"].items() if key.startswith("evaluate:")] == [3]
        refusals = [line for line in lines if line.startswith(f"{name}:") and "not one the pinned plan" in line]
        assert len(refusals) == 2, refusals  # each refused evaluation logged once


def test_a_line_budget_counts_what_it_skips_and_drains_it() -> None:
    now = [0.0]
    budget = LineBudget(RateLimit(per_second=1.0 / 60, burst=3, clock=lambda: now[0]))
    assert [budget.admit("refusals") for _ in range(5)] == [0, 0, 0, None, None]
    assert budget.admit("withdrawals") == 0  # each kind has its own burst
    now[0] = 60.0
    assert budget.admit("refusals") == 2  # the next line carries the count of those skipped
    assert [budget.admit("refusals") for _ in range(4)] == [None] * 4
    assert budget.drain() == {"refusals": 4}
    assert budget.drain() == {}


FLOOD = 2_000


@pytest.mark.slow
def test_a_flood_of_refused_tasks_adds_a_bounded_number_of_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The aggregator's gRPC service alone publishes FLOOD TRAIN tasks past a 3-round plan, then FINISHED, to a
    real collaborator over mutual TLS: it refuses every one, and its log gains at most LINE_BURST lines plus
    one a minute and the closing count, which with the lines shown accounts for every refusal."""
    workspace = new_workspace(
        tmp_path,
        NAMES[:1],
        training={"rounds": 3},
        quorum={"min_collaborators": 1},
        secure_aggregation={"enabled": False},
    )
    served = load_aggregator_plan(workspace.plan)
    network = serve(served, plan_digest(served))
    for round_number in range(4, 4 + FLOOD):
        binding = make_binding(served.federation_id, round_number, WIRE["STAGE_TRAIN"])
        network.board.publish(NAMES[:1], binding, pb.ACTION_RUN, deadline_seconds=60.0)
    network.board.finish(make_binding(served.federation_id, 4 + FLOOD, WireStage(pb.STAGE_UNSPECIFIED)))
    retry = RetryPolicy(max_wait_seconds=30.0, base_seconds=0.2, cap_seconds=1.0)
    collaborator = Collaborator(load_collaborator_config(workspace.configs[NAMES[0]]), retry=retry)
    try:
        with caplog.at_level(logging.INFO, "fedfair.collaborator"):
            collaborator.run()
    finally:
        network.stop()
    lines = [record.getMessage() for record in caplog.records if record.name == "fedfair.collaborator"]
    refusals = [line for line in lines if "past the plan's last round" in line]
    counted = [line for line in lines if "more refusals since the last such line were not logged" in line]
    skipped = sum(int(line.split(" more refusals")[0].split()[-1].strip("(")) for line in counted)
    assert connection.LINE_BURST <= len(refusals) <= connection.LINE_BURST + 2, refusals[-3:]
    assert len(refusals) + skipped == FLOOD
    assert len(lines) <= 20, lines[:5]
