"""A site admits the survivors' masked inputs with the tag set only above the bound, and reads a large one into a file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedfair.runtime.peer.uplink import Uplink, input_limit
from fedfair.runtime.contract import EVALUATION, TRAINING, Aggregations
from tests.runtime.wire_stages import BOUNDED_TRAINING
from fedfair.runtime.transport import EVALUATE, WireStage, make_binding, pb
from fedfair.runtime.transport.chunks import split
from fedfair.secagg import config as config_module
from fedfair.secagg.config import RESUMMED_WORDS, fallback_tag_set_bytes, resummed_claim_bytes
from fedfair.secagg.bounded.stages import part_bytes, record_bytes
from fedfair.secagg.round import BASE_STAGE_BYTES, PER_PARTY_STAGE_BYTES
from fedfair.secagg.verify_messages import TagSet
from tests.secagg.helpers import Harness, make_config
from tests.runtime.wire_stages import WIRE


MASKED = Aggregations(TRAINING, EVALUATION)
BOUNDED = Aggregations(BOUNDED_TRAINING, EVALUATION)


def task(stage: WireStage) -> pb.Task:
    return pb.Task(binding=make_binding("f", 1, stage), action=pb.ACTION_RUN)


def test_the_tag_set_admits_the_inputs_above_the_bound_and_the_claim_below_it() -> None:
    sites, tags = 3, BASE_STAGE_BYTES + PER_PARTY_STAGE_BYTES * 3
    small = 1000  # 3 x 4 (d + 2) words, far below RESUMMED_WORDS: the claim carries the inputs
    assert input_limit(task(WIRE["STAGE_VERIFY_TAGS"]), MASKED, sites, small, 0) == tags
    words = 4 * (small + 2)
    assert input_limit(task(WIRE["STAGE_VERIFY_CLAIM"]), MASKED, sites, small, 0) == (
        BASE_STAGE_BYTES + 8 * words + resummed_claim_bytes(sites, words)
    )
    large = RESUMMED_WORDS  # above it: the tags check the sum, and a round with a missing tag is re-summed
    words = 4 * (large + 2)
    limit = input_limit(task(WIRE["STAGE_VERIFY_TAGS"]), MASKED, sites, large, 0)
    assert limit == tags + fallback_tag_set_bytes(sites, words) and limit > 8 * sites * words
    assert input_limit(task(WIRE["STAGE_EVAL_VERIFY_TAGS"]), MASKED, sites, large, 16384) == tags
    assert fallback_tag_set_bytes(sites, RESUMMED_WORDS // sites) == 0


def test_every_secure_stage_reads_what_its_declaration_caps_for_the_roster_and_the_sums_length() -> None:
    """The bounded sum's verdict record and tag set, and the key stages, capped by their declarations alone."""
    sites, parameters = 3, 1000
    roster = BASE_STAGE_BYTES + PER_PARTY_STAGE_BYTES * sites
    assert input_limit(task(WIRE["STAGE_BOUNDED_DECIDE"]), BOUNDED, sites, parameters, 0) == roster + record_bytes(
        sites, 4 * (parameters + 2)
    )
    disputes = sites * part_bytes(4 * (parameters + 2))  # an excluded site's part, shown at most once each
    assert input_limit(task(WIRE["STAGE_BOUNDED_VERIFY"]), BOUNDED, sites, parameters, 0) == (
        roster + PER_PARTY_STAGE_BYTES + disputes
    )
    for aggregations, stage in (
        (MASKED, WIRE["STAGE_ADVERTISE_KEYS"]),
        (MASKED, WIRE["STAGE_EVAL_UNMASK"]),
        (BOUNDED, WIRE["STAGE_BOUNDED_SHARE"]),
        (MASKED, WireStage(EVALUATE.aggregation, 99)),  # a step no declaration has
    ):
        assert input_limit(task(stage), aggregations, sites, parameters, 0) == roster


class FetchOnly:
    """A stub whose Fetch streams one payload in small chunks, as the aggregator's board does."""

    def __init__(self, payload: bytes, binding: pb.Binding) -> None:
        self.payload, self.binding = payload, binding

    def Fetch(self, request: pb.FetchRequest, timeout: float) -> Iterator[pb.Part]:  # noqa: N802 -- gRPC's name
        return iter(pb.Part(binding=self.binding, chunk=chunk) for chunk in split(self.payload, 4096))


def test_a_large_tag_set_is_read_into_an_unlinked_file_and_re_summed_from_its_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config_module, "RESUMMED_WORDS", 0)
    harness = Harness(make_config(4, modulus_bits=16, max_colluding=1), verified=True)
    harness.unmask(harness.through_consistency([1, 2, 3, 4]))
    harness.server.finish()
    claims = harness.server.claims()  # re-checked (max_colluding = 1): each site's own claim
    claim = claims[1]
    for party in (1, 2, 3):
        harness.server.receive_tag(harness.clients[party].tag(claims[party]))
    payload = harness.server.tag_set().to_bytes()
    fetched = task(WIRE["STAGE_VERIFY_TAGS"])
    fetched.input_size = len(payload)
    view = Uplink().input_in_file(FetchOnly(payload, fetched.binding), fetched, len(payload), tmp_path)
    assert view.readonly and bytes(view) == payload
    assert list(tmp_path.iterdir()) == []  # unlinked: it never outlives the process
    tag_set = TagSet.from_bytes(view)
    assert len(tag_set.inputs) == 4
    for party in (1, 2, 3):
        np.testing.assert_array_equal(harness.clients[party].verify(tag_set), claim.vector)
