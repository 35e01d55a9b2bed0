"""Bounded chunking of byte payloads and float tensors, with declared total sizes.

A payload travels as ``count`` :class:`Chunk` messages in index order, each declaring
the same ``count`` and ``total_size`` and holding at most ``chunk_bytes`` bytes. The
receiver fixes its own limits (largest chunk, largest total) and refuses anything
oversized, out of order or inconsistent before buffering it, with a
:class:`WireError` that says what was wrong (never who sent it). That detail, limits
included, is for the receiver's own log: a server answers every WireError with the
one generic :data:`MALFORMED_MESSAGE`, so a sender cannot probe its limits.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import grpc
import numpy as np

from fedfair.core.errors import WireError
from fedfair.runtime.transport import fedfair_pb2 as pb

DEFAULT_CHUNK_BYTES = 1 << 20  # payload bytes per message
# gRPC message limit on both ends: one chunk plus its envelope, with room to spare.
MAX_MESSAGE_BYTES = DEFAULT_CHUNK_BYTES + (64 << 10)

_DTYPES: dict[pb.DType, np.dtype[np.floating[Any]]] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_FLOAT64: np.dtype("<f8"),
}


MALFORMED_MESSAGE = "message refused: malformed, oversized or incomplete"
"""What a sender hears about any WireError (the detail stays in the receiver's log)."""


# ---------------------------------------------------------------- bytes


Pieces = tuple[bytes | memoryview, ...]
"""A payload as consecutive pieces that are never joined: a serialised message around a model-sized vector
travels from the vector's own memory, one chunk's copy at a time."""


@runtime_checkable
class InPieces(Protocol):
    """A message that travels in pieces, its vectors views of their own words (never copied whole)."""

    def to_pieces(self) -> Pieces:
        """The message's bytes as consecutive pieces."""


def payload_size(payload: bytes | memoryview | Pieces) -> int:
    """The bytes of `payload`, whole or in pieces."""
    pieces = payload if isinstance(payload, tuple) else (payload,)
    return sum(memoryview(piece).nbytes for piece in pieces)


def split(data: bytes | memoryview | Pieces, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[pb.Chunk]:
    """Cut ``data`` into chunks of at most ``chunk_bytes`` (one empty chunk for empty data).

    Pieces are cut as their concatenation would be, chunk for chunk, without ever joining them whole.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    pieces = iter(memoryview(piece).cast("B") for piece in (data if isinstance(data, tuple) else (data,)))
    total = payload_size(data)
    count = max(1, math.ceil(total / chunk_bytes))
    rest = memoryview(b"")
    for index in range(count):
        wanted = min(chunk_bytes, total - index * chunk_bytes)
        gathered: list[memoryview] = []
        while wanted > 0:
            while not rest:
                rest = next(pieces)
            gathered.append(rest[:wanted])
            wanted -= len(gathered[-1])
            rest = rest[len(gathered[-1]) :]
        yield pb.Chunk(index=index, count=count, total_size=total, data=b"".join(gathered))


class Reassembler:
    """Collect chunks of one payload under the receiver's limits."""

    def __init__(self, max_total_bytes: int, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.max_total_bytes = max_total_bytes
        self.max_chunk_bytes = max_chunk_bytes
        self._count = 0
        self._total = 0
        self._next = 0
        self._filled = 0
        self._buffer = bytearray()

    @property
    def done(self) -> bool:
        """Whether every chunk the first one announced has been added."""
        return self._next > 0 and self._next == self._count

    def add(self, chunk: pb.Chunk) -> None:
        """Accept the next chunk or raise WireError."""
        size = len(chunk.data)
        if size > self.max_chunk_bytes:
            raise WireError(f"chunk {chunk.index} holds {size} bytes, over the limit of {self.max_chunk_bytes}")
        if self._next == 0:
            self._start(chunk)
        elif self.done:
            raise WireError(f"chunk {chunk.index} arrived after the payload's last chunk")
        elif chunk.count != self._count or chunk.total_size != self._total:
            raise WireError(
                f"chunk {chunk.index} declares {chunk.count} chunks / {chunk.total_size} bytes, "
                f"but the payload declared {self._count} / {self._total}"
            )
        if chunk.index != self._next:
            raise WireError(f"chunk {chunk.index} arrived out of order; expected chunk {self._next}")
        if size == 0 and self._total > 0:
            raise WireError(f"chunk {chunk.index} is empty")
        if self._filled + size > self._total:
            raise WireError(f"chunk {chunk.index} overruns the declared total of {self._total} bytes")
        self._keep(chunk.data)
        self._filled += size
        self._next += 1
        if self.done and self._filled != self._total:
            raise WireError(f"the payload ended at {self._filled} bytes; {self._total} were declared")

    def _start(self, chunk: pb.Chunk) -> None:
        total, count = chunk.total_size, chunk.count
        if total > self.max_total_bytes:
            raise WireError(f"the payload declares {total} bytes, over the limit of {self.max_total_bytes}")
        fewest = max(1, math.ceil(total / self.max_chunk_bytes))
        if count < fewest or count > max(1, total):
            raise WireError(f"the payload declares {count} chunks, impossible for {total} bytes")
        self._count, self._total = count, total
        self._allocate(total)

    def _allocate(self, total: int) -> None:
        # The declared size (already within the limit) at once: growing chunk by chunk would copy the payload
        # each time the buffer outgrew its allocation, holding it twice meanwhile.
        self._buffer = bytearray(total)

    def _keep(self, data: bytes) -> None:
        self._buffer[self._filled : self._filled + len(data)] = data

    def result(self) -> bytes:
        """The payload, once every declared chunk has arrived."""
        return bytes(self.take())

    def take(self) -> bytearray:
        """The payload's own buffer, once every declared chunk has arrived, for a caller that keeps it (no copy)."""
        self.finish()
        return self._buffer

    def finish(self) -> None:
        """Raise WireError unless every chunk the first one announced has arrived."""
        if not self.done:
            raise WireError(f"the payload stopped after {self._next} of {self._count or '?'} chunks")


class Forwarder(Reassembler):
    """Check the chunks of one payload as :class:`Reassembler` does, handing each to `sink` as it arrives.

    For a payload that goes straight to a file (the final model bundle): it is never held whole.
    """

    def __init__(
        self, max_total_bytes: int, sink: Callable[[bytes], object], max_chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> None:
        super().__init__(max_total_bytes, max_chunk_bytes)
        self.sink = sink

    def _allocate(self, total: int) -> None:
        pass  # nothing is buffered

    def _keep(self, data: bytes) -> None:
        self.sink(data)


def join(chunks: Iterable[pb.Chunk], *, max_total_bytes: int, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> bytes:
    """Reassemble a complete payload from its chunks."""
    assembler = Reassembler(max_total_bytes, max_chunk_bytes)
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.result()


def digest(data: bytes) -> bytes:
    """SHA-256 of a payload (what a Receipt echoes)."""
    return hashlib.sha256(data).digest()


# ---------------------------------------------------------------- tensors


def encode_tensor(values: object) -> tuple[pb.DType, memoryview]:
    """A float32/float64 array or tensor, flattened, as (DType, its little-endian bytes).

    The bytes are a view of the values where they already lie contiguous and little-endian (a model's
    tensor): hashing or cutting it into chunks then costs no copy of the model. Use them before the values
    change.
    """
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    for dtype, wire in _DTYPES.items():
        if array.dtype.kind == "f" and array.dtype.itemsize == wire.itemsize:
            return dtype, np.ascontiguousarray(array.reshape(-1), dtype=wire).data.cast("B")
    raise WireError(f"tensors travel as float32 or float64, got {array.dtype}; convert before sending")


def decode_tensor(data: bytes | bytearray | memoryview, dtype: pb.DType) -> np.ndarray:
    """The inverse of encode_tensor: a flat, writable native-order array.

    A writable buffer (a bytearray) in native order becomes the array itself, with no copy (the caller hands it
    over); read-only bytes are copied.
    """
    wire = _DTYPES.get(dtype)
    if wire is None:
        raise WireError(f"unknown tensor dtype {dtype}; expected DTYPE_FLOAT32 or DTYPE_FLOAT64")
    if len(data) % wire.itemsize:
        raise WireError(f"{len(data)} bytes is not a whole number of {wire.itemsize}-byte values")
    values = np.frombuffer(data, dtype=wire)
    return values.astype(wire.newbyteorder("="), copy=not values.flags.writeable)


# ---------------------------------------------------------------- plain uploads

PLAIN_WEIGHT = np.dtype("<f8")
"""The weight of a plain upload, after its values: float64 always, for the plan agrees it exactly."""

PLAIN_ROUNDING = 2.0**-24
"""Float32 round-to-nearest moves a normal value by at most this fraction of it (half an ulp, 24-bit significand)."""

PLAIN_UNDERFLOW = 2.0**-150
"""...and a value below float32's normal range by at most half its smallest subnormal."""


PlainValues = np.dtype[np.floating[Any]]
"""The wire type of a plain (unmasked) upload's values, which its aggregation states
(:attr:`~fedfair.runtime.contract.Stages.plain_values`): float32 or float64."""


def plain_rounding(magnitude: float, wire: PlainValues) -> float:
    """The most the wire type `wire` moves a value of at most `magnitude`: 0 for float64, which is exact."""
    return magnitude * PLAIN_ROUNDING + PLAIN_UNDERFLOW if wire.itemsize == 4 else 0.0


def plain_upload_size(dimension: int, wire: PlainValues) -> int:
    """The bytes of a plain upload of `dimension` values in `wire`, the weight included."""
    return dimension * wire.itemsize + PLAIN_WEIGHT.itemsize


def plain_upload(values: np.ndarray, weight: float, wire: PlainValues) -> Pieces:
    """A plain upload: `values` in the wire type `wire`, then `weight`, little-endian, as pieces.

    The values travel from their own memory where they are already `wire`'s contiguous words (a float32 update's):
    joined, each site held its model-sized update twice for the whole upload.
    """
    words = np.ascontiguousarray(values, dtype=wire)
    return words.data.cast("B"), np.array(weight, dtype=PLAIN_WEIGHT).tobytes()


def read_plain_upload(payload: bytes, wire: PlainValues) -> tuple[np.ndarray, float]:
    """(values, weight) of a plain upload; values is a read-only view of `payload`, in its wire type `wire`.

    Raises:
        WireError: `payload` is no whole number of values before its weight.
    """
    size = len(payload) - PLAIN_WEIGHT.itemsize
    if size < 0 or size % wire.itemsize:
        raise WireError(f"a plain upload is {wire.name} values and a float64 weight, not {len(payload)} bytes")
    values = np.frombuffer(payload, dtype=wire, count=size // wire.itemsize)
    return values, float(np.frombuffer(payload, dtype=PLAIN_WEIGHT, offset=size)[0])


# ---------------------------------------------------------------- bound parts


def model_parts(
    binding: pb.Binding, theta: object, threshold: float, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[pb.ModelPart]:
    """(theta, c) as a stream of ModelPart messages bound to ``binding``."""
    dtype, data = encode_tensor(theta)
    for chunk in split(data, chunk_bytes):
        yield pb.ModelPart(binding=binding, dtype=dtype, threshold=float(threshold), theta=chunk)


def read_model(
    parts: Iterable[pb.ModelPart],
    binding: pb.Binding,
    *,
    max_values: int,
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> tuple[np.ndarray, float]:
    """Reassemble (theta, c) from ModelPart messages that must all carry ``binding``."""
    assembler = Reassembler(max_values * 8, max_chunk_bytes)
    dtype: pb.DType | None = None
    threshold = math.nan
    for part in parts:
        if part.binding != binding:
            raise WireError("a model part is bound to another federation, round or stage")
        if dtype is None:
            dtype, threshold = part.dtype, part.threshold
            if dtype not in _DTYPES:
                raise WireError(f"unknown tensor dtype {dtype}; expected DTYPE_FLOAT32 or DTYPE_FLOAT64")
            assembler.max_total_bytes = max_values * _DTYPES[dtype].itemsize
        elif part.dtype != dtype or part.threshold != threshold:
            raise WireError("model parts disagree on the dtype or the threshold c")
        assembler.add(part.theta)
    theta = decode_tensor(assembler.take(), dtype if dtype is not None else pb.DTYPE_FLOAT32)
    if not math.isfinite(threshold) or not np.all(np.isfinite(theta)):
        raise WireError("the model holds a non-finite value")
    return theta, threshold


class Uploader:
    """Uploads over one connection's Federation stub, remembering whether its aggregator has Send.

    A payload that fits one chunk goes in one unary Send, anything longer as a Submit stream
    of chunks; the receiver treats both alike. Send exists because a unary call costs about
    half the CPU of a one-part stream on both ends (no request-iterator thread), a cost the
    small secure-aggregation messages pay at every stage of every round. An aggregator older
    than Send answers UNIMPLEMENTED without reading the part: that upload then goes as a
    Submit stream, and so do the later small ones over this connection, without asking
    again (a new connection, perhaps to an upgraded aggregator, asks once more).
    """

    def __init__(self, stub: Any) -> None:
        self.stub = stub
        self.sends = True
        """False once this connection's aggregator answered a Send UNIMPLEMENTED."""

    def upload(
        self,
        binding: pb.Binding,
        payload: bytes | Pieces,
        *,
        timeout: float,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        on_part: Callable[[pb.Part], None] | None = None,
    ) -> pb.Receipt:
        """Upload ``payload`` (whole or in pieces) for ``binding``; ``on_part`` sees each part as it goes."""

        def parts() -> Iterator[pb.Part]:
            for part in payload_parts(binding, payload, chunk_bytes):
                if on_part is not None:
                    on_part(part)
                yield part

        receipt: pb.Receipt
        if payload_size(payload) <= chunk_bytes and self.sends:
            [part] = parts()
            try:
                receipt = self.stub.Send(part, timeout=timeout)
                return receipt
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
            self.sends = False
            receipt = self.stub.Submit(iter([part]), timeout=timeout)
        else:
            receipt = self.stub.Submit(parts(), timeout=timeout)
        return receipt


INLINE_INPUT_BYTES = 256 << 10
"""Largest stage input a Task carries itself (well inside one gRPC message); larger ones are fetched."""


def task_with_input(task: pb.Task, payload: bytes | Pieces) -> pb.Task:
    """``task`` announcing ``payload`` (whole, or in pieces) as its stage's input, which it carries when small.

    Small inputs ride with the task, so a collaborator skips one Fetch round trip per stage,
    which in a busy aggregator waits for its threads as long as the stage's own work.
    """
    size = payload_size(payload)
    task.input_size = size
    if size <= INLINE_INPUT_BYTES:
        task.input = payload if isinstance(payload, bytes) else b"".join(payload)
    return task


def inline_input(task: pb.Task) -> bytes | None:
    """The input ``task`` carries, or None when it must be fetched.

    Raises :class:`WireError` if a carried input contradicts the announced size or the limit.
    """
    if not task.HasField("input"):
        return None
    if len(task.input) != task.input_size or len(task.input) > INLINE_INPUT_BYTES:
        raise WireError(
            f"a task carries {len(task.input)} input bytes but announces {task.input_size} "
            f"(at most {INLINE_INPUT_BYTES} may ride with a task)"
        )
    return task.input


def payload_parts(
    binding: pb.Binding, data: bytes | Pieces, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[pb.Part]:
    """An opaque stage payload as a stream of Part messages bound to ``binding``."""
    for chunk in split(data, chunk_bytes):
        yield pb.Part(binding=binding, chunk=chunk)


def read_payload(
    parts: Iterable[pb.Part],
    *,
    max_total_bytes: int,
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    binding: pb.Binding | None = None,
    on_binding: Callable[[pb.Binding], None] | None = None,
) -> tuple[pb.Binding, bytes]:
    """Reassemble an opaque payload; every part must carry the same binding.

    ``binding`` (if given) is the one expected; otherwise the first part's binding is
    adopted. ``on_binding`` sees that binding before any data is buffered, so a
    server can refuse a late or replayed upload (by raising) without reading it.
    """
    assembler = Reassembler(max_total_bytes, max_chunk_bytes)
    bound = assemble(parts, assembler, binding, on_binding)
    return bound, assembler.result()


def assemble(
    parts: Iterable[pb.Part],
    assembler: Reassembler,
    binding: pb.Binding | None = None,
    on_binding: Callable[[pb.Binding], None] | None = None,
) -> pb.Binding:
    """Add every part's chunk to `assembler`; the parts' one binding (see :func:`read_payload`)."""
    bound = binding
    first = True
    for part in parts:
        if first:
            first = False
            if bound is None:
                bound = part.binding
            if on_binding is not None:
                on_binding(bound)
        if part.binding != bound:
            raise WireError("a payload part is bound to another federation, round or stage")
        assembler.add(part.chunk)
    if bound is None:
        raise WireError("the payload stream was empty")
    assembler.finish()
    return bound
