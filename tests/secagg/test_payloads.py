"""What the parties sign: every field and the purpose of each payload bound, and the session id."""

from __future__ import annotations

import dataclasses

from fedfair.secagg.payloads import (
    advertisement_payload,
    consistency_payload,
    dealing_line,
    dealing_payload,
    seed_commitment,
    session_id,
    share_check_payload,
    share_commitment,
)
from fedfair.secagg.messages import EncryptedShares
from tests.secagg.messages_helpers import ADVERTISEMENT, SESSION, config


def test_signed_payloads_bind_every_field_and_their_purpose() -> None:
    session = SESSION
    payloads = [
        dealing_payload(session, 1, (2, 3), b"a" * 64),
        dealing_payload(session, 1, (2, 4), b"a" * 64),
        dealing_payload(session, 2, (2, 3), b"a" * 64),
        dealing_payload(session, 1, (2, 3), b"b" * 64),
        dealing_payload(b"other" * 6, 1, (2, 3), b"a" * 64),
        share_check_payload(session, 1, ()),
        share_check_payload(session, 1, (2,)),
        share_check_payload(session, 2, (2,)),
        consistency_payload(session, (1, 2, 3), (1, 2, 3), (b"a" * 32, b"b" * 32, b"c" * 32)),
        consistency_payload(session, (1, 2, 3), (1, 2, 3), (b"a" * 32, b"b" * 32, b"d" * 32)),
        consistency_payload(session, (1, 2, 3), (1, 2), (b"a" * 32, b"b" * 32)),
        consistency_payload(session, (1, 2), (1, 2), (b"a" * 32, b"b" * 32)),
        advertisement_payload(session, 1, b"c" * 32, b"m" * 32, b"h" * 32),
        advertisement_payload(session, 1, b"c" * 32, b"m" * 32, b"i" * 32),
    ]
    assert len(set(payloads)) == len(payloads)
    digest = config().digest
    assert seed_commitment(digest, 1, b"s" * 32) != seed_commitment(digest, 2, b"s" * 32)
    assert seed_commitment(digest, 1, b"s" * 32) != seed_commitment(config(round=3).digest, 1, b"s" * 32)
    assert len(seed_commitment(digest, 1, b"s" * 32)) == 32


def test_a_dealing_line_binds_its_dealer_holder_ciphertext_and_both_commitments() -> None:
    line = EncryptedShares(1, 2, b"ct", b"s" * 32, b"k" * 32)
    lines = {
        dealing_line(SESSION, 1, line),
        dealing_line(SESSION, 3, line),
        dealing_line(b"other" * 6, 1, line),
        dealing_line(SESSION, 1, dataclasses.replace(line, recipient=3)),
        dealing_line(SESSION, 1, dataclasses.replace(line, ciphertext=b"cu")),
        dealing_line(SESSION, 1, dataclasses.replace(line, seed_commitment=b"k" * 32, key_commitment=b"s" * 32)),
    }
    assert len(lines) == 6
    assert share_commitment(SESSION, 1, 2, "SEED", b"x") != share_commitment(SESSION, 1, 2, "MASK_KEY", b"x")


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
