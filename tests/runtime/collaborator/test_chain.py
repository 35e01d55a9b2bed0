"""The model chain: a site takes a model only as the plan's server step of the sums it verified (issue 65)."""

from __future__ import annotations

import copy

import dataclasses
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfair.core import server
from fedfair.core.errors import VerificationError, VerifyReason
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.collaborator import catch_up as catch_up_module
from fedfair.runtime.collaborator import chain as chain_module
from fedfair.runtime.collaborator.catch_up import KeptRound, KindCatchUp
from fedfair.core.errors import UncheckedModelError
from fedfair.runtime.collaborator.chain import ModelChain
from fedfair.core.update import update_dimension
from fedfair.runtime.contract import model_digest, model_download
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.state_files import HeldState
from fedfair.runtime.plan.aggregator_plan import (
    AggregatorPlan,
    SharedSettings,
    load_aggregator_plan,
    load_shared_settings,
    shared_settings,
)
from fedfair.secagg import Encoder

NAMES = ("site-a", "site-b", "site-c")


@dataclasses.dataclass
class Federation:
    """A secure plan (server momentum 0.9), a site's copy of it, and round 0's state."""

    plan: AggregatorPlan
    shared: SharedSettings
    start: server.ServerState

    def encoder(self, round_number: int, words: int) -> Encoder:
        """Round `round_number`'s training encoder, for sums of `words` words (the update and its weight)."""
        shared = self.shared
        return Encoder(shared.training_encoding(shared.federation_id, len(NAMES), round_number, words - 1), len(NAMES))

    def round(self, state: server.ServerState, round_number: int) -> tuple[np.ndarray, server.ServerState]:
        """Round `round_number`'s encoded sum of three random updates, and the state the aggregator makes of it.

        The aggregator's own way: decode, divide by the plan's agreed weight, apply the step in its state's tensors.
        """
        plan = self.plan
        dimension = update_dimension(state.theta.numel(), corrects_drift=False)
        encoder = self.encoder(round_number, dimension + 1)
        weights = [plan.influence.weight_of(name, plan.batch_fraction) for name in NAMES]  # each site's agreed one
        generator = np.random.default_rng(round_number)
        words = [encoder.encode(generator.uniform(-0.01, 0.01, dimension), weight) for weight in weights]
        total = np.sum(words, axis=0, dtype=words[0].dtype)  # modulo 2^k, as the masks cancel
        decoded = encoder.decode(total, len(NAMES))
        agreed = plan.influence.total_weight(NAMES, plan.batch_fraction)
        aggregate = server.Aggregate.from_vector(torch.from_numpy(decoded.weighted_sum), agreed)
        given_up = dataclasses.replace(
            state, theta=state.theta.clone(), theta_average=state.theta_average.clone()
        )  # the aggregator gives its state up; the test keeps its own
        average_from = plan.training.average_from_round
        return total, plan.algorithm().server_apply(given_up, aggregate, average_from=average_from, consume=True)

    def verify(self, chain: ModelChain, state: server.ServerState, round_number: int) -> server.ServerState:
        """`chain` verifies round `round_number`'s sum on `state`; the state the aggregator makes of that sum."""
        words, moved = self.round(state, round_number)
        chain.verified(round_number, words, NAMES, self.encoder(round_number, words.size))
        return moved


def sent(state: server.ServerState) -> tuple[np.ndarray, float]:
    """The model of `state` as a TRAIN download carries it (a built-in model: float32)."""
    return model_download(state.theta.numpy(), builtin=True), state.c


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    workspace = make_workspace(tmp_path_factory.mktemp("chain"), NAMES)
    plan = load_aggregator_plan(workspace.plan)
    assert plan.secure_aggregation.enabled and plan.training.server_momentum > 0.0
    return Federation(plan, load_shared_settings(shared_settings(plan)), initial_state(plan))


