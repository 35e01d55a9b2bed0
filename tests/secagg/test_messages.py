"""Messages: canonical round-trips, refusal of malformed bytes, and what the session id binds."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from fedfair.core.errors import ConfigError
from fedfair.secagg.codec import Writer
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig
from fedfair.secagg.errors import PrivacyWarning, ProtocolError
from fedfair.secagg.messages import (
    MAGIC,
    AdvertiseKeys,
    EncryptedShares,
    Header,
    KeyDirectory,
    MaskedInput,
    RevealedShare,
    ShareBundle,
    ShareKeys,
    Stage,
    UnmaskRequest,
    UnmaskResponse,
    advertisement_payload,
    decode,
    session_id,
)

ENCODING = EncodingConfig(clip=1.0, max_weight=10.0, fractional_bits=16)
SESSION = bytes(range(32))


def config(**changes: object) -> SecAggConfig:
    fields = {"federation_id": "fed", "round": 2, "parties": ("a", "b", "c", "d"), "dimension": 5, "encoding": ENCODING}
    fields.update(changes)
    return SecAggConfig(**fields)  # type: ignore[arg-type]


def header(stage: Stage, session: bytes = SESSION) -> Header:
    return Header("fed", 2, stage, session)


ADVERTISEMENT = AdvertiseKeys(header(Stage.ADVERTISE, b""), 3, b"c" * 32, b"m" * 32, b"credential", b"signature")
MESSAGES = [
    ADVERTISEMENT,
    KeyDirectory(header(Stage.ADVERTISE, b""), (ADVERTISEMENT, dataclasses.replace(ADVERTISEMENT, sender=1))),
    ShareKeys(header(Stage.SHARE), 3, (EncryptedShares(3, 1, b"x" * 60), EncryptedShares(3, 2, b"y" * 60))),
    ShareBundle(header(Stage.SHARE), 2, (EncryptedShares(3, 2, b"y" * 60),)),
    UnmaskRequest(header(Stage.UNMASK), (1, 2, 4), (3,)),
    UnmaskResponse(
        header(Stage.UNMASK), 2, (RevealedShare(1, b"s1"), RevealedShare(4, b"s4")), (RevealedShare(3, b"k3"),)
    ),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda message: type(message).__name__)
def test_messages_round_trip(message: object) -> None:
    data = message.to_bytes()  # type: ignore[attr-defined]
    assert decode(data) == message
    assert type(message).from_bytes(data) == message  # type: ignore[attr-defined]


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_masked_input_round_trips_without_copying(dtype: type) -> None:
    vector = np.array([0, 1, 2**31 + 5, np.iinfo(dtype).max], dtype=dtype)
    message = MaskedInput(header(Stage.MASK), 4, vector)
    parsed = MaskedInput.from_bytes(message.to_bytes())
    assert (parsed.header, parsed.sender) == (message.header, 4)
    np.testing.assert_array_equal(parsed.vector, vector)
    assert parsed.vector.dtype.itemsize == np.dtype(dtype).itemsize


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


def test_config_digest_changes_with_every_parameter() -> None:
    base = config().digest
    variants = [
        config(federation_id="other"),
        config(round=3),
        config(parties=("a", "b", "c", "e")),
        config(parties=("b", "a", "c", "d")),
        config(dimension=6),
        config(threshold=4),
        config(encoding=dataclasses.replace(ENCODING, fractional_bits=15)),
        config(encoding=dataclasses.replace(ENCODING, modulus_bits=64)),
        config(encoding=dataclasses.replace(ENCODING, clip=2.0)),
    ]
    digests = {variant.digest for variant in variants}
    assert base not in digests
    assert len(digests) == len(variants)
    assert config().digest == base


def test_session_id_binds_the_round_and_every_advertised_key() -> None:
    digest = config().digest
    others = (dataclasses.replace(ADVERTISEMENT, sender=1, mask_public_key=b"n" * 32),)
    base = session_id(digest, (ADVERTISEMENT, *others))
    assert session_id(digest, (*others, ADVERTISEMENT)) == base  # order of arrival does not matter
    assert session_id(config(round=3).digest, (ADVERTISEMENT, *others)) != base
    assert session_id(digest, (dataclasses.replace(ADVERTISEMENT, cipher_public_key=b"C" * 32), *others)) != base
    assert session_id(digest, (ADVERTISEMENT,)) != base
    assert advertisement_payload(digest, 3, b"c" * 32, b"m" * 32) != advertisement_payload(
        config(round=3).digest, 3, b"c" * 32, b"m" * 32
    )


def test_default_threshold_is_a_strict_majority_of_holders() -> None:
    for parties in (3, 5, 10):
        names = tuple(f"p{i}" for i in range(parties))
        assert config(parties=names).t == parties // 2 + 1
    graph_config = config(parties=tuple(f"p{i}" for i in range(10)), neighbours=4)
    assert graph_config.holders_per_secret == 5
    assert graph_config.t == 3
    assert config(neighbours=3).complete  # 3 neighbours of 4 parties is everyone


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"threshold": 2}, "threshold"),
        ({"threshold": 5}, "threshold"),
        ({"parties": ("a",)}, "at least 2 parties"),
        ({"parties": ("a", "a", "b")}, "unique"),
        ({"federation_id": ""}, "federation_id"),
        ({"round": -1}, "round"),
        ({"dimension": 0}, "dimension"),
        ({"neighbours": 0}, "neighbours"),
        ({"parties": tuple("abcde"), "neighbours": 3}, "even number of neighbours"),
        ({"encoding": EncodingConfig(1.0, 10.0, 30)}, "wrap around"),
    ],
)
def test_bad_configs_are_refused_in_one_line(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        config(**changes)
    assert "\n" not in str(raised.value)


def test_two_parties_warn() -> None:
    with pytest.warns(PrivacyWarning, match="infer the other's input"):
        config(parties=("a", "b"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config(parties=("a", "b", "c"))
