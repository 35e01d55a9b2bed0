"""A party that took no part in a round checks its sum from what every survivor was sent (issue 98).

Party 5 advertises and shares, then is gone before MASK (killed, or shown a false view): it holds nothing of the
round. From the key directory, the survivor set, the unmask request, the claim and the tag set it accepts the honest
sum and refuses a forged one, below RESUMMED_WORDS by its own re-sum and above it by the survivors' tags and their
re-checked values.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from fedfair.core.errors import VerificationError, VerifyReason
from fedfair.secagg import config as config_module
from fedfair.secagg.bystander import PastRound, check_past_sum
from fedfair.secagg.messages import KeyDirectory, SurvivorSet, UnmaskRequest
from fedfair.secagg.verify_messages import AggregateClaim, TagSet
from tests.secagg.helpers import Harness, make_config

SURVIVORS = [1, 2, 3, 4]
BYSTANDER = 5


def past_round(max_colluding: int = 1) -> tuple[Harness, PastRound]:
    """A verified round of 5 parties that party 5 left before MASK, as the aggregator relayed it, over the wire."""
    harness = Harness(make_config(5, modulus_bits=16, max_colluding=max_colluding), verified=True)
    survivor_set = harness.through_masking(SURVIVORS)
    harness.sign(survivor_set)
    request = harness.server.unmask_request()
    harness.unmask(request)
    harness.server.finish()
    # Above the bound each survivor tags its own claim (its re-checked peers' inputs); a bystander is kept the one
    # every survivor was sent alike.
    own = harness.server.claims() if harness.config.rechecked else {}
    claim = harness.server.claim()
    for party in SURVIVORS:
        harness.server.receive_tag(harness.clients[party].tag(own.get(party, claim)))
    assert harness.directory is not None
    past = PastRound(
        KeyDirectory.from_bytes(harness.directory.to_bytes()),
        SurvivorSet.from_bytes(survivor_set.to_bytes()),
        UnmaskRequest.from_bytes(request.to_bytes()),
        AggregateClaim.from_bytes(claim.to_bytes()),
        TagSet.from_bytes(harness.server.tag_set().to_bytes()),
    )
    return harness, past


def honest_sum(harness: Harness) -> np.ndarray:
    return sum((harness.encoded[party] for party in SURVIVORS), np.zeros_like(harness.encoded[1]))


def refusal(harness: Harness, past: PastRound) -> VerifyReason:
    with pytest.raises(VerificationError) as caught:
        check_past_sum(past, harness.config, harness.verify)
    assert caught.value.round == harness.config.round
    return caught.value.reason


@pytest.fixture(params=["re-summed", "tags"])
def check(request: pytest.FixtureRequest) -> Iterator[str]:
    """Below RESUMMED_WORDS (the bystander re-sums), or above it (patched to 0: the tags decide)."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "tags":
            patch.setattr(config_module, "RESUMMED_WORDS", 0)
        yield request.param


def test_the_honest_sum_of_a_round_it_missed_is_accepted(check: str) -> None:
    harness, past = past_round()
    assert harness.config.resummed == (check == "re-summed")
    np.testing.assert_array_equal(check_past_sum(past, harness.config, harness.verify), honest_sum(harness))


def test_a_moved_word_is_refused(check: str) -> None:
    harness, past = past_round()
    moved = past.claim.vector.copy()
    moved[3] += 1
    # Both checks catch it: the re-sum gives the true sum; the tags, signed over the true claim's digest, are
    # signed over another digest than the moved claim's.
    reason = refusal(harness, replace(past, claim=replace(past.claim, vector=moved)))
    assert reason is (VerifyReason.FORGED if check == "re-summed" else VerifyReason.BAD_TAG)


def test_a_view_fewer_than_t_survivors_signed_is_refused(check: str) -> None:
    harness, past = past_round()
    signatures = past.unmask_request.signatures[: harness.config.t - 1]
    request = replace(past.unmask_request, signatures=signatures)
    assert refusal(harness, replace(past, unmask_request=request)) is VerifyReason.MALFORMED


def test_a_survivor_left_out_of_the_view_is_refused(check: str) -> None:
    """The survivor set shown without party 4 (the equivocation): nobody signed that view."""
    harness, past = past_round()
    survivor_set = replace(past.survivor_set, survivors=(1, 2, 3), inputs=past.survivor_set.inputs[:3])
    assert refusal(harness, replace(past, survivor_set=survivor_set)) is VerifyReason.MALFORMED


def test_a_forged_advertisement_is_refused(check: str) -> None:
    harness, past = past_round()
    first = past.directory.advertisements[0]
    forged = replace(first, mask_public_key=past.directory.advertisements[1].mask_public_key)
    directory = replace(past.directory, advertisements=(forged, *past.directory.advertisements[1:]))
    assert refusal(harness, replace(past, directory=directory)) is VerifyReason.MALFORMED


def test_a_missing_tag_is_refused_without_material() -> None:
    """Above the bound a tag set without a survivor's tag and without the re-sum material proves nothing."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config_module, "RESUMMED_WORDS", 0)
        harness, past = past_round()
        tag_set = replace(past.tag_set, tags=past.tag_set.tags[1:])
        assert refusal(harness, replace(past, tag_set=tag_set)) is VerifyReason.MISSING_TAG