def new_chain(federation: Federation) -> ModelChain:
    """A site's chain that builds round 1's model as the aggregator does (the plan's seed)."""
    return ModelChain("site-a", federation.shared, initial=lambda: federation.start.theta)


def verified_chain(federation: Federation, rounds: int) -> tuple[ModelChain, server.ServerState]:
    """A site's chain once it verified `rounds` rounds' sums and took each next model; the last state."""
    chain, state = new_chain(federation), federation.start
    chain.sent(1, *sent(state), None)
    for number in range(1, rounds + 1):
        state = federation.verify(chain, state, number)
        chain.sent(number + 1, *sent(state), None)
    return chain, state


def test_the_honest_steps_momentum_included_are_taken(federation: Federation) -> None:
    chain, state = verified_chain(federation, 2)
    moved = federation.verify(chain, state, 3)  # evaluated after round 3's sum, before round 4's model
    chain.evaluated(3, model_download(moved.theta_average.numpy(), builtin=True), moved.c_average)
    chain.sent(4, *sent(moved), None)
    assert chain.unchecked_from is None and moved.velocity is not None


@pytest.mark.parametrize("where", [0, 17, -1])
def test_any_value_moved_one_ulp_is_refused_naming_the_round(federation: Federation, where: int) -> None:
    chain, state = verified_chain(federation, 1)
    theta, c = sent(federation.verify(chain, state, 2))
    theta = theta.copy()
    theta[where] = np.nextafter(theta[where], np.float32(np.inf))
    with pytest.raises(VerificationError) as caught:
        chain.sent(3, theta, c, None)
    assert caught.value.reason is VerifyReason.NEXT_MODEL and caught.value.round == 3
    assert f"1 of {theta.size} values differ" in str(caught.value)


def test_another_threshold_start_or_output_model_is_refused(federation: Federation) -> None:
    with pytest.raises(VerificationError, match="INITIAL_MODEL"):  # round 1 under drift correction's zeros only
        new_chain(federation).sent(1, *sent(federation.start), np.ones(3))
    chain, state = verified_chain(federation, 1)
    moved = federation.verify(chain, state, 2)
    with pytest.raises(VerificationError, match="NEXT_MODEL"):
        chain.sent(3, sent(moved)[0], float(np.nextafter(moved.c, 0.0)), None)
    chain, state = verified_chain(federation, 1)
    moved = federation.verify(chain, state, 2)
    output = model_download(moved.theta_average.numpy(), builtin=True).copy()
    output[3] = np.nextafter(output[3], np.float32(-np.inf))
    with pytest.raises(VerificationError, match="NEXT_MODEL"):  # theta-bar with one value one ulp down
        chain.evaluated(2, output, moved.c_average)


def test_a_void_round_keeps_the_model_and_a_missed_check_sits_the_round_out(federation: Federation) -> None:
    chain, state = verified_chain(federation, 1)
    federation.verify(chain, state, 2)
    chain.sent(3, *sent(state), None)  # round 2 void after its check: the model stays
    chain.sent(3, *sent(state), None)  # round 3 run again (the aggregator resumed): the same model
    assert chain.unchecked_from is None
    # Round 3's sum was not verified here (the site sat it out): round 4's new model cannot be checked.
    _, moved = federation.round(state, 3)
    with pytest.raises(UncheckedModelError, match="did not verify round 3's sum"):
        chain.sent(4, *sent(moved), None)
    assert chain.unchecked_from == 4
    with pytest.raises(UncheckedModelError):  # nor any later model but one it can check
        chain.sent(5, np.zeros_like(sent(moved)[0]), 0.0, None)
    chain.sent(6, *sent(state), None)  # the rounds since void: the model it checked is taken again


def test_a_shared_plan_without_server_momentum_is_algorithm_ones_step(tmp_path: Path) -> None:
    for momentum in (0.0, 0.9):
        folder = tmp_path / str(momentum)
        plan = load_aggregator_plan(
            make_workspace(folder, NAMES, plan={"training": {"server_momentum": momentum}}).plan
        )
        assert load_shared_settings(shared_settings(plan)).training.server_momentum == momentum


