"""The collaborator's secure-aggregation steps: what they refuse beyond the protocol library's own checks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ConfigError, Refusal, RefusedError
from fedfair.runtime.collaborator import steps
from fedfair.runtime.collaborator.kinds.masked import consistency
from fedfair.runtime.collaborator.input_record import InputRecord
from fedfair.runtime.collaborator.stored_answer import StoredAnswer
from fedfair.runtime.plan import aggregator_plan as plan
from fedfair.fairness import sums
from fedfair.runtime.contract import EVALUATION, TRAINING, RoundParameters, model_digest
from fedfair.secagg.messages import SurvivorSet
from tests.runtime.test_plan import aggregator_plan, schema_plan
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.wire import Stage
from tests.secagg.helpers import Harness, make_config, party_order_at

SIGNING = SECURE_ROUND.spec(Stage.CONSISTENCY)
"""The stage the consistency step takes: the survivors' signature of the view."""

NO_PARTICIPANT: Any = SimpleNamespace(survivor_floor=2)
"""The consistency step needs nothing of the participant but its survivor floor (here the isolation bound)."""


def work_at_consistency(view: steps.SignedView) -> tuple[steps.Work, SurvivorSet, Harness]:
    """Party 1 of a five-party round, masked and waiting to sign; every party masked."""
    harness = Harness(make_config(parties=5))
    survivor_set = harness.through_masking([1, 2, 3, 4, 5])
    work = steps.Work(1, TRAINING, None, 1.0, client=harness.clients[1], view=view, order=party_order_at(SIGNING))
    return work, survivor_set, harness


def test_an_input_signs_for_the_same_survivors_in_every_session() -> None:
    # A re-run round carrying the same input (the cache) shares one SignedView with the first session.
    view = steps.SignedView()
    work, survivor_set, harness = work_at_consistency(view)
    consistency(NO_PARTICIPANT, work, survivor_set.to_bytes())
    assert view.survivors == frozenset(harness.config.parties)
    # The next session with the same survivors is signed again.
    again, same, _ = work_at_consistency(view)
    consistency(NO_PARTICIPANT, again, same.to_bytes())


def test_an_input_already_signed_for_refuses_other_survivors() -> None:
    # The aggregator ran the round with party 5 and now (after a real or pretended crash) without it:
    # subtracting the two sums would give party 5's update, so the same input is not signed for both.
    view = steps.SignedView(survivors=frozenset({"site-1", "site-2", "site-3", "site-4"}))
    work, survivor_set, _ = work_at_consistency(view)
    with pytest.raises(RefusedError, match="already signed for with other survivors"):
        consistency(NO_PARTICIPANT, work, survivor_set.to_bytes())
    assert view.survivors == frozenset({"site-1", "site-2", "site-3", "site-4"})
    assert work.client is not None and work.client.signed_view is None  # refused before anything was signed


def test_survivors_below_the_manifests_round_size_are_refused_whatever_t_allows() -> None:
    # Five parties with t = 3 would unmask over three survivors; a manifest with min_round_size = 4 forbids it.
    harness = Harness(make_config(parties=5))
    survivor_set = harness.through_masking([1, 2, 3])
    work = steps.Work(
        1, TRAINING, None, 1.0, client=harness.clients[1], view=steps.SignedView(), order=party_order_at(SIGNING)
    )
    with pytest.raises(RefusedError, match="only 3 survivors, fewer than the 4"):
        consistency(SimpleNamespace(survivor_floor=4), work, survivor_set.to_bytes())
    assert work.client is not None and work.client.signed_view is None and work.view.survivors is None


def test_a_binding_survives_a_restart_and_refuses_other_survivors(tmp_path: Path) -> None:
    # The differencing attack: round r with everyone, then round r again on the same model without one
    # site, with the collaborator restarted in between so that nothing in memory remembers round r.
    path = tmp_path / "site-1.fed.bindings.json"
    view = InputRecord(path, reset=True).view(4, "train", "model-digest")
    view.keep(StoredAnswer(np.zeros(3), 1.0))  # the answer is kept before it is sent, then bound
    work, survivor_set, harness = work_at_consistency(view)
    consistency(NO_PARTICIPANT, work, survivor_set.to_bytes())
    entry = json.loads(path.read_text())["inputs"]["train:model-digest"]
    assert entry == {"round": 4, "survivors": sorted(harness.config.parties)}
    restarted = InputRecord(path)
    again = restarted.view(4, "train", "model-digest")
    assert again.survivors == frozenset(harness.config.parties)
    fewer = Harness(make_config(parties=5))
    smaller = fewer.through_masking([1, 2, 3, 4])
    with pytest.raises(RefusedError, match="already signed for with other survivors"):
        consistency(
            NO_PARTICIPANT,
            steps.Work(4, TRAINING, None, 1.0, client=fewer.clients[1], view=again, order=party_order_at(SIGNING)),
            smaller.to_bytes(),
        )
    # The same model in a later round (a round aborted, the model unchanged) is bound to the same survivors.
    assert restarted.view(5, "train", "model-digest").survivors == frozenset(harness.config.parties)
    with pytest.raises(RefusedError, match="round 5 .train. was already answered for another model") as bound:
        restarted.view(5, "train", "next-model")
    assert bound.value.reason is Refusal.INPUT_BOUND


