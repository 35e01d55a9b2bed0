"""A site admits the survivors' masked inputs with the tag set only where a round may need them: above the bound."""

from __future__ import annotations

from fedfair.runtime.collaborator.uplink import BASE_STAGE_BYTES, PER_PARTY_STAGE_BYTES, input_limit
from fedfair.runtime.transport import pb
from fedfair.secagg.config import RESUMMED_WORDS, fallback_tag_set_bytes, resummed_claim_bytes


def task(stage: pb.Stage) -> pb.Task:
    return pb.Task(binding=pb.Binding(federation_id="f", round=1, stage=stage), action=pb.ACTION_RUN)


def test_the_tag_set_admits_the_inputs_above_the_bound_and_the_claim_below_it() -> None:
    sites, tags = 3, BASE_STAGE_BYTES + PER_PARTY_STAGE_BYTES * 3
    small = 1000  # 3 x 4 (d + 2) words, far below RESUMMED_WORDS: the claim carries the inputs
    assert input_limit(task(pb.STAGE_VERIFY_TAGS), sites, small, 0) == tags
    words = 4 * (small + 2)
    assert input_limit(task(pb.STAGE_VERIFY_CLAIM), sites, small, 0) == (
        BASE_STAGE_BYTES + 8 * words + resummed_claim_bytes(sites, words)
    )
    large = RESUMMED_WORDS  # above it: the tags check the sum, and a round with a missing tag is re-summed
    words = 4 * (large + 2)
    limit = input_limit(task(pb.STAGE_VERIFY_TAGS), sites, large, 0)
    assert limit == tags + fallback_tag_set_bytes(sites, words) and limit > 8 * sites * words
    assert input_limit(task(pb.STAGE_EVAL_VERIFY_TAGS), sites, large, 16384) == tags
    assert fallback_tag_set_bytes(sites, RESUMMED_WORDS // sites) == 0
