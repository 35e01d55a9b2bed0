"""Messages: canonical round-trips, refusal of malformed bytes, and what the session id and the signed
payloads bind."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.secagg.codec import Writer
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig
from fedfair.secagg.errors import ProtocolError
from fedfair.secagg.messages import (
    MAGIC,
    AdvertiseKeys,
    ConsistencySignature,
    EncryptedShares,
    Header,
    KeyDirectory,
    MaskedInput,
    MaskingSet,
    Message,
    RevealedShare,
    ShareBundle,
    ShareCheck,
    ShareKeys,
    Stage,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
    advertisement_payload,
    check_ids,
    consistency_payload,
    dealt_shares_payload,
    decode,
    seed_commitment,
    session_id,
    share_check_payload,
    share_entry_payload,
)

ENCODING = EncodingConfig(clip=1.0, max_weight=10.0, fractional_bits=16)
SESSION = bytes(range(32))


def config(**changes: object) -> SecAggConfig:
    fields = {"federation_id": "fed", "round": 2, "parties": ("a", "b", "c", "d"), "dimension": 5, "encoding": ENCODING}
    fields.update(changes)
    return SecAggConfig(**fields)  # type: ignore[arg-type]


def header(stage: Stage, session: bytes = SESSION) -> Header:
    return Header("fed", 2, stage, session)


ADVERTISEMENT = AdvertiseKeys(
    header(Stage.ADVERTISE, b""), 3, b"c" * 32, b"m" * 32, b"h" * 32, b"credential", b"signature"
)
MESSAGES: list[Message] = [
    ADVERTISEMENT,
    KeyDirectory(header(Stage.ADVERTISE, b""), (ADVERTISEMENT, dataclasses.replace(ADVERTISEMENT, sender=1))),
    ShareKeys(
        header(Stage.SHARE), 3, (EncryptedShares(3, 1, b"x" * 60, b"sig1"), EncryptedShares(3, 2, b"y" * 60, b"sig2"))
    ),
    ShareBundle(header(Stage.SHARE), 2, (EncryptedShares(3, 2, b"y" * 60, b"sig2"),)),
    ShareCheck(header(Stage.CHECK), 2, (1, 4), b"check-signature"),
    ShareCheck(header(Stage.CHECK), 2, (), b"check-signature"),
    MaskingSet(header(Stage.MASK), (1, 2, 3, 4)),
    SurvivorSet(header(Stage.CONSISTENCY), (1, 2, 3, 4), (1, 2, 4)),
    ConsistencySignature(header(Stage.CONSISTENCY), 4, b"view-signature"),
    UnmaskRequest(header(Stage.UNMASK), (1, 2, 4), (3,), ((1, b"sig-1"), (4, b"sig-4"))),
    UnmaskResponse(
        header(Stage.UNMASK),
        2,
        (RevealedShare(1, b"s1", b"d" * 32, b"dealer-1"), RevealedShare(4, b"s4", b"e" * 32, b"dealer-4")),
        (RevealedShare(3, b"k3", b"f" * 32, b"dealer-3"),),
    ),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda message: type(message).__name__)
def test_messages_round_trip(message: object) -> None:
    data = message.to_bytes()  # type: ignore[attr-defined]
    assert data.startswith(Writer().blob(b"FSA2").getvalue())
    assert decode(data) == message
    assert type(message).from_bytes(data) == message  # type: ignore[attr-defined]


def test_every_message_type_has_its_own_type_byte() -> None:
    type_bytes = {type(message): message.TYPE for message in MESSAGES} | {MaskedInput: MaskedInput.TYPE}
    assert len(type_bytes) == 11
    assert len(set(type_bytes.values())) == 11
    assert [stage.name for stage in Stage] == ["ADVERTISE", "SHARE", "CHECK", "MASK", "CONSISTENCY", "UNMASK"]


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
        SurvivorSet(header(Stage.CONSISTENCY), dropped, survivors),
        MaskingSet(header(Stage.MASK), accused),
        ShareCheck(header(Stage.CHECK), 7, accused, b"".join(sig for _, sig in signatures)),
    ]
    for message in messages:
        assert decode(message.to_bytes()) == message


def test_v1_messages_are_refused() -> None:
    data = bytearray(MESSAGES[4].to_bytes())
    data[8:12] = b"FSA1"
    with pytest.raises(ProtocolError, match="not a fedfair secure-aggregation v2 message"):
        decode(bytes(data))


def test_signed_payloads_bind_every_field_and_their_purpose() -> None:
    session = SESSION
    payloads = [
        share_entry_payload(session, 1, 2, b"ct"),
        share_entry_payload(session, 2, 1, b"ct"),
        share_entry_payload(session, 1, 2, b"cu"),
        share_entry_payload(b"other" * 6, 1, 2, b"ct"),
        share_check_payload(session, 1, ()),
        share_check_payload(session, 1, (2,)),
        share_check_payload(session, 2, (2,)),
        consistency_payload(session, (1, 2, 3), (1, 2, 3)),
        consistency_payload(session, (1, 2, 3), (1, 2)),
        consistency_payload(session, (1, 2), (1, 2)),
        dealt_shares_payload(session, 1, 2, b"a" * 32, b"b" * 32),
        dealt_shares_payload(session, 1, 2, b"b" * 32, b"a" * 32),
        dealt_shares_payload(session, 2, 1, b"a" * 32, b"b" * 32),
        advertisement_payload(session, 1, b"c" * 32, b"m" * 32, b"h" * 32),
        advertisement_payload(session, 1, b"c" * 32, b"m" * 32, b"i" * 32),
    ]
    assert len(set(payloads)) == len(payloads)
    digest = config().digest
    assert seed_commitment(digest, 1, b"s" * 32) != seed_commitment(digest, 2, b"s" * 32)
    assert seed_commitment(digest, 1, b"s" * 32) != seed_commitment(config(round=3).digest, 1, b"s" * 32)
    assert len(seed_commitment(digest, 1, b"s" * 32)) == 32


def test_id_lists_must_be_strictly_increasing() -> None:
    check_ids((), "x")
    check_ids((1, 5, 9), "x")
    for bad in ((2, 1), (1, 1), (3, 4, 4)):
        with pytest.raises(ProtocolError, match="twice or out of order"):
            check_ids(bad, "the list")


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_masked_input_round_trips_without_copying(dtype: type) -> None:
    vector = np.array([0, 1, 2**31 + 5, np.iinfo(dtype).max], dtype=dtype)
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


@pytest.mark.parametrize(("bits", "payload", "message"), [(32, b"abc", "whole number of words"), (16, b"ab", "16-bit")])
def test_masked_vectors_of_odd_shape_are_refused(bits: int, payload: bytes, message: str) -> None:
    writer = Writer().blob(MAGIC).u8(MaskedInput.TYPE)
    header(Stage.MASK).write(writer)
    writer.u32(1).u8(bits).blob(payload)
    with pytest.raises(ProtocolError, match=message):
        decode(writer.getvalue())


def test_session_id_binds_the_round_and_every_advertised_key() -> None:
    digest = config().digest
    others = (dataclasses.replace(ADVERTISEMENT, sender=1, mask_public_key=b"n" * 32),)
    base = session_id(digest, (ADVERTISEMENT, *others))
    assert session_id(digest, (*others, ADVERTISEMENT)) == base  # order of arrival does not matter
    assert session_id(config(round=3).digest, (ADVERTISEMENT, *others)) != base
    assert session_id(digest, (dataclasses.replace(ADVERTISEMENT, cipher_public_key=b"C" * 32), *others)) != base
    assert session_id(digest, (dataclasses.replace(ADVERTISEMENT, seed_commitment=b"H" * 32), *others)) != base
    assert session_id(digest, (ADVERTISEMENT,)) != base
    assert advertisement_payload(digest, 3, b"c" * 32, b"m" * 32, b"h" * 32) != advertisement_payload(
        config(round=3).digest, 3, b"c" * 32, b"m" * 32, b"h" * 32
    )