def test_the_output_model_is_compared_slice_by_slice_to_the_last_value(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chain_module, "_COMPARED", 2)  # several slices, the last one short
    chain, state = verified_chain(federation, 1)
    moved = federation.verify(chain, state, 2)
    output = model_download(moved.theta_average.numpy(), builtin=True).copy()
    chain.evaluated(2, output, moved.c_average)
    output[-1] = np.nextafter(output[-1], np.float32(np.inf))
    with pytest.raises(VerificationError, match="NEXT_MODEL"):
        chain.evaluated(2, output, moved.c_average)


def digest(state: server.ServerState) -> str:
    """The model digest round parameters state for a round run on `state` (its TRAIN download and c)."""
    return model_digest(*sent(state))


def test_a_site_that_missed_rounds_catches_up_on_their_sums_and_takes_the_next_model(federation: Federation) -> None:
    """Verified round 1, then away for rounds 2 (applied), 3 (void) and 4 (applied): round 5's model is checked once
    the chain steps by the sums of rounds 2 and 4 (:mod:`~fedfair.runtime.collaborator.catch_up`), momentum included.
    Round 4 ran on round 2's step (its signed digest says so), so round 3's absence is read as void."""
    chain, state = verified_chain(federation, 1)  # it took round 2's model, then left
    words2, after2 = federation.round(state, 2)
    words4, after4 = federation.round(after2, 4)
    with pytest.raises(UncheckedModelError):
        chain.sent(5, *sent(after4), None)
    assert list(chain.missed(4)) == [2, 3, 4]
    ran_on = chain.ran_on(2, digest(state))
    assert ran_on is not None
    chain.caught_up(2, ran_on, words2, NAMES, federation.encoder(2, words2.size))
    assert list(chain.missed(4)) == [3, 4]  # round 3 kept nothing: void, so the chain goes on from round 2's step
    ran_on = chain.ran_on(4, digest(after2))
    assert ran_on is not None
    chain.caught_up(4, ran_on, words4, NAMES, federation.encoder(4, words4.size))
    assert list(chain.missed(4)) == []
    theta, c = sent(after4)
    moved = theta.copy()
    moved[0] = np.nextafter(moved[0], np.float32(np.inf))
    with pytest.raises(VerificationError, match="NEXT_MODEL"):  # the step of a sum it caught up on binds as its own
        chain.sent(5, moved, c, None)
    chain.sent(5, theta, c, None)


def test_a_missed_round_not_kept_that_applied_strands_the_chain_rather_than_splicing(federation: Federation) -> None:
    """Away for rounds 2 and 3, both applied, round 2 not kept: round 3 ran on round 2's step, which this chain never
    made, so it finds no state to step round 3's sum from (issue 98's splice), catches up no more, and sits out."""
    chain, state = verified_chain(federation, 1)
    _, after2 = federation.round(state, 2)
    _, after3 = federation.round(after2, 3)
    assert list(chain.missed(3)) == [2, 3]
    assert chain.ran_on(3, digest(after2)) is None
    assert list(chain.missed(3)) == []  # stranded: no later round can be bridged to either
    with pytest.raises(UncheckedModelError):
        chain.sent(4, *sent(after3), None)


def test_a_site_that_verified_no_sum_yet_catches_up_from_the_initial_model(federation: Federation) -> None:
    """Killed in round 1 before its check and restarted: no anchor, so it steps from the plan's initial model."""
    chain = new_chain(federation)
    words1, after1 = federation.round(federation.start, 1)
    with pytest.raises(UncheckedModelError):
        chain.sent(2, *sent(after1), None)
    assert list(chain.missed(1)) == [1]
    ran_on = chain.ran_on(1, digest(federation.start))
    assert ran_on is not None
    chain.caught_up(1, ran_on, words1, NAMES, federation.encoder(1, words1.size))
    chain.sent(2, *sent(after1), None)
    assert list(ModelChain("site-b", federation.shared).missed(3)) == []  # no initial model of its own: nothing


