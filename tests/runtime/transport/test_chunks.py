"""Transport without the network: bounded chunking of payloads and tensors, and their checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedfair.core.errors import WireError
from fedfair.runtime.contract import EVALUATION, TRAINING, Stages
from tests.runtime.wire_stages import BOUNDED_TRAINING
from fedfair.runtime.transport.chunks import (
    PLAIN_ROUNDING,
    PLAIN_UNDERFLOW,
    plain_rounding,
    plain_upload,
    plain_upload_size,
    read_plain_upload,
)
from fedfair.runtime.transport import (
    INLINE_INPUT_BYTES,
    Forwarder,
    Reassembler,
    assemble,
    decode_tensor,
    encode_tensor,
    inline_input,
    join,
    make_binding,
    model_parts,
    payload_parts,
    pb,
    read_model,
    read_payload,
    split,
    task_with_input,
)
from tests.runtime.wire_stages import WIRE

FEDERATION = "test-federation"
CHUNK = 1024  # small, so payloads span many chunks


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK])
def test_chunking_round_trips(size: int) -> None:
    data = np.random.default_rng(size).bytes(size)
    chunks = list(split(data, CHUNK))
    assert len(chunks) == max(1, -(-size // CHUNK))
    assert all(len(chunk.data) <= CHUNK and chunk.total_size == size for chunk in chunks)
    assert join(chunks, max_total_bytes=size, max_chunk_bytes=CHUNK) == data


def chunk(index: int, count: int, total: int, size: int) -> pb.Chunk:
    return pb.Chunk(index=index, count=count, total_size=total, data=bytes(size))


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([chunk(0, 1, CHUNK + 1, CHUNK + 1)], "over the limit of 1024"),  # oversized chunk
        ([chunk(0, 100, 100 * CHUNK, CHUNK)], "declares 102400 bytes, over the limit"),  # declared total too big
        ([chunk(0, 2, 2 * CHUNK, CHUNK), chunk(1, 3, 2 * CHUNK, CHUNK)], "declares 3 chunks"),  # count changes
        ([chunk(0, 2, 2 * CHUNK, CHUNK), chunk(1, 2, 2 * CHUNK - 1, CHUNK)], "declares 2 chunks / 2047 bytes"),
        ([chunk(1, 2, 2 * CHUNK, CHUNK)], "out of order"),
        ([chunk(0, 2, 2 * CHUNK, CHUNK), chunk(0, 2, 2 * CHUNK, CHUNK)], "out of order"),  # duplicate
        ([chunk(0, 2, 2 * CHUNK, CHUNK)], "stopped after 1 of 2"),  # truncated
        ([chunk(0, 2, CHUNK + 10, CHUNK), chunk(1, 2, CHUNK + 10, 20)], "overruns"),
        ([chunk(0, 2, CHUNK + 10, CHUNK), chunk(1, 2, CHUNK + 10, 5)], "ended at 1029 bytes; 1034 were declared"),
        ([chunk(0, 1, 10, 10), chunk(1, 1, 10, 10)], "after the payload's last chunk"),
        ([chunk(0, 1, 3 * CHUNK, CHUNK)], "impossible"),  # too few chunks for the size
        ([chunk(0, 20, 10, 1)], "impossible"),  # more chunks than bytes
        ([chunk(0, 2, 10, 0)], "is empty"),
        ([], "stopped after 0"),
    ],
)
def test_malformed_chunk_streams_are_refused(chunks: list[pb.Chunk], message: str) -> None:
    with pytest.raises(WireError, match=message):
        join(chunks, max_total_bytes=16 * CHUNK, max_chunk_bytes=CHUNK)
    forwarder = Forwarder(16 * CHUNK, lambda data: None, CHUNK)  # the same checks, nothing buffered
    with pytest.raises(WireError, match=message):
        for piece in chunks:
            forwarder.add(piece)
        forwarder.finish()


@pytest.mark.parametrize("size", [0, 1, CHUNK, 5 * CHUNK + 3])
def test_a_forwarded_payload_arrives_whole_in_order_a_chunk_at_a_time(size: int) -> None:
    data = np.random.default_rng(size).bytes(size)
    binding = make_binding(FEDERATION, 1, WIRE["STAGE_UNMASK"])
    pieces: list[bytes] = []
    forwarder = Forwarder(size, pieces.append, CHUNK)
    assert assemble(payload_parts(binding, data, CHUNK), forwarder, binding) == binding
    assert b"".join(pieces) == data and all(len(piece) <= CHUNK for piece in pieces)


def test_reassembler_reports_progress() -> None:
    assembler = Reassembler(max_total_bytes=3 * CHUNK, max_chunk_bytes=CHUNK)
    pieces = list(split(bytes(2 * CHUNK + 1), CHUNK))
    for piece in pieces:
        assert not assembler.done
        assembler.add(piece)
    assert assembler.done and len(assembler.result()) == 2 * CHUNK + 1


def test_tensors_encode_exactly() -> None:
    import torch

    for values in (np.arange(7, dtype=np.float32) / 3, np.arange(7, dtype=np.float64) / 3, torch.arange(5.0) / 7):
        dtype, data = encode_tensor(values)
        expected = values.numpy() if isinstance(values, torch.Tensor) else values
        assert (
            np.array_equal(decode_tensor(data, dtype), expected) and decode_tensor(data, dtype).dtype == expected.dtype
        )
    assert encode_tensor(np.ones((2, 3), dtype=np.float32))[1] == np.ones(6, dtype="<f4").tobytes()
    with pytest.raises(WireError, match="float32 or float64"):
        encode_tensor(np.arange(3))
    with pytest.raises(WireError, match="whole number"):
        decode_tensor(b"abc", pb.DTYPE_FLOAT32)
    with pytest.raises(WireError, match="unknown tensor dtype"):
        decode_tensor(b"", pb.DTYPE_UNSPECIFIED)


def test_model_parts_are_checked() -> None:
    binding = make_binding(FEDERATION, 3, WIRE["STAGE_TRAIN"])
    theta = np.linspace(-1, 1, 1000, dtype=np.float64)
    parts = list(model_parts(binding, theta, 2.5, chunk_bytes=CHUNK))
    assert len(parts) == 8
    got, c = read_model(parts, binding, max_values=1000, max_chunk_bytes=CHUNK)
    assert c == 2.5 and np.array_equal(got, theta)
    with pytest.raises(WireError, match="over the limit"):
        read_model(parts, binding, max_values=999, max_chunk_bytes=CHUNK)
    with pytest.raises(WireError, match="another federation, round or stage"):
        read_model(parts, make_binding(FEDERATION, 4, WIRE["STAGE_TRAIN"]), max_values=1000, max_chunk_bytes=CHUNK)
    mixed = list(model_parts(binding, theta, 2.5, chunk_bytes=CHUNK))
    mixed[3].threshold = 1.0
    with pytest.raises(WireError, match="disagree"):
        read_model(mixed, binding, max_values=1000, max_chunk_bytes=CHUNK)
    with pytest.raises(WireError, match="non-finite"):
        read_model(model_parts(binding, np.array([np.nan], dtype=np.float32), 0.0), binding, max_values=1)


def test_payload_parts_must_share_one_binding() -> None:
    first, second = make_binding(FEDERATION, 1, WIRE["STAGE_UNMASK"]), make_binding(FEDERATION, 2, WIRE["STAGE_UNMASK"])
    parts = list(payload_parts(first, bytes(3 * CHUNK), CHUNK))
    parts[2].binding.CopyFrom(second)
    with pytest.raises(WireError, match="another federation, round or stage"):
        read_payload(parts, max_total_bytes=3 * CHUNK, max_chunk_bytes=CHUNK)
    with pytest.raises(WireError, match="empty"):
        read_payload([], max_total_bytes=1)


@pytest.mark.parametrize("size", [0, 1, INLINE_INPUT_BYTES])
def test_a_small_stage_input_rides_with_its_task(size: int) -> None:
    payload = np.random.default_rng(size).bytes(size)
    task = task_with_input(pb.Task(binding=make_binding(FEDERATION, 1, WIRE["STAGE_SHARE_KEYS"])), payload)
    received = pb.Task.FromString(task.SerializeToString())
    assert received.input_size == size
    assert inline_input(received) == payload  # the empty input too: nothing to fetch


def test_a_large_stage_input_is_announced_for_fetching() -> None:
    task = task_with_input(pb.Task(), bytes(INLINE_INPUT_BYTES + 1))
    assert task.input_size == INLINE_INPUT_BYTES + 1
    assert inline_input(pb.Task.FromString(task.SerializeToString())) is None


@pytest.mark.parametrize("size", [INLINE_INPUT_BYTES, INLINE_INPUT_BYTES + 1])
def test_an_input_in_pieces_is_announced_at_its_whole_size_and_rides_joined_when_small(size: int) -> None:
    whole = np.random.default_rng(size).bytes(size)
    pieces = (whole[:3], memoryview(whole)[3 : size // 2], whole[size // 2 :])
    task = pb.Task.FromString(task_with_input(pb.Task(), pieces).SerializeToString())
    assert task.input_size == size
    assert inline_input(task) == (whole if size <= INLINE_INPUT_BYTES else None)


def test_a_carried_input_that_contradicts_its_task_is_refused() -> None:
    # An aggregator that announces one size and sends another, or sends more than may ride.
    oversized = bytes(INLINE_INPUT_BYTES + 1)
    for task in (pb.Task(input=b"abc", input_size=2), pb.Task(input=oversized, input_size=len(oversized))):
        with pytest.raises(WireError, match="carries .* input bytes but announces"):
            inline_input(task)


def test_a_model_is_sent_from_and_read_into_its_own_buffer() -> None:
    # A model of d values costs its own bytes once on arrival: the chunks land in one buffer of the declared
    # size, and the writable array the collaborator trains from is that buffer, not a copy of it.
    import tracemalloc

    binding = make_binding(FEDERATION, 3, WIRE["STAGE_TRAIN"])
    theta = np.linspace(-1, 1, 200_000, dtype=np.float64)
    parts = list(model_parts(binding, theta, 2.5, chunk_bytes=1 << 16))
    tracemalloc.start()
    try:
        got, _ = read_model(parts, binding, max_values=theta.size, max_chunk_bytes=1 << 16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(got, theta) and got.flags.writeable
    # The buffer, the finiteness check's mask (a byte a value) and one chunk; a copy would add d x 8 bytes.
    assert peak < theta.nbytes + theta.size + (1 << 16)
    data = bytearray(np.arange(4, dtype="<f8").tobytes())
    shared = decode_tensor(data, pb.DTYPE_FLOAT64)
    assert np.shares_memory(shared, np.frombuffer(data, dtype="<f8")) and shared.flags.writeable
    copied = decode_tensor(bytes(data), pb.DTYPE_FLOAT64)
    assert copied.flags.writeable and not np.shares_memory(copied, np.frombuffer(data, dtype="<f8"))
    # Sending is as thrifty: the bytes to hash and cut into chunks are the model's own, not a copy.
    _, sent = encode_tensor(theta)
    assert np.shares_memory(np.frombuffer(sent, dtype="<f8"), theta) and sent.nbytes == theta.nbytes


@settings(max_examples=50, deadline=None)
@given(
    values=arrays(np.float64, st.integers(0, 200), elements=st.floats(-1e6, 1e6)),
    weight=st.floats(1e-3, 1e6),
    stages=st.sampled_from([TRAINING, BOUNDED_TRAINING, EVALUATION]),
)
def test_a_plain_upload_is_float32_for_training_float64_otherwise_and_its_weight_exact(
    values: np.ndarray, weight: float, stages: Stages
) -> None:
    stage = stages.plain_values
    payload = b"".join(plain_upload(values, weight, stage))
    training = stages is not EVALUATION
    assert len(payload) == plain_upload_size(values.size, stage) == values.size * (4 if training else 8) + 8
    read, read_weight = read_plain_upload(payload, stage)
    assert read_weight == weight and read.dtype == np.dtype("<f4" if training else "<f8")
    # Round to nearest: within half an ulp of a 24-bit significand, 2^-24 of each value, or of the smallest
    # subnormal below the normal range (float64: exact).
    error = np.abs(read.astype(np.float64) - values)
    assert all(e <= plain_rounding(abs(v), stage) for e, v in zip(error, values, strict=True))
    assert plain_rounding(1.0, stage) == (PLAIN_ROUNDING + PLAIN_UNDERFLOW if training else 0.0)
    with pytest.raises(WireError, match="float64 weight"):
        read_plain_upload(payload[:-1], stage)


def test_a_plain_upload_sends_values_already_in_its_wire_type_from_their_own_memory() -> None:
    """A float32 update's upload is a view of its words, not a copy: at d = 10^7 a joined copy held each site's
    40 MB update twice for the whole upload (issue 97). Values in another type are converted first."""
    values = np.linspace(-1.0, 1.0, 1001, dtype=np.float32)
    words, weight = plain_upload(values, 2.5, TRAINING.plain_values)
    assert np.shares_memory(np.frombuffer(words, dtype=np.float32), values)
    assert np.frombuffer(weight, dtype="<f8")[0] == 2.5
    widened = plain_upload(values.astype(np.float64), 2.5, TRAINING.plain_values)
    assert not np.shares_memory(np.frombuffer(widened[0], dtype=np.float32), values)
    assert b"".join(widened) == b"".join((words, weight))
