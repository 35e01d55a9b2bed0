"""Property: from a sum it verified, a site takes the next model only as the plan's server step of it (issue 79).

The aggregator sends the model, not the sum (docs/security.md, "The next model"). Whatever it changes in the
model it sends for training (theta as it travels, c) or for evaluation (theta-bar, c-bar) is refused, and the
honest model is taken.

The tolerance is zero, and that follows from the arithmetic. The site decodes the verified sum as the
aggregator does: integer words, then one rounding per coordinate. It applies the same float64 operations to
each coordinate in the same order (the plan's ``server_apply``, here with server momentum), and narrows the
result to float32 by round-to-nearest as the download does (``model_download``). So the honest model, made the
aggregator's way (the sum decoded whole, the step applied to its own tensors), equals the site's bit for bit.
Any float32 value that differs, a single ulp included, is a change no honest rounding produces.

The colluders of ``max_colluding`` add inputs of their choosing to the sum, which the sum's check cannot
refuse (tests/secagg/test_resum.py shows they cannot move it otherwise). The sum is held to the aggregator's
bounds instead (``core/sum_bounds.py``): an input that carries the mean step past ``[influence] update_norm``,
beyond the encoding's rounding and ``NORM_SLACK``, makes no step, and a model made of it is refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fedfair.core import server
from fedfair.core.errors import VerificationError, VerifyReason
from fedfair.core.sum_bounds import NORM_SLACK
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.collaborator.chain import ModelChain
from fedfair.core.update import update_dimension
from fedfair.runtime.contract import model_download
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import (
    AggregatorPlan,
    SharedSettings,
    load_aggregator_plan,
    load_shared_settings,
    shared_settings,
)
from fedfair.secagg import Encoder

NAMES = ("site-a", "site-b", "site-c")
COLLUDER = "site-c"
"""The colluding contributor of the bounds property (the aggregator's word plus one site's input)."""

Model = tuple[np.ndarray, float]
"""(theta as a download carries it, c): what the aggregator sends."""


@dataclasses.dataclass
class Federation:
    """A secure plan with server momentum, as the aggregator and a site hold it, and round 1's state."""

    plan: AggregatorPlan
    shared: SharedSettings
    start: server.ServerState

    @property
    def dimension(self) -> int:
        """The sum's length less its weight word: delta theta and delta c."""
        return update_dimension(self.start.theta.numel(), corrects_drift=False)

    def encoder(self, round_number: int) -> Encoder:
        shared = self.shared
        encoding = shared.training_encoding(shared.federation_id, len(NAMES), round_number, self.dimension)
        return Encoder(encoding, len(NAMES))

    def summed(self, round_number: int, seed: int, colluder: np.ndarray | None = None) -> np.ndarray:
        """Round `round_number`'s encoded sum of three updates of the plan's agreed weights (uniform in +-0.01,
        drawn from `seed`); `colluder`, given, is COLLUDER's mean step (its input is that times its weight)."""
        encoder, plan = self.encoder(round_number), self.plan
        generator = np.random.default_rng(seed)
        words = []
        for name in NAMES:
            weight = plan.influence.weight_of(name, plan.batch_fraction)
            step = generator.uniform(-0.01, 0.01, self.dimension) if colluder is None or name != COLLUDER else colluder
            words.append(encoder.encode(weight * step, weight))
        return np.sum(words, axis=0, dtype=words[0].dtype)  # modulo 2^k, as the masks cancel

    def stepped(self, state: server.ServerState, words: np.ndarray, round_number: int) -> server.ServerState:
        """The state the aggregator makes of `words`: decoded whole, the step applied in its own tensors."""
        plan = self.plan
        decoded = self.encoder(round_number).decode(words, len(NAMES))
        agreed = plan.influence.total_weight(NAMES, plan.batch_fraction)
        aggregate = server.Aggregate.from_vector(torch.from_numpy(decoded.weighted_sum), agreed)
        given_up = dataclasses.replace(state, theta=state.theta.clone(), theta_average=state.theta_average.clone())
        average_from = plan.training.average_from_round
        return plan.algorithm().server_apply(given_up, aggregate, average_from=average_from, consume=True)


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    workspace = make_workspace(tmp_path_factory.mktemp("chain-property"), NAMES)
    plan = load_aggregator_plan(workspace.plan)
    assert plan.secure_aggregation.enabled and plan.training.server_momentum > 0.0
    return Federation(plan, load_shared_settings(shared_settings(plan)), initial_state(plan))


def sent(state: server.ServerState) -> Model:
    """The model of `state` as a TRAIN download carries it (a built-in model: float32)."""
    return model_download(state.theta.numpy(), builtin=True), state.c