def test_a_rounds_training_may_run_again_after_its_evaluation_was_signed(tmp_path: Path) -> None:
    # An aggregator killed during round 4's evaluation resumes from the checkpoint of round 3 and re-runs
    # round 4's training on the same model: the same round, bound to the same survivors, not an old round.
    path = tmp_path / "site-1.fed.bindings.json"
    work, survivor_set, harness = work_at_consistency(InputRecord(path, reset=True).view(4, "evaluate", "average"))
    consistency(NO_PARTICIPANT, work, survivor_set.to_bytes())
    assert json.loads(path.read_text())["latest"] == 4
    assert InputRecord(path).view(4, "train", "model-digest").survivors is None


def test_an_unreadable_bindings_file_is_refused_not_reset(tmp_path: Path) -> None:
    path = tmp_path / "site-1.fed.bindings.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON .* restore it .* from a backup"):
        InputRecord(path)
    assert path.read_text() == "{not json"


def test_the_aggregator_cannot_choose_the_masking_graph() -> None:
    """A collaborator draws the graph over the plan's whole roster from a seed it recomputes: a round
    that states another seed, another roster to draw over or another degree is refused."""
    roster = [f"site-{i:02d}" for i in range(30)]
    shared = plan.load_shared_settings(plan.shared_settings(aggregator_plan(federation={"collaborators": roster})))
    key = ec.generate_private_key(ec.SECP256R1())
    me = steps.Participant("site-07", shared, 10, key, b"", lambda credential, name: None)
    work = steps.Work(4, TRAINING, None, 1.0)
    kind, dimension, encoding = me.expected(work)
    secure = shared.secure_aggregation
    honest = RoundParameters(
        kind, 4, True, tuple(roster[3:]), dimension, encoding, secure.security(len(roster)),
        graph_roster=tuple(roster),
    )  # fmt: skip
    honest = dataclasses.replace(honest, graph_seed=honest.implied_graph_seed(shared.federation_id, TRAINING))
    config = me.check_parameters(work, honest.to_bytes()).secagg_config(shared.federation_id, TRAINING)
    assert not config.complete and config.security.neighbours == 10  # "auto" for 30 sites
    steered = [
        (dataclasses.replace(honest, graph_seed=bytes(32).hex()), "graph seed"),
        (dataclasses.replace(honest, graph_roster=tuple(roster[:29]) + ("site-99",)), "graph roster"),
        (dataclasses.replace(honest, graph_roster=tuple(reversed(roster))), "graph roster"),
        (dataclasses.replace(honest, graph_roster=tuple(roster[3:])), "graph roster"),
        (dataclasses.replace(honest, security=dataclasses.replace(honest.security, neighbours=4)), "neighbours"),
    ]
    for parameters, field in steered:
        with pytest.raises(RefusedError, match=f"differ from the plan \\({field}\\)"):
            me.check_parameters(work, parameters.to_bytes())


