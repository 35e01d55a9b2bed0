"""Messages: canonical round-trips, refusal of malformed bytes, and what the session id and the signed
payloads bind."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ProtocolError
from fedfair.secagg.codec import Writer
from fedfair.secagg.messages import (
    ConsistencySignature,
    Dealing,
    EncryptedShares,
    KeyDirectory,
    MaskedInput,
    MaskingSet,
    Message,
    RevealedShare,
    ShareBundle,
    ShareCheck,
    ShareKeys,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
    decode,
)
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from fedfair.secagg.wire import MAGIC, Stage
from tests.secagg.messages_helpers import ADVERTISEMENT, header

ENTRY_1 = EncryptedShares(3, 1, b"x" * 60, b"s" * 32, b"k" * 32)
ENTRY_2 = EncryptedShares(3, 2, b"y" * 60, b"t" * 32, b"l" * 32)
MESSAGES: list[Message] = [
    ADVERTISEMENT,
    KeyDirectory(header(Stage.ADVERTISE, b""), (ADVERTISEMENT, dataclasses.replace(ADVERTISEMENT, sender=1))),
    ShareKeys(header(Stage.SHARE), 3, (ENTRY_1, ENTRY_2), b"dealing-signature"),
    ShareBundle(header(Stage.SHARE), 2, (ENTRY_2,), (Dealing(3, (1, 2), b"l" * 64, b"dealing-signature"),)),
    ShareCheck(header(Stage.CHECK), 2, (1, 4), b"check-signature"),
    ShareCheck(header(Stage.CHECK), 2, (), b"check-signature"),
    MaskingSet(header(Stage.MASK), (1, 2, 3, 4)),
    SurvivorSet(header(Stage.CONSISTENCY), (1, 2, 3, 4), (1, 2, 4), (b"a" * 32, b"b" * 32, b"c" * 32)),
    ConsistencySignature(header(Stage.CONSISTENCY), 4, b"view-signature"),
    UnmaskRequest(header(Stage.UNMASK), (1, 2, 4), (3,), ((1, b"sig-1"), (4, b"sig-4"))),
    UnmaskResponse(
        header(Stage.UNMASK),
        2,
        (RevealedShare(1, b"s1"), RevealedShare(4, b"s4")),
        (RevealedShare(3, b"k3"),),
    ),
    AggregateTag(header(Stage.VERIFY), 2, b"t" * 64, b"tag-signature"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda message: type(message).__name__)
def test_messages_round_trip(message: object) -> None:
    data = message.to_bytes()  # type: ignore[attr-defined]
    assert data.startswith(Writer().blob(b"FSA3").getvalue())
    assert decode(data) == message
    assert type(message).from_bytes(data) == message  # type: ignore[attr-defined]


def test_every_message_type_has_its_own_type_byte() -> None:
    vectors = {MaskedInput: MaskedInput.TYPE, AggregateClaim: AggregateClaim.TYPE, TagSet: TagSet.TYPE}
    type_bytes = {type(message): message.TYPE for message in MESSAGES} | vectors
    assert len(type_bytes) == 14
    assert len(set(type_bytes.values())) == 14
    assert [stage.name for stage in Stage] == ["ADVERTISE", "SHARE", "CHECK", "MASK", "CONSISTENCY", "UNMASK", "VERIFY"]


ids = st.lists(st.integers(1, 2**32 - 1), max_size=8).map(lambda xs: tuple(sorted(set(xs))))
blobs = st.binary(max_size=80)


@settings(max_examples=60, deadline=None)
@given(
    survivors=ids,
    dropped=ids,
    signatures=st.lists(st.tuples(st.integers(1, 2**32 - 1), blobs), max_size=6).map(tuple),
    accused=ids,
)
def test_new_messages_round_trip_for_any_fields(
    survivors: tuple[int, ...],
    dropped: tuple[int, ...],
    signatures: tuple[tuple[int, bytes], ...],
    accused: tuple[int, ...],
) -> None:
    messages: list[Message] = [
        UnmaskRequest(header(Stage.UNMASK), survivors, dropped, signatures),
        SurvivorSet(header(Stage.CONSISTENCY), dropped, survivors, ()),
        MaskingSet(header(Stage.MASK), accused),
        ShareCheck(header(Stage.CHECK), 7, accused, b"".join(sig for _, sig in signatures)),
    ]
    for message in messages:
        assert decode(message.to_bytes()) == message


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_masked_input_round_trips_without_copying(dtype: type) -> None:
    vector: np.ndarray = np.array([0, 1, np.iinfo(dtype).max // 2 + 5, np.iinfo(dtype).max], dtype=dtype)
    message = MaskedInput(header(Stage.MASK), 4, vector)
    parsed = MaskedInput.from_bytes(message.to_bytes())
    assert (parsed.header, parsed.sender) == (message.header, 4)
    np.testing.assert_array_equal(parsed.vector, vector)
    assert parsed.vector.dtype.itemsize == np.dtype(dtype).itemsize
    # The words go out little-endian whatever the array's own byte order (the vector is written
    # from a view of the array, not a copy, so the conversion is the writer's to make).
    assert message.to_bytes().endswith(vector.astype(np.dtype(dtype).newbyteorder("<")).tobytes())
    big_endian = MaskedInput(header(Stage.MASK), 4, vector.astype(np.dtype(dtype).newbyteorder(">")))
    assert big_endian.to_bytes() == message.to_bytes()


def test_malformed_bytes_are_refused() -> None:
    data = MESSAGES[2].to_bytes()
    for bad in (data[:-1], data + b"\0", b"nonsense", b""):
        with pytest.raises(ProtocolError, match="malformed"):
            decode(bad)
    with pytest.raises(ProtocolError, match="expected ShareBundle"):
        ShareBundle.from_bytes(data)
    wrong_stage = bytearray(ADVERTISEMENT.to_bytes())
    stage_offset = 8 + 4 + 1 + 8 + 3 + 8  # magic blob, type, federation blob, round
    assert wrong_stage[stage_offset] == Stage.ADVERTISE
    wrong_stage[stage_offset] = 9
    with pytest.raises(ProtocolError, match="unknown stage"):
        decode(bytes(wrong_stage))


@pytest.mark.parametrize(
    ("bits", "payload", "message"),
    [(32, b"abc", "whole number of words"), (16, b"abc", "whole number of words"), (8, b"ab", "8-bit")],
)
def test_masked_vectors_of_odd_shape_are_refused(bits: int, payload: bytes, message: str) -> None:
    writer = Writer().blob(MAGIC).u8(MaskedInput.TYPE)
    header(Stage.MASK).write(writer)
    writer.u32(1).u8(bits).blob(payload)
    with pytest.raises(ProtocolError, match=message):
        decode(writer.getvalue())


def test_share_messages_refuse_digests_of_the_wrong_length_and_overlong_signatures() -> None:
    """Commitments and line digests are exactly 32 bytes each and a signature at most 72: anything else is
    malformed before any check runs."""
    bundle = MESSAGES[3]
    assert isinstance(bundle, ShareBundle)
    bad: list[Message] = [
        ShareKeys(header(Stage.SHARE), 3, (dataclasses.replace(ENTRY_1, seed_commitment=b"s" * 31),), b"sig"),
        ShareKeys(header(Stage.SHARE), 3, (dataclasses.replace(ENTRY_1, key_commitment=b"k" * 33),), b"sig"),
        ShareKeys(header(Stage.SHARE), 3, (ENTRY_1,), b"s" * 73),
        dataclasses.replace(bundle, dealings=(dataclasses.replace(bundle.dealings[0], lines=b"l" * 63),)),
        dataclasses.replace(bundle, dealings=(dataclasses.replace(bundle.dealings[0], holders=(1, 2, 4)),)),
        dataclasses.replace(bundle, dealings=(dataclasses.replace(bundle.dealings[0], signature=b"s" * 73),)),
    ]
    for message in bad:
        with pytest.raises(ProtocolError, match="malformed"):
            decode(message.to_bytes())


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_an_aggregate_claim_round_trips_its_words(dtype: type) -> None:
    words = np.array([0, 1, 2**15 + 3], dtype=dtype)
    claim = AggregateClaim(header(Stage.VERIFY), words, (words,), ((1, b"s" * 32),), (), ((1, b"a"), (3, b"b" * 72)))
    parsed = AggregateClaim.from_bytes(claim.to_bytes())
    assert parsed.header == claim.header and parsed.vector.dtype.itemsize == np.dtype(dtype).itemsize
    np.testing.assert_array_equal(parsed.vector, claim.vector)
    assert (parsed.seeds, parsed.mask_keys, parsed.signatures) == (claim.seeds, claim.mask_keys, claim.signatures)
    with pytest.raises(ProtocolError):
        AggregateClaim.from_bytes(dataclasses.replace(claim, signatures=((1, b"s" * 73),)).to_bytes())


def test_a_tag_with_an_overlong_tags_field_or_signature_is_refused() -> None:
    with pytest.raises(ProtocolError):
        AggregateTag.from_bytes(AggregateTag(header(Stage.VERIFY), 2, b"t" * 65, b"s").to_bytes())
    with pytest.raises(ProtocolError):
        AggregateTag.from_bytes(AggregateTag(header(Stage.VERIFY), 2, b"t" * 64, b"s" * 73).to_bytes())