def output(state: server.ServerState) -> Model:
    """The output model (theta-bar, c-bar) of `state` as an evaluation download carries it."""
    return model_download(state.theta_average.numpy(), builtin=True), state.c_average


def verified(federation: Federation, rounds: int, seed: int) -> tuple[ModelChain, server.ServerState]:
    """A site's chain that took round 1's model and verified `rounds` sums, taking each next model but the last:
    the state the aggregator makes of the last sum (whose model is due next)."""
    start = federation.start
    chain = ModelChain("site-a", federation.shared, initial=lambda: start.theta)
    chain.sent(1, *sent(start), None)
    state = start
    for number in range(1, rounds + 1):
        words = federation.summed(number, seed + number)
        chain.verified(number, words, NAMES, federation.encoder(number))
        state = federation.stepped(state, words, number)
        if number < rounds:
            chain.sent(number + 1, *sent(state), None)
    return chain, state


# ---------------------------------------------------------------- what the aggregator may change


def differs(before: Model, after: Model, *, wire_dtype: bool) -> bool:
    """Whether `after` is another model than `before`: another length, any value numerically different (NaN
    differs from everything), another c, or (`wire_dtype`: a TRAIN download, whose dtype the check holds) another
    dtype. The values alone decide for an output model and a zero's sign decides nothing: see the test of both."""
    (theta, c), (changed, changed_c) = before, after
    if changed.shape != theta.shape or (wire_dtype and changed.dtype != theta.dtype):
        return True
    values_differ = bool(np.any((changed != theta) | np.isnan(changed)))
    return values_differ or not changed_c == c


Tamper = Callable[[Model], Model]


def moved_ulps(where: int, ulps: int) -> Tamper:
    """theta's value `where` moved `ulps` float32 units in the last place (negative: down): inside any tolerance
    a float comparison would allow, outside the zero the honest step leaves."""

    def tamper(model: Model) -> Model:
        theta = model[0].copy()
        index = where % theta.size
        for _ in range(abs(ulps)):
            theta[index] = np.nextafter(theta[index], np.float32(math.copysign(np.inf, ulps)))
        return theta, model[1]

    return tamper


def set_value(where: int, value: float) -> Tamper:
    """theta's value `where` set to `value` (as float32): a backdoor's weight, a NaN, an infinity."""

    def tamper(model: Model) -> Model:
        theta = model[0].copy()
        theta[where % theta.size] = np.float32(value)
        return theta, model[1]

    return tamper


def scaled(factor: float) -> Tamper:
    """theta scaled by `factor` (in float32, as it travels)."""
    return lambda model: ((model[0] * np.float32(factor)).astype(np.float32), model[1])


def permuted(order: list[int]) -> Tamper:
    """theta's values in another `order` (its first len(order) values shuffled)."""

    def tamper(model: Model) -> Model:
        theta = model[0].copy()
        theta[: len(order)] = model[0][order]
        return theta, model[1]

    return tamper


def moved_c(ulps: int, value: float | None) -> Tamper:
    """c moved `ulps` float64 units in the last place, or (`value` given) set to it."""

    def tamper(model: Model) -> Model:
        c = model[1]
        if value is not None:
            return model[0], value
        for _ in range(abs(ulps)):
            c = float(np.nextafter(c, math.copysign(np.inf, ulps)))
        return model[0], c

    return tamper


def reshaped(how: str) -> Tamper:
    """theta sent in float64 (the state's unnarrowed values), a value short or one too many."""

    def tamper(model: Model) -> Model:
        theta = model[0]
        if how == "float64":
            return theta.astype(np.float64), model[1]
        if how == "short":
            return theta[:-1].copy(), model[1]
        return np.append(theta, np.float32(0.0)), model[1]

    return tamper


