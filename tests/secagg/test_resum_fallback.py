"""Above RESUMMED_WORDS a survivor's missing tag is answered by the re-sum, for that round only (issue 79).

Such a round's claim carries no re-sum material, and the tags check the sum. When a survivor leaves before its tag
(a crash, an expired certificate, on purpose), the server's tag set carries what it unmasked the sum from (every
survivor's masked input, the rebuilt secrets, the t consistency signatures), and every other survivor re-sums the
sum it tagged: the round applies. The re-sum's soundness is the same as below the bound (docs/security.md,
"Verified aggregation"), so dropping a tag lets the aggregator skip nothing; with every tag in, no material is sent.
Here the bound is patched down to 0 words, so every round is above it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from fedfair.core.errors import VerificationError, VerifyReason
from fedfair.secagg import config as config_module
from fedfair.secagg.resum import resum_decides
from fedfair.secagg.round import small_upload
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.simulate import DropOut, simulate_round
from fedfair.secagg.verify_messages import AggregateClaim, TagSet
from fedfair.secagg.wire import Stage
from tests.secagg.helpers import Harness, check_result, encode_all, make_config, make_inputs
from tests.secagg.test_recheck import covering_tags, rechecked_round


@pytest.fixture(autouse=True)
def above_the_bound() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config_module, "RESUMMED_WORDS", 0)
        yield


def fallback_round(parties: int = 4, max_colluding: int = 0) -> tuple[Harness, AggregateClaim]:
    """A round of ``parties`` through UNMASK above the bound, and the server's honest claim (no material in it).

    With no colluder allowed, so that every survivor is sent this one claim (tests/secagg/test_recheck.py has the
    re-checked rounds, where each is sent its own).
    """
    harness = Harness(make_config(parties, modulus_bits=16, max_colluding=max_colluding), verified=True)
    harness.unmask(harness.through_consistency(list(range(1, parties + 1))))
    harness.server.finish()
    claim = harness.server.claim()
    assert not harness.config.resummed and resum_decides(harness.config) and claim.inputs == ()
    return harness, claim


def over_wire(tag_set: TagSet) -> TagSet:
    return TagSet.from_bytes(tag_set.to_bytes())


def refusal(harness: Harness, tag_set: TagSet, party: int) -> VerifyReason:
    with pytest.raises(VerificationError) as caught:
        harness.clients[party].verify(over_wire(tag_set))
    assert caught.value.round == harness.config.round
    return caught.value.reason


@pytest.mark.parametrize("stage", [Stage.CONSISTENCY, Stage.UNMASK, Stage.VERIFY])
@pytest.mark.parametrize("leavers", [(4,), (2, 5)])
def test_survivors_silent_after_masking_leave_a_sum_every_other_survivor_accepts(
    stage: Stage, leavers: tuple[int, ...]
) -> None:
    """Their inputs are in the sum, and every other survivor re-sums it from the tag set and accepts it whole."""
    config = make_config(5 if len(leavers) > 1 else 4, max_colluding=0, threshold=3)
    assert not config.resummed and resum_decides(config)
    inputs = make_inputs(config)
    encoded = encode_all(config, inputs)
    trace = simulate_round(config, lambda party: encoded[party].copy(), DropOut({stage: leavers}), verified=True)
    everyone = tuple(range(1, config.size + 1))
    assert trace.result.contributors == everyone
    check_result(trace.result, config, inputs, encoded, set(everyone))
    assert sorted(trace.verified) == [party for party in everyone if party not in leavers]
    for decoded in trace.verified.values():
        np.testing.assert_array_equal(decoded.weighted_sum, trace.result.decoded.weighted_sum)
        assert decoded.total_weight == trace.result.decoded.total_weight


def test_the_server_sends_the_material_only_where_a_tag_is_missing() -> None:
    """Every tag in: the tag check alone, and a tag set of a few hundred bytes. One missing: n masked inputs more."""
    withheld = SECURE_ROUND.verify_stages[0].withheld
    assert withheld is not None
    harness, claim = fallback_round()
    for party in (1, 2, 3, 4):
        harness.server.receive_tag(harness.clients[party].tag(claim))
    assert withheld(harness.server) is None
    complete = harness.server.tag_set()
    assert complete.inputs == () and complete.seeds == () and complete.signatures == ()
    assert len(complete.to_bytes()) < small_upload(harness.config)
    for party in (1, 2, 3, 4):
        np.testing.assert_array_equal(harness.clients[party].verify(over_wire(complete)), claim.vector)

    harness, claim = fallback_round()
    for party in (1, 2, 3):
        harness.server.receive_tag(harness.clients[party].tag(claim))
    assert harness.server.untagged == (4,) and withheld(harness.server) is None
    partial = harness.server.tag_set()
    assert [tag.sender for tag in partial.tags] == [1, 2, 3]
    assert len(partial.inputs) == 4 and [owner for owner, _ in partial.seeds] == [1, 2, 3, 4]
    assert len(partial.signatures) >= harness.config.t
    words = claim.vector.size * claim.vector.itemsize
    assert len(partial.to_bytes()) - len(complete.to_bytes()) >= 4 * words  # the n masked inputs
    for party in (1, 2, 3):
        np.testing.assert_array_equal(harness.clients[party].verify(over_wire(partial)), claim.vector)


def material(harness: Harness) -> TagSet:
    """The honest server's re-sum material, as a tag set with no tag received carries it."""
    tag_set = harness.server.tag_set()
    assert len(tag_set.inputs) == harness.config.size and tag_set.tags == ()
    return tag_set