@pytest.mark.parametrize("next_round_runs", [True, False])
def test_a_round_aborted_after_its_tags_but_served_as_applied_is_dropped_by_the_next_model(
    federation: Federation, next_round_runs: bool
) -> None:
    """Away for round 2, which the aggregator aborted once every site had tagged its sum (no site applied it) and then
    kept as applied: the tags check, so the catch-up steps by it (red team F1b; tags are signed before anything says
    the round applied). The model the honest sites go on from is round 2's start: the next round's signed digest, or
    the output model after the last round, is the state before round 2's step, which the chain keeps beside it as
    the round-void candidate, so round 2 is dropped and nothing built on it is taken."""
    chain, state = verified_chain(federation, 1)  # it took round 2's model, then left
    before2 = copy.deepcopy(state)  # the aggregator's state, which the aborted round's step leaves as it was
    words2, after2 = federation.round(state, 2)  # tagged by every site, then aborted: no one stepped by it
    ran_on = chain.ran_on(2, digest(state))
    assert ran_on is not None
    chain.caught_up(2, ran_on, words2, NAMES, federation.encoder(2, words2.size))
    if next_round_runs:  # round 3 ran on round 2's start (its parties signed that digest)
        words3, after3 = federation.round(before2, 3)
        ran_on = chain.ran_on(3, digest(state))
        assert ran_on is not None
        chain.caught_up(3, ran_on, words3, NAMES, federation.encoder(3, words3.size))
        chain.sent(4, *sent(after3), None)
        with pytest.raises(VerificationError, match="NEXT_MODEL"):  # round 2's step is not a candidate any more
            chain.sent(4, *sent(federation.round(after2, 3)[1]), None)
    else:  # round 2 was the last: the output model the others evaluate is the average of round 2's start
        chain.evaluated(2, model_download(state.theta_average.numpy(), builtin=True), state.c_average)
    assert chain.unchecked_from is None


def test_a_missed_round_its_kind_cannot_tell_was_applied_is_taken_as_not_kept(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Away for rounds 2 and 3; round 2's kind checks it but cannot tell whether it applied (a bounded record naming
    a liar, :class:`~fedfair.core.errors.VoidableRoundError`): the catch-up takes it as a round not kept, and
    round 3's signed digest decides. Round 3 ran on round 2's start, so round 2 was void: the site catches up round 3
    from that state and takes round 4's model; had round 2 applied, round 3 would find no state and the site sit out."""
    chain, state = verified_chain(federation, 1)
    before2 = copy.deepcopy(state)
    federation.round(state, 2)  # voided by a dispute at every accepted site
    words3, after3 = federation.round(before2, 3)
    models = {2: digest(state), 3: digest(state)}

    def parsed(me: object, round_number: int, inputs: list[bytes]) -> KeptRound:
        def step(held: HeldState) -> frozenset[str] | None:
            if round_number == 2:
                return None  # the record names a liar
            chain.caught_up(round_number, held, words3, NAMES, federation.encoder(3, words3.size))
            return frozenset(NAMES)

        return KeptRound(models[round_number], step)

    kind = federation.shared.secure_aggregation.training_kind
    monkeypatch.setitem(catch_up_module.CATCH_UPS, kind, KindCatchUp((), parsed))
    monkeypatch.setattr(catch_up_module, "kept_inputs", lambda *args: [])
    me = types.SimpleNamespace(name="site-a", shared=federation.shared, chain=chain, outcome=None)
    assert catch_up_module.catch_up(me, None, None, 3) is True  # type: ignore[arg-type]
    assert list(chain.missed(3)) == []
    chain.sent(4, *sent(after3), None)
    assert chain.unchecked_from is None