ULPS = st.integers(1, 8) | st.integers(-8, -1)
TAMPERS = st.one_of(
    st.builds(moved_ulps, st.integers(0, 10**6), ULPS),
    st.builds(set_value, st.integers(0, 10**6), st.floats(width=32)),
    st.builds(set_value, st.integers(0, 10**6), st.sampled_from([math.nan, math.inf, -math.inf])),
    st.builds(scaled, st.floats(0.5, 2.0, width=32).filter(lambda factor: factor != 1.0)),
    st.builds(permuted, st.permutations(list(range(8)))),
    st.builds(moved_c, ULPS, st.none()),
    st.builds(moved_c, st.just(0), st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(reshaped, st.sampled_from(["float64", "short", "long"])),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tamper=TAMPERS, rounds=st.integers(1, 3), evaluation=st.booleans(), seed=st.integers(0, 2**16))
def test_any_change_to_the_next_model_is_refused_and_the_honest_one_taken(
    federation: Federation, tamper: Tamper, rounds: int, evaluation: bool, seed: int
) -> None:
    chain, state = verified(federation, rounds, seed)
    honest = output(state) if evaluation else sent(state)
    changed = tamper(honest)
    assume(differs(honest, changed, wire_dtype=not evaluation))
    with pytest.raises(VerificationError) as caught:
        if evaluation:
            chain.evaluated(rounds, *changed)
        else:
            chain.sent(rounds + 1, *changed, None)
    assert caught.value.reason is VerifyReason.NEXT_MODEL
    assert caught.value.round == (rounds if evaluation else rounds + 1)
    # The refusal changed nothing the site holds: the honest model is still taken, and only it.
    if evaluation:
        chain.evaluated(rounds, *honest)
    else:
        chain.sent(rounds + 1, *honest, None)
    assert chain.unchecked_from is None


def test_a_download_is_held_bit_for_bit(federation: Federation) -> None:
    """Found by the property above: a zero's sign and a wider copy are changes too.

    Compared by value, -0.0 passed for 0.0 (the plan's initial model is all zeros, so an aggregator chose their
    signs in round 1's model) and a float64 copy of the float32 theta-bar passed for it. Neither moved a logit,
    but a download is exactly what the aggregator must send, so both are refused now.
    """
    start = federation.start
    assert not np.any(start.theta.numpy())
    chain = ModelChain("site-a", federation.shared, initial=lambda: start.theta)
    theta, c = sent(start)
    with pytest.raises(VerificationError, match=r"INITIAL_MODEL.*\(108 of 108 values differ"):
        chain.sent(1, -theta, c, None)
    chain.sent(1, theta, c, None)
    assert chain.unchecked_from is None
    chain, state = verified(federation, 1, 5)
    theta_bar, c_bar = output(state)
    with pytest.raises(VerificationError, match="NEXT_MODEL"):
        chain.evaluated(1, theta_bar.astype(np.float64), c_bar)
    chain.evaluated(1, theta_bar, c_bar)
    with pytest.raises(VerificationError, match="NEXT_MODEL"):
        chain.sent(2, sent(state)[0].astype(np.float64), state.c, None)


# ---------------------------------------------------------------- what a colluder may add


def colluder_round(federation: Federation, reach: float, seed: int) -> str:
    """Round 2 with COLLUDER's own mean step `reach` times update_norm long (its weight the agreed one).

    The sum verifies (it is the true sum of the inputs). Returns "stepped" when the site took the model the
    aggregator's step makes of it, "void" when it refused that model (OUT_OF_BOUNDS) and took the one before, and
    "undecided" for a sum inside the rounding band where the bound's slack decides (no claim either way).
    """
    plan = federation.plan
    norm, agreed = plan.influence.update_norm, plan.influence.total_weight(NAMES, plan.batch_fraction)
    generator = np.random.default_rng(seed)
    direction = generator.standard_normal(federation.dimension)
    mine = plan.influence.weight_of(COLLUDER, plan.batch_fraction)
    # Scaled so that the colluder's input alone moves the mean step `reach` times the bound; every coordinate
    # inside the clip box, as the encoding demands of any input.
    colluder = direction / np.linalg.norm(direction) * (reach * norm * agreed / mine)
    encoder = federation.encoder(2)
    assert np.abs(colluder).max() < encoder.config.clip
    chain, state = verified(federation, 1, seed)
    chain.sent(2, *sent(state), None)
    words = federation.summed(2, seed + 2, colluder)
    decoded = encoder.decode(words, len(NAMES))
    length = float(np.linalg.norm(decoded.weighted_sum)) / agreed
    rounding = decoded.error_bound * len(NAMES) * math.sqrt(words.size) / agreed
    if abs(length - norm) <= norm * NORM_SLACK + rounding:
        return "undecided"
    chain.verified(2, words, NAMES, encoder)
    moved = federation.stepped(state, words, 2)
    if length < norm:
        chain.sent(3, *sent(moved), None)
        return "stepped"
    with pytest.raises(VerificationError) as caught:
        chain.sent(3, *sent(moved), None)
    assert caught.value.reason is VerifyReason.OUT_OF_BOUNDS and caught.value.round == 3
    chain.sent(3, *sent(state), None)  # the round void: only the model before it follows
    return "void"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reach=st.floats(0.0, 3.0), seed=st.integers(0, 2**16))
def test_a_colluders_input_past_the_update_norm_makes_no_step_and_no_model(
    federation: Federation, reach: float, seed: int
) -> None:
    colluder_round(federation, reach, seed)


def test_the_bound_property_reaches_both_sides(federation: Federation) -> None:
    """The property above can fail both ways: half the bound steps, twice the bound is void."""
    assert [colluder_round(federation, reach, 11) for reach in (0.5, 2.0)] == ["stepped", "void"]
