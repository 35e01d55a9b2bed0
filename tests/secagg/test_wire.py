"""The framing every message shares: the magic, the type byte, the header a message is bound to."""

from __future__ import annotations

import dataclasses

import pytest

from fedfair.core.errors import ProtocolError, StaleMessageError
from fedfair.secagg.messages import AdvertiseKeys, MaskingSet, decode
from fedfair.secagg.wire import Stage, check_header, check_ids
from tests.secagg.messages_helpers import SESSION, config, header


MASKING_SET = MaskingSet(header(Stage.MASK), (1, 2, 3, 4))


def test_from_bytes_refuses_another_message_type_naming_both() -> None:
    with pytest.raises(ProtocolError, match="expected AdvertiseKeys, got MaskingSet"):
        AdvertiseKeys.from_bytes(MASKING_SET.to_bytes())
    assert MaskingSet.from_bytes(MASKING_SET.to_bytes()) == MASKING_SET


def test_an_unknown_type_byte_is_refused() -> None:
    data = bytearray(MASKING_SET.to_bytes())
    data[12] = 200  # after the magic's length prefix (8 bytes) and the magic (4 bytes)
    with pytest.raises(ProtocolError, match="unknown message type 200"):
        decode(bytes(data))


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"federation_id": "other"}, "another federation or round"),
        ({"round": 3}, "another federation or round"),
        ({"stage": Stage.CHECK}, "labelled with stage CHECK"),
        ({"session_id": b"x" * 32}, "another session of this round"),
    ],
)
def test_a_message_bound_elsewhere_is_stale(change: dict[str, object], fragment: str) -> None:
    check_header(MASKING_SET, config(), SESSION)
    moved = dataclasses.replace(MASKING_SET, header=dataclasses.replace(MASKING_SET.header, **change))
    with pytest.raises(StaleMessageError, match=fragment):
        check_header(moved, config(), SESSION)


def test_id_lists_must_be_strictly_increasing() -> None:
    check_ids((), "x")
    check_ids((1, 5, 9), "x")
    for bad in ((2, 1), (1, 1), (3, 4, 4)):
        with pytest.raises(ProtocolError, match="twice or out of order"):
            check_ids(bad, "the list")


def test_v1_messages_are_refused() -> None:
    # And v2's: its share entries and unmask shares carried a signature each, v3 one per dealing.
    for magic in (b"FSA1", b"FSA2"):
        data = bytearray(MASKING_SET.to_bytes())
        data[8:12] = magic
        with pytest.raises(ProtocolError, match="not a fedfair secure-aggregation v3 message"):
            decode(bytes(data))
