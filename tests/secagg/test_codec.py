"""The canonical codec: fields round-trip as fixed-width bytes; truncated, trailing or non-UTF-8 input is refused."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ProtocolError
from fedfair.secagg.codec import Reader, Writer

Field = tuple[str, object]
"""(kind, value): one field as a Writer method name and its value."""

FIELDS: st.SearchStrategy[Field] = st.one_of(
    st.tuples(st.just("u8"), st.integers(0, 2**8 - 1)),
    st.tuples(st.just("u32"), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("u64"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("f64"), st.floats(allow_nan=False)),
    st.tuples(st.just("blob"), st.binary(max_size=40)),
    st.tuples(st.just("text"), st.text(max_size=20)),
)


def write(fields: list[Field]) -> bytes:
    writer = Writer()
    for kind, value in fields:
        getattr(writer, kind)(value)
    return writer.getvalue()


def read(data: bytes, fields: list[Field]) -> list[object]:
    reader = Reader(data)
    values = [getattr(reader, kind)() for kind, _ in fields]
    reader.finish()
    return values


@settings(max_examples=150, deadline=None)
@given(st.lists(FIELDS, max_size=8))
def test_any_sequence_of_fields_reads_back_as_written_and_consumes_every_byte(fields: list[Field]) -> None:
    assert read(write(fields), fields) == [value for _, value in fields]


@settings(max_examples=60, deadline=None)
@given(st.lists(FIELDS, min_size=1, max_size=6))
def test_every_proper_prefix_of_an_encoding_is_refused_as_truncated(fields: list[Field]) -> None:
    data = write(fields)
    for end in range(len(data)):
        with pytest.raises(ProtocolError, match="malformed message: truncated"):
            read(data[:end], fields)


@settings(max_examples=60, deadline=None)
@given(st.lists(FIELDS, max_size=6), st.binary(min_size=1, max_size=9))
def test_any_bytes_after_the_last_field_are_refused_as_trailing(fields: list[Field], extra: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed message: trailing bytes"):
        read(write(fields) + extra, fields)


def test_integers_are_fixed_width_big_endian_at_both_ends_of_their_range() -> None:
    assert Writer().u8(0).u8(255).getvalue() == b"\x00\xff"
    assert Writer().u32(1).getvalue() == b"\x00\x00\x00\x01"
    assert Writer().u32(2**32 - 1).getvalue() == b"\xff" * 4
    assert Writer().u64(2**64 - 1).getvalue() == b"\xff" * 8
    assert Writer().u64(0x0102030405060708).getvalue() == bytes(range(1, 9))


def test_integers_out_of_their_width_are_refused_rather_than_wrapped() -> None:
    for kind, value in (("u8", 256), ("u32", 2**32), ("u64", 2**64), ("u32", -1)):
        with pytest.raises(struct.error):
            getattr(Writer(), kind)(value)


def test_doubles_keep_their_sign_infinities_and_nan_bit_for_bit() -> None:
    values = [0.0, -0.0, math.inf, -math.inf, 5e-324, 1.7976931348623157e308]
    data = Writer()
    for value in values:
        data.f64(value)
    reader = Reader(data.getvalue())
    back = [reader.f64() for _ in values]
    assert [struct.pack(">d", value) for value in back] == [struct.pack(">d", value) for value in values]
    assert Writer().f64(-0.0).getvalue() != Writer().f64(0.0).getvalue()  # one value, one encoding
    assert math.isnan(Reader(Writer().f64(math.nan).getvalue()).f64())


def test_a_blob_is_prefixed_with_its_length_in_bytes_even_from_a_view_of_wider_words() -> None:
    words = np.arange(3, dtype=np.uint32)
    data = Writer().blob(words.data).getvalue()
    assert data[:8] == struct.pack(">Q", 12)  # 12 bytes, not 3 elements
    assert data[8:] == words.tobytes()
    reader = Reader(data)
    assert reader.blob() == words.tobytes()
    reader.finish()


def test_a_blob_view_reads_the_same_bytes_as_blob_without_copying_them() -> None:
    data = Writer().blob(b"abcdef").u8(7).getvalue()
    reader = Reader(data)
    view = reader.blob_view()
    assert bytes(view) == b"abcdef" and view.obj is data
    assert reader.u8() == 7
    reader.finish()


def test_a_length_prefix_beyond_the_input_is_refused_not_allocated() -> None:
    for length in (7, 2**64 - 1):
        data = struct.pack(">Q", length) + b"abc"
        with pytest.raises(ProtocolError, match="truncated"):
            Reader(data).blob()
        with pytest.raises(ProtocolError, match="truncated"):
            Reader(data).blob_view()


def test_text_is_utf8_and_other_bytes_are_refused_as_text() -> None:
    assert Writer().text("é").getvalue() == struct.pack(">Q", 2) + "é".encode()
    invalid = Writer().blob(b"\xff\xfe").getvalue()
    assert Reader(invalid).blob() == b"\xff\xfe"  # fine as bytes
    with pytest.raises(ProtocolError, match="text field is not UTF-8"):
        Reader(invalid).text()


def test_an_empty_input_is_complete_and_refuses_any_read() -> None:
    Reader(b"").finish()
    for kind in ("u8", "u32", "u64", "f64", "blob", "text"):
        with pytest.raises(ProtocolError, match="truncated"):
            getattr(Reader(b""), kind)()
