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
from tests.secagg.helpers import Harness, check_result, make_config


def test_each_step_out_of_order_is_refused_naming_the_stage_the_party_waits_for() -> None:
    harness = Harness(make_config(4))
    client = harness.clients[1]
    masking_set = harness.through_check()
    with pytest.raises(
        ProtocolError, match=r"share_keys\(\) called out of order: this party is waiting for stage MASK"
    ):
        client.share_keys(harness.directory)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=r"advertise\(\) called out of order"):
        client.advertise()
    harness.mask(masking_set, [1, 2, 3, 4])
    harness.sign(harness.server.survivor_set())
    harness.unmask(harness.server.unmask_request())
    check_result(harness.server.finish(), harness.config, harness.inputs, harness.encoded, {1, 2, 3, 4})


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