def test_a_forged_sum_with_a_missing_tag_is_still_refused() -> None:
    """Site 4 is silent; sites 1 to 3 tagged. Whatever the aggregator shows with the material, a wrong sum fails."""
    harness, claim = fallback_round()
    t = harness.config.t
    honest = material(harness)
    moved = claim.vector.copy()
    moved[1] += 1
    forged = AggregateClaim.from_bytes(replace(claim, vector=moved).to_bytes())
    true_tags = tuple(harness.clients[party].tag(claim) for party in (1, 2, 3))
    changed_input = honest.inputs[2].copy()
    changed_input[0] += 1
    with_tags = replace(honest, tags=true_tags)
    cases = {
        "no material": (TagSet(claim.header, true_tags), VerifyReason.MISSING_TAG),
        "a seed other than its committed one": (
            replace(with_tags, seeds=((1, bytes(32)), *honest.seeds[1:])),
            VerifyReason.FORGED,
        ),
        "a masked input moved": (
            replace(with_tags, inputs=(*honest.inputs[:2], changed_input, honest.inputs[3])),
            VerifyReason.FORGED,
        ),
        "t - 1 signatures": (replace(with_tags, signatures=honest.signatures[: t - 1]), VerifyReason.MALFORMED),
        "one signer t times": (replace(with_tags, signatures=(honest.signatures[0],) * t), VerifyReason.MALFORMED),
        "a masked input short": (replace(with_tags, inputs=honest.inputs[:3]), VerifyReason.MALFORMED),
        "an altered tag beside it": (
            replace(with_tags, tags=(true_tags[0], replace(true_tags[1], tags=bytes(64)))),
            VerifyReason.BAD_TAG,
        ),
    }
    for name, (wrong, reason) in cases.items():
        assert refusal(harness, wrong, 1) is reason, name
    np.testing.assert_array_equal(harness.clients[1].verify(over_wire(with_tags)), claim.vector)

    harness, claim = fallback_round()
    honest = material(harness)
    forged = AggregateClaim.from_bytes(replace(claim, vector=moved).to_bytes())
    tags = tuple(harness.clients[party].tag(forged) for party in (1, 2, 3))
    for party in (1, 2, 3):
        assert refusal(harness, replace(honest, tags=tags), party) is VerifyReason.FORGED, "a word moved"


def test_a_colluding_survivors_covering_tag_buys_nothing_once_a_tag_is_missing() -> None:
    """The aggregator and site 2 forge the sum, site 2 covering it with its tag and values; site 4 leaves before tagging.

    A re-checked round (max_colluding = 1): with site 4's tag missing, its report is missing too, the tag set must
    carry the material, and every honest survivor's re-sum refuses the forged sum, whether the colluder's masked
    input is shown true or moved to match.
    """
    harness, claims = rechecked_round(4, max_colluding=1)
    honest = material(harness)
    vector = claims[1].vector.copy()
    vector[0] += 1000
    error = vector - claims[1].vector
    tags = [harness.clients[party].tag(replace(claims[party], vector=vector)) for party in (1, 3)]
    tags += covering_tags(harness, claims, vector, (2,), cover_values=True)
    tags.sort(key=lambda tag: tag.sender)
    moved = (*honest.inputs[:1], honest.inputs[1] + error, *honest.inputs[2:])
    for inputs in (honest.inputs, moved):
        for party in (1, 3):
            assert refusal(harness, replace(honest, tags=tuple(tags), inputs=inputs), party) is VerifyReason.FORGED


def test_a_tag_set_with_material_round_trips() -> None:
    harness, claim = fallback_round()
    sent = replace(material(harness), tags=(harness.clients[1].tag(claim),))
    received = over_wire(sent)
    assert received.tags == sent.tags and received.seeds == sent.seeds and received.mask_keys == sent.mask_keys
    assert received.signatures == sent.signatures and len(received.inputs) == len(sent.inputs)
    for got, want in zip(received.inputs, sent.inputs, strict=True):
        np.testing.assert_array_equal(got, want)
