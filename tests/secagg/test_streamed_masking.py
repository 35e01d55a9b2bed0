"""A masked input streamed in pieces and chunks decodes to the same bits as one sent whole."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.runtime.transport import join, split
from fedfair.runtime.transport.chunks import payload_size
from fedfair.secagg.messages import MaskedInput
from fedfair.secagg.server import AggregateResult
from tests.runtime.transport.test_pieces import CUTS, chunk_size
from tests.secagg.helpers import Harness, check_result, make_config


def masked_round(harness: Harness, cut: tuple[str, int] | None) -> AggregateResult:
    """One round by everyone, each masked input sent whole (None) or streamed from its pieces in chunks."""
    masking_set = harness.through_check()
    for party, client in sorted(harness.clients.items()):
        message = client.masked_input(masking_set, harness.encoded[party].copy())
        if cut is not None:
            pieces = message.to_pieces()
            size = payload_size(pieces)
            chunk_bytes = chunk_size(size, cut)
            arrived = join(split(pieces, chunk_bytes), max_total_bytes=size, max_chunk_bytes=chunk_bytes)
            message = MaskedInput.from_bytes(arrived)
        harness.server.receive_masked_input(message)
    harness.sign(harness.server.survivor_set())
    harness.unmask(harness.server.unmask_request())
    return harness.server.finish()


@given(st.integers(1, 300), st.sampled_from([16, 32, 64]), CUTS)
@settings(max_examples=25, deadline=None)
def test_a_streamed_masked_sum_decodes_to_the_bits_of_the_whole_one(
    dimension: int, modulus_bits: int, cut: tuple[str, int]
) -> None:
    config = make_config(3, dimension=dimension, modulus_bits=modulus_bits)
    whole, streamed = masked_round(Harness(config), None), masked_round(Harness(config), cut)
    assert whole.encoded_sum.tobytes() == streamed.encoded_sum.tobytes()
    assert whole.decoded.weighted_sum.tobytes() == streamed.decoded.weighted_sum.tobytes()
    assert whole.decoded.total_weight == streamed.decoded.total_weight
    harness = Harness(config)
    check_result(masked_round(harness, cut), config, harness.inputs, harness.encoded, set(harness.clients))
