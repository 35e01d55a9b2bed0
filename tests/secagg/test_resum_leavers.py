"""A survivor that leaves after masking costs nothing where every survivor re-sums, and opens no door.

Where each survivor's own re-sum decides the sum (:func:`~fedfair.secagg.resum.resum_decides`), a survivor's
missing tag does not void the round: its input is in the sum the others re-sum, from the masked inputs their signed
view fixes and the secrets rebuilt at UNMASK. Dropping tags must not let the aggregator skip anything the re-sum
relies on (docs/security.md, "Verified aggregation"). Where the tags check the sum (SecAgg+ graphs, sums above
RESUMMED_WORDS: tests/secagg/test_verify.py) a missing tag still voids it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fedfair.core.errors import VerificationError, VerifyReason
from fedfair.secagg.resum import resum_decides
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.simulate import DropOut, simulate_round
from fedfair.secagg.verify_messages import AggregateClaim, TagSet
from fedfair.secagg.wire import Stage
from tests.secagg.helpers import Harness, check_result, encode_all, make_config, make_inputs


@pytest.mark.parametrize("stage", [Stage.CONSISTENCY, Stage.UNMASK, Stage.VERIFY])
@pytest.mark.parametrize("leavers", [(4,), (2, 5)])
def test_survivors_silent_after_masking_leave_a_sum_every_other_survivor_verifies(
    stage: Stage, leavers: tuple[int, ...]
) -> None:
    """Their inputs are in the sum and in every other survivor's re-sum: each accepts the whole sum, theirs included."""
    config = make_config(5 if len(leavers) > 1 else 4, max_colluding=0, threshold=3)
    assert resum_decides(config)
    inputs = make_inputs(config)
    encoded = encode_all(config, inputs)
    trace = simulate_round(config, lambda party: encoded[party].copy(), DropOut({stage: leavers}), verified=True)
    everyone = tuple(range(1, config.size + 1))
    assert trace.result.contributors == everyone  # the leavers masked: their inputs are in the sum
    check_result(trace.result, config, inputs, encoded, set(everyone))
    assert sorted(trace.verified) == [party for party in everyone if party not in leavers]
    for decoded in trace.verified.values():
        np.testing.assert_array_equal(decoded.weighted_sum, trace.result.decoded.weighted_sum)
        assert decoded.total_weight == trace.result.decoded.total_weight


def verified_round(
    parties: int, max_colluding: int = 0, neighbours: int | None = None
) -> tuple[Harness, AggregateClaim]:
    """A round of ``parties`` that all mask, sign and unmask, and the server's honest claim."""
    harness = Harness(
        make_config(parties, modulus_bits=16, max_colluding=max_colluding, neighbours=neighbours), verified=True
    )
    harness.unmask(harness.through_consistency(list(range(1, parties + 1))))
    harness.server.finish()
    return harness, harness.server.claim()


def refused(harness: Harness, claim: AggregateClaim, party: int) -> VerifyReason:
    with pytest.raises(VerificationError) as caught:
        harness.clients[party].tag(AggregateClaim.from_bytes(claim.to_bytes()))
    return caught.value.reason


def test_with_every_tag_dropped_the_aggregator_skips_no_check_the_re_sum_relies_on() -> None:
    """A hostile aggregator relays no tag at all: the re-sum, the view's digests, the seeds and the t signatures on the
    view still decide. The honest sum passes; a moved word, a claim without t signatures on the party's view, or a
    relayed tag altered beside the missing ones is refused."""
    harness, claim = verified_round(4, max_colluding=1)
    t = harness.config.t
    assert resum_decides(harness.config) and len(claim.signatures) >= t
    moved = claim.vector.copy()
    moved[1] += 1
    cases = {
        "a word moved": (replace(claim, vector=moved), VerifyReason.FORGED),
        "no signatures": (replace(claim, signatures=()), VerifyReason.MALFORMED),
        "t - 1 signatures": (replace(claim, signatures=claim.signatures[: t - 1]), VerifyReason.MALFORMED),
        "one signer t times": (replace(claim, signatures=(claim.signatures[0],) * t), VerifyReason.MALFORMED),
        "a non-survivor's": (
            replace(claim, signatures=claim.signatures[: t - 1] + ((99, claim.signatures[0][1]),)),
            VerifyReason.MALFORMED,
        ),
    }
    for name, (wrong, reason) in cases.items():
        assert refused(harness, wrong, 1) is reason, name
    tags = {party: harness.clients[party].tag(claim) for party in (1, 2, 3)}
    true_sum = harness.server._sum
    for party in (1, 2, 3):
        np.testing.assert_array_equal(harness.clients[party].verify(TagSet(claim.header, ())), true_sum)
    altered = replace(tags[2], tags=bytes(64))
    with pytest.raises(VerificationError) as caught:
        harness.clients[3].verify(TagSet(claim.header, (tags[1], altered)))
    assert caught.value.reason is VerifyReason.BAD_TAG


def test_the_aggregator_relays_the_tags_it_has_where_the_re_sum_decides_and_withholds_them_otherwise() -> None:
    withheld = SECURE_ROUND.verify_stages[0].withheld
    assert withheld is not None
    harness, claim = verified_round(4)
    # No tag at all: no survivor re-summed the claim and found it true (one that found it forged tags nothing).
    assert withheld(harness.server) == (
        "no survivor tagged the claimed sum (site-1, site-2, site-3, site-4 sent none): nobody verified it"
    )
    for party in (1, 2, 3):
        harness.server.receive_tag(harness.clients[party].tag(claim))
    assert harness.server.untagged == (4,) and withheld(harness.server) is None
    assert [tag.sender for tag in harness.server.tag_set().tags] == [1, 2, 3]


def test_on_a_secagg_plus_graph_a_missing_tag_still_voids_the_sum() -> None:
    """The counting that lets the re-sum decide alone is for the complete graph (docs/security.md)."""
    config = make_config(6, neighbours=3, threshold=3)
    assert config.resummed and not resum_decides(config)
    encoded = encode_all(config, make_inputs(config))
    with pytest.raises(VerificationError, match="no tag from site-6") as caught:
        simulate_round(config, lambda party: encoded[party].copy(), DropOut({Stage.VERIFY: [6]}), verified=True)
    assert caught.value.reason is VerifyReason.MISSING_TAG
    harness, claim = verified_round(6, neighbours=3)
    withheld = SECURE_ROUND.verify_stages[0].withheld
    assert withheld is not None
    for party in range(1, 6):
        harness.server.receive_tag(harness.clients[party].tag(claim))
    assert withheld(harness.server) == "no tag of the claimed sum from site-6: nobody could verify it"
