"""Key agreement, HKDF and share encryption against published vectors and tampering."""

from __future__ import annotations

import pytest

from fedfair.core.errors import AuthenticationError
from fedfair.secagg import keys

SESSION = b"s" * 32


def test_x25519_rfc7748_vector() -> None:
    alice = keys.load_private(bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"))
    bob = keys.load_private(bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"))
    assert keys.public_bytes(alice).hex() == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    assert keys.public_bytes(bob).hex() == "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
    shared = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"
    assert keys.agree(alice, keys.public_bytes(bob)).hex() == shared
    assert keys.agree(bob, keys.public_bytes(alice)).hex() == shared


def test_hkdf_rfc5869_case_1() -> None:
    okm = keys.hkdf(b"\x0b" * 22, bytes(range(13)), bytes(range(0xF0, 0xFA)))
    # The first 32 bytes of the 42-byte OKM of RFC 5869 test case 1.
    assert okm.hex() == "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"


def test_low_order_and_malformed_public_keys_are_refused() -> None:
    with pytest.raises(AuthenticationError):
        keys.agree(keys.generate_key_pair(), bytes(32))
    with pytest.raises(AuthenticationError):
        keys.agree(keys.generate_key_pair(), bytes(31))


def test_private_key_round_trips_through_raw_bytes() -> None:
    key = keys.generate_key_pair()
    assert keys.public_bytes(keys.load_private(keys.private_bytes(key))) == keys.public_bytes(key)


def test_derived_keys_separate_purposes_sessions_and_pairs() -> None:
    a, b = keys.generate_key_pair(), keys.generate_key_pair()
    secret = keys.agree(a, keys.public_bytes(b))
    assert secret == keys.agree(b, keys.public_bytes(a))
    share_ab = keys.share_encryption_key(secret, SESSION, 1, 2)
    assert share_ab == keys.share_encryption_key(secret, SESSION, 2, 1)
    assert share_ab != keys.pair_mask_key(secret, SESSION, 1, 2)
    assert share_ab != keys.share_encryption_key(secret, b"t" * 32, 1, 2)
    assert share_ab != keys.share_encryption_key(secret, SESSION, 1, 3)
    assert keys.self_mask_key(b"seed" * 8, SESSION, 1) != keys.self_mask_key(b"seed" * 8, SESSION, 2)


def test_sealed_shares_open_only_with_the_same_key_and_binding() -> None:
    key = keys.hkdf(b"secret", SESSION, b"test")
    bound = keys.share_associated_data(SESSION, 1, 2)
    sealed = keys.seal(key, b"shares", bound)
    assert keys.open_sealed(key, sealed, bound) == b"shares"
    assert keys.seal(key, b"shares", bound) != sealed  # fresh nonce every time
    for wrong in (
        keys.share_associated_data(b"t" * 32, 1, 2),  # another session
        keys.share_associated_data(SESSION, 2, 1),  # reversed direction
        keys.share_associated_data(SESSION, 1, 3),  # another recipient
    ):
        with pytest.raises(AuthenticationError):
            keys.open_sealed(key, sealed, wrong)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(AuthenticationError):
        keys.open_sealed(key, tampered, bound)
    with pytest.raises(AuthenticationError):
        keys.open_sealed(keys.hkdf(b"other", SESSION, b"test"), sealed, bound)
    with pytest.raises(AuthenticationError, match="truncated"):
        keys.open_sealed(key, sealed[:20], bound)