def test_a_round_asking_for_composition_counts_the_pinned_plan_does_not_name_is_refused() -> None:
    """The columns a collaborator counts are its own plan's: a round states only the vector's length, so an
    aggregator that asks for another column (or for the counts before the final round) asks for another
    length, and is refused; no field of a round's parameters can name a column."""
    assert {field.name for field in dataclasses.fields(RoundParameters)} == {
        "kind", "round", "secure", "parties", "dimension", "encoding", "security", "graph_roster", "graph_seed",
        "model", "protocol", "identities",
    }  # fmt: skip
    shared = plan.load_shared_settings(plan.shared_settings(schema_plan(composition=["race"])))
    asking_more = plan.load_shared_settings(plan.shared_settings(schema_plan(composition=["race", "income"])))
    key = ec.generate_private_key(ec.SECP256R1())
    me = steps.Participant("hospital-a", shared, 10, key, b"", lambda credential, name: None)
    final = shared.training.rounds
    for round_number, dimension in (
        (final, asking_more.evaluation_length(final)),  # a column the pinned plan does not list
        (final, sums.vector_length()),  # the final evaluation without the plan's counts
        (final - 1, shared.evaluation_length(final)),  # the counts at an earlier evaluation
    ):
        work = steps.Work(round_number, EVALUATION, None, 1.0)
        kind, expected, encoding = me.expected(work)
        assert kind == "evaluate" and expected != dimension
        secure = shared.secure_aggregation
        parameters = RoundParameters(
            kind, round_number, True, ("hospital-a", "hospital-b", "hospital-c"), dimension, encoding,
            secure.security(3), graph_roster=("hospital-a", "hospital-b", "hospital-c"),
        )  # fmt: skip
        parameters = dataclasses.replace(
            parameters, graph_seed=parameters.implied_graph_seed(shared.federation_id, EVALUATION)
        )
        with pytest.raises(RefusedError, match=r"differ from the plan \(dimension\)"):
            me.check_parameters(work, parameters.to_bytes())
        # The same round with the length the plan implies passes.
        honest = dataclasses.replace(parameters, dimension=expected)
        honest = dataclasses.replace(honest, graph_seed=honest.implied_graph_seed(shared.federation_id, EVALUATION))
        assert me.check_parameters(work, honest.to_bytes()).dimension == expected


@pytest.mark.parametrize("stages", [TRAINING, EVALUATION], ids=["training", "evaluation"])
def test_without_dropouts_a_round_over_fewer_than_every_party_is_refused(stages: Any) -> None:
    """An aggregator that leaves one site out of a training round or an evaluation under dropouts = "none"
    (its own loop would not, a patched one may) is refused by the others at the round's parameters, before
    any key is sent: that plan's quorum is every collaborator."""
    roster = ("site-a", "site-b", "site-c", "site-d")
    for dropouts, refused in (("none", True), ("allowed", False)):
        settings = aggregator_plan(
            federation={"collaborators": list(roster)}, secure_aggregation={"dropouts": dropouts}
        )
        shared = plan.load_shared_settings(plan.shared_settings(settings))
        me = steps.Participant("site-a", shared, 10, ec.generate_private_key(ec.SECP256R1()), b"", lambda c, n: None)
        work = steps.Work(2, stages, None, 1.0)
        kind, dimension, encoding = me.expected(work)
        secure = shared.secure_aggregation
        for parties in (roster, roster[:3]):
            parameters = RoundParameters(
                kind, 2, True, parties, dimension, encoding, secure.security(4), graph_roster=roster,
            )  # fmt: skip
            parameters = dataclasses.replace(
                parameters, graph_seed=parameters.implied_graph_seed(shared.federation_id, stages)
            )
            if refused and len(parties) < len(roster):
                with pytest.raises(RefusedError, match=r"differ from the plan \(quorum\)"):
                    me.check_parameters(work, parameters.to_bytes())
            else:
                assert me.check_parameters(work, parameters.to_bytes()).parties == parties


def test_a_round_binds_its_session_to_the_model_each_party_was_sent() -> None:
    """The 1-ulp push to one site: the aggregator states one model in the round's parameters but sent that
    site another. The site refuses (its download's digest differs), and parties shown different models in
    their parameters could share no session, since the model enters the session's digest."""
    roster = ("site-a", "site-b", "site-c")
    shared = plan.load_shared_settings(
        plan.shared_settings(aggregator_plan(federation={"collaborators": list(roster)}))
    )
    me = steps.Participant("site-a", shared, 10, ec.generate_private_key(ec.SECP256R1()), b"", lambda c, n: None)
    theta = np.linspace(-1.0, 1.0, 11)
    sent = model_digest(theta, 0.5)
    pushed = model_digest(np.nextafter(theta, 2.0), 0.5)
    work = steps.Work(2, TRAINING, None, 1.0, model=pushed)
    kind, dimension, encoding = me.expected(work)
    secure = shared.secure_aggregation
    parameters = RoundParameters(
        kind, 2, True, roster, dimension, encoding, secure.security(3), graph_roster=roster, model=sent,
    )  # fmt: skip
    parameters = dataclasses.replace(
        parameters, graph_seed=parameters.implied_graph_seed(shared.federation_id, TRAINING)
    )
    with pytest.raises(RefusedError, match=r"differ from the plan \(model\)"):
        me.check_parameters(work, parameters.to_bytes())
    honest = me.check_parameters(dataclasses.replace(work, model=sent), parameters.to_bytes())
    other = dataclasses.replace(parameters, model=pushed)
    assert (
        honest.secagg_config(shared.federation_id, TRAINING).digest
        != other.secagg_config(shared.federation_id, TRAINING).digest
    )
