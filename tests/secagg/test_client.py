"""A party's state machine: its steps only in order, a refused message leaving its state as it was, and
its input recovered only as part of the sum.

Every stage's refusals of a lying server are in test_refusals.py and test_active.py; the round
end to end in test_protocol.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedfair.core.errors import ProtocolError, StaleMessageError
from fedfair.secagg.round import StageSpec
from fedfair.secagg.round_order import PartyOrder
from fedfair.secagg.masked_round import SECURE_ROUND
from tests.secagg.helpers import Harness, check_result, make_config


SPECS = SECURE_ROUND.stages(True)
"""Every stage of a verified round, in order."""


def taken(order: PartyOrder, spec: StageSpec) -> str:
    """Take `spec` with a step that only names it."""
    return order.take(spec, lambda: spec.wire)


def test_each_step_out_of_order_is_refused_naming_the_stage_the_party_waits_for() -> None:
    advertise, share, check, mask, consistency, unmask, claim, tags = SPECS
    order = PartyOrder(SPECS)
    with pytest.raises(
        ProtocolError, match=r"stage SHARE \(SHARE_KEYS\) is out of order: this party is waiting for stage ADVERTISE"
    ):
        taken(order, share)
    assert [taken(order, spec) for spec in (advertise, share, check)] == [
        "ADVERTISE_KEYS",
        "SHARE_KEYS",
        "CHECK_SHARES",
    ]
    for early in (advertise, share, check, consistency, unmask, claim, tags):
        with pytest.raises(ProtocolError, match="out of order: this party is waiting for stage MASK"):
            taken(order, early)


def test_a_step_that_raises_leaves_the_party_where_it_was() -> None:
    order = PartyOrder(SPECS)
    taken(order, SPECS[0])

    def refused() -> str:
        raise ProtocolError("a bad key directory")

    with pytest.raises(ProtocolError, match="a bad key directory"):
        order.take(SPECS[1], refused)
    assert taken(order, SPECS[1]) == "SHARE_KEYS"


def test_only_repeatable_stages_are_taken_again_and_only_skippable_ones_passed_over() -> None:
    """A survivor signs and answers the same again; the unmasking it was never asked for does not hold it back."""
    advertise, share, check, mask, consistency, unmask, claim, tags = SPECS
    assert [spec.wire for spec in SPECS if spec.repeatable] == ["CONSISTENCY", "UNMASK", "VERIFY_CLAIM", "VERIFY_TAGS"]
    assert [spec.wire for spec in SPECS if spec.skippable] == ["UNMASK"]
    order = PartyOrder(SPECS)
    for spec in (advertise, share, check, mask, consistency, consistency):
        taken(order, spec)
    with pytest.raises(ProtocolError, match="out of order: this party is waiting for stage UNMASK"):
        taken(order, mask)
    with pytest.raises(ProtocolError, match="out of order: this party is waiting for stage UNMASK"):
        taken(order, tags)  # its claim was never tagged
    assert [taken(order, spec) for spec in (claim, claim, tags, unmask, consistency)] == [
        "VERIFY_CLAIM",
        "VERIFY_CLAIM",
        "VERIFY_TAGS",
        "UNMASK",
        "CONSISTENCY",
    ]


def test_a_stage_of_another_round_is_refused() -> None:
    order = PartyOrder(SECURE_ROUND.sum_stages)
    with pytest.raises(ProtocolError, match="stage VERIFY_CLAIM is not a stage of this round"):
        taken(order, SPECS[6])


def test_a_refused_message_changes_nothing_and_the_right_one_is_then_taken() -> None:
    """A masking set from another round is stale; the party then masks for the real one, and the sum holds."""
    harness = Harness(make_config(4))
    masking_set = harness.through_check()
    replayed = dataclasses.replace(masking_set, header=dataclasses.replace(masking_set.header, round=7))
    with pytest.raises(StaleMessageError):
        harness.clients[2].masked_input(replayed, harness.encoded[2])
    harness.mask(masking_set, [1, 2, 3, 4])
    harness.sign(harness.server.survivor_set())
    harness.unmask(harness.server.unmask_request())
    check_result(harness.server.finish(), harness.config, harness.inputs, harness.encoded, {1, 2, 3, 4})


def test_a_masked_input_reveals_nothing_of_the_input_by_itself() -> None:
    """The words a party sends are its encoded input plus keystreams: equal inputs give unequal words,
    and their difference is not the difference of the inputs."""
    harness = Harness(make_config(3))
    masking_set = harness.through_check()
    masked = harness.mask(masking_set, [1, 2, 3])
    words = {party: np.asarray(message.vector) for party, message in masked.items()}
    encoded = harness.encoded
    assert not np.array_equal(words[1], encoded[1])
    assert not np.array_equal(words[1] - words[2], encoded[1] - encoded[2])
