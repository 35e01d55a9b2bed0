"""The plan's noise floor against the secure-aggregation protocol's own rules, by brute force.

The floor (fedfair.runtime.plan.privacy.plan_floor) is the fewest survivors of any sum the protocol can unmask
under a plan; the noise is calibrated so that the honest ones among them carry it all. Here every round the
protocol allows under a drawn plan is built as a real SecAggConfig (its graph and its threshold in force), and
every survivor set is tried against what the parties check before they unmask: no sum is ever unmasked with
fewer survivors than the floor, and on the complete graph the floor is reached.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError, PrivacyWarning, UnmaskRefusedError
from fedfair.runtime.collaborator.steps import Participant
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.plan.learning_settings import LearningSettings, read_learning
from fedfair.runtime.plan.privacy import PlanPrivacy, answer_release, party_mu, plan_floor
from fedfair.secagg import EncodingConfig, SecAggConfig, SecurityParameters
from fedfair.secagg.graph import check_survivors

ENCODING = EncodingConfig(clip=1.0, max_weight=1.0, fractional_bits=8, modulus_bits=64)


def unmaskable(config: SecAggConfig, survivors: frozenset[int]) -> bool:
    """Whether the parties of `config` would let the aggregator unmask the sum of `survivors`.

    What the clients check (fedfair.secagg.client): every party of the round could deal its shares to t holders,
    at least t survivors, a survivor graph that max_colluding parties cannot cut; and what unmasking needs: t
    shares of each survivor's seed and of each dropped neighbour's mask key, held by survivors.
    """
    t, parties = config.t, range(1, config.size + 1)
    if len(survivors) < t or any(len(config.holders_of(party)) < t for party in parties):
        return False
    try:
        check_survivors(config.graph, survivors, config.security.max_colluding)
    except UnmaskRefusedError:
        return False
    dropped = set(parties) - survivors
    needed = list(survivors) + [party for party in dropped if config.graph[party] & survivors]
    return all(len(config.holders_of(party) & survivors) >= t for party in needed)


def signing_floor(learning: LearningSettings, collaborators: int) -> int:
    """The fewest survivors a collaborator of the plan signs for (its own rule: Participant.survivor_floor)."""
    shared = SharedSettings(**learning.learning_sections(), federation_id="floor", collaborator_count=collaborators)
    key = ec.generate_private_key(ec.SECP256R1())
    return Participant("site-0", shared, 1, key, b"", lambda credential, name: key.public_key()).survivor_floor


def fewest_unmasked(learning: LearningSettings, collaborators: int) -> int | None:
    """The fewest survivors of any sum the protocol unmasks, over every round and survivor set the plan allows.

    Every set of [quorum] min_collaborators or more of the roster as a round's parties (the graph is drawn over
    the whole roster, so which parties take part matters on a SecAgg+ graph), every subset of them as survivors
    that the collaborators sign for. None when no round can be unmasked at all.
    """
    secure = learning.secure_aggregation
    signed = signing_floor(learning, collaborators)
    roster = tuple(f"site-{index}" for index in range(collaborators))
    best: int | None = None
    for size in range(learning.quorum.min_collaborators, collaborators + 1):
        for parties in itertools.combinations(roster, size):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", PrivacyWarning)  # two parties: the sum reveals the other
                    config = SecAggConfig(
                        "floor",
                        1,
                        parties,
                        1,
                        ENCODING,
                        secure.security(collaborators),
                        roster,
                    )
            except ConfigError:
                continue  # the protocol runs no such round
            limit = size if best is None else min(size, best - 1)
            for count in range(signed, limit + 1):
                survivors = (frozenset(chosen) for chosen in itertools.combinations(range(1, size + 1), count))
                if any(unmaskable(config, chosen) for chosen in survivors):
                    best = count
                    break
    return best


@st.composite
def plans(draw: st.DrawFn) -> tuple[int, dict[str, dict[str, Any]]]:
    """A federation's size and a plan's [secure_aggregation] and [quorum].

    The masking graph, the collusion bound, a threshold or none, the dropout policy and the quorum (the whole
    roster under dropouts = "none", as the plan requires).
    """
    collaborators = draw(st.integers(2, 7))
    colluding = draw(st.integers(0, 2))
    neighbours = draw(st.sampled_from(["auto", 0, collaborators - 1, *range(2, collaborators - 1)]))
    dropouts = draw(st.sampled_from(["allowed", "none"]))
    secure: dict[str, Any] = {"neighbours": neighbours, "max_colluding": colluding, "dropouts": dropouts}
    if draw(st.booleans()):
        secure["threshold"] = draw(st.integers(2, collaborators))
    quorum = collaborators if dropouts == "none" else draw(st.integers(2, collaborators))
    return collaborators, {"secure_aggregation": secure, "quorum": {"min_collaborators": quorum}}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(plans())
def test_no_round_the_protocol_can_unmask_has_fewer_survivors_than_the_floor(
    plan: tuple[int, dict[str, dict[str, Any]]],
) -> None:
    collaborators, sections = plan
    try:
        learning = read_learning("plan.toml", sections, collaborators)
    except ConfigError:
        assume(False)  # a plan the reader refuses is never served
        raise
    floor = learning.survivor_floor(collaborators)
    colluders = learning.secure_aggregation.max_colluding
    assert floor - colluders >= 2  # the rule's t >= c + 2: two honest inputs in every sum
    fewest = fewest_unmasked(learning, collaborators)
    assert fewest is not None  # a plan that is read runs some round
    assert floor <= fewest
    if learning.secure_aggregation.mask_neighbours(collaborators) in (None, collaborators - 1):
        assert floor == fewest  # on the complete graph the smallest round the parties sign for is reachable
    # Calibrated to the floor, the honest survivors of the smallest sum carry at least the whole noise.
    release = answer_release(PlanPrivacy(report_epsilon=1.0), ())
    assert (fewest - colluders) * party_mu(release, floor, colluders) >= release.mu * (1 - 1e-12)


@pytest.mark.parametrize(("quorum", "floor"), [(2, 2), (4, 3), (10, 6)])
def test_a_degree_of_every_other_site_is_the_complete_graph_of_each_round(quorum: int, floor: int) -> None:
    """Issue 51, item 3: neighbours = n - 1 masks each round over its own parties, with t from the round's size.

    Ten sites, no colluders: a round of `quorum` parties unmasks with floor(quorum / 2) + 1 survivors, not the
    6 that ten holders of each secret would need.
    """
    sections = {"secure_aggregation": {"neighbours": 9}, "quorum": {"min_collaborators": quorum}}
    learning = read_learning("plan.toml", sections, 10)
    assert learning.survivor_floor(10) == floor
    spelled_complete = read_learning("plan.toml", {**sections, "secure_aggregation": {"neighbours": 0}}, 10)
    assert spelled_complete.survivor_floor(10) == floor


def test_dropouts_none_puts_every_collaborator_in_every_sum() -> None:
    sections = {"secure_aggregation": {"dropouts": "none", "neighbours": 4}, "quorum": {"min_collaborators": 5}}
    assert read_learning("plan.toml", sections, 5).survivor_floor(5) == 5


def test_a_floor_no_round_can_reach_is_refused_with_the_fix() -> None:
    """Four colluders among five sites: t >= c + 2 = 6 holders exceed any round, so no noise floor exists."""
    assert (
        plan_floor(5, 2, SecurityParameters(max_colluding=3), True) == 5
    )  # three colluders: only the full round, t = 5
    with pytest.raises(ConfigError, match=r"no round of 2 to 5 collaborators .* lower max_colluding"):
        plan_floor(5, 2, SecurityParameters(max_colluding=4), True)
