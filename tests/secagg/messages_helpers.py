"""Message fixtures the message, wire and payload tests share: a round's config, headers, one advertisement."""

from __future__ import annotations

from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig
from fedfair.secagg.security import SecurityParameters
from fedfair.secagg.messages import AdvertiseKeys
from fedfair.secagg.wire import Header, Stage

ENCODING = EncodingConfig(clip=1.0, max_weight=10.0, fractional_bits=16)
SESSION = bytes(range(32))


def config(**changes: object) -> SecAggConfig:
    fields = {"federation_id": "fed", "round": 2, "parties": ("a", "b", "c", "d"), "dimension": 5, "encoding": ENCODING}
    # The security parameters by name too, gathered into the one value a config takes.
    bounds = {key: changes.pop(key) for key in ("max_colluding", "threshold", "neighbours") if key in changes}
    fields.update(changes, security=SecurityParameters(**bounds))  # type: ignore[arg-type]
    return SecAggConfig(**fields)  # type: ignore[arg-type]


def header(stage: Stage, session: bytes = SESSION) -> Header:
    return Header("fed", 2, stage, session)


ADVERTISEMENT = AdvertiseKeys(
    header(Stage.ADVERTISE, b""), 3, b"c" * 32, b"m" * 32, b"h" * 32, b"credential", b"signature"
)
