"""A site's SHARE upload: sealed to the auditor for one round, signed by the site, refused when misused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedfair.core.errors import AuthenticationError, ConfigError, ProtocolError
from fedfair.pki import identity
from fedfair.secagg import keys
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.shares import LeaderShare, seed_parts
from fedfair.secagg.bounded.upload import LeaderUpload, SealedSeed, leader_digest, open_seed, statement
from tests.secagg.bounded.roundkit import new_round, vector_at


def encoded(context: BoundedContext, party: int, seed: int = 0) -> np.ndarray:
    """An honest encoded update at half the party's bound."""
    bound = np.sqrt(context.bounds[party])
    return np.round(vector_at(0.5 * bound, context.dimension, seed)).astype(np.int64)


def test_the_parts_survive_their_bytes_and_the_auditor_opens_its_seed() -> None:
    game = new_round({0: 1.0})
    leader_part, helper_part = game.upload(0, encoded(game.context, 0))
    again = LeaderUpload.from_bytes(leader_part.to_bytes())
    assert again.to_bytes() == leader_part.to_bytes()
    sealed = SealedSeed.from_bytes(helper_part.to_bytes())
    share = open_seed(game.context, sealed, game.auditor_cipher, game.site_keys[0].public_key())
    assert seed_parts(share.seed) == leader_part.share.peer_parts  # the seed the aggregator was told of
    with pytest.raises(ProtocolError, match="malformed"):
        LeaderUpload.from_bytes(leader_part.to_bytes()[:-1])


def test_a_seed_opens_only_for_its_round_and_its_party() -> None:
    game = new_round({0: 1.0, 1: 1.0})
    _, helper_part = game.upload(0, encoded(game.context, 0))
    other_round = dataclasses.replace(game.context, round=game.context.round + 1)
    with pytest.raises(AuthenticationError, match="fail authentication"):
        open_seed(other_round, helper_part, game.auditor_cipher, game.site_keys[0].public_key())
    with pytest.raises(AuthenticationError, match="fail authentication"):
        open_seed(
            game.context, dataclasses.replace(helper_part, party=1), game.auditor_cipher, game.site_keys[1].public_key()
        )
    with pytest.raises(AuthenticationError, match="fail authentication"):
        open_seed(game.context, helper_part, keys.generate_key_pair(), game.site_keys[0].public_key())


def test_a_verifier_refuses_unsigned_misrouted_repeated_and_late_parts() -> None:
    game = new_round({0: 1.0, 1: 1.0})
    leader_part, helper_part = game.upload(0, encoded(game.context, 0))
    forged = dataclasses.replace(leader_part, signature=game.upload(1, encoded(game.context, 1))[0].signature)
    with pytest.raises(AuthenticationError, match="not signed by it for this round"):
        game.leader.receive_upload(forged)
    wrong_digest = dataclasses.replace(helper_part, leader_digest=bytes(32))
    with pytest.raises(AuthenticationError, match="upload to the auditor is not signed by it"):
        game.helper.receive_upload(wrong_digest)
    with pytest.raises(ProtocolError, match="other verifier's part"):
        game.leader.receive_upload(helper_part)
    game.leader.receive_upload(leader_part)
    with pytest.raises(ProtocolError, match="twice"):
        game.leader.receive_upload(leader_part)
    with pytest.raises(ProtocolError, match="party 7 is not in this round"):
        game.leader.receive_upload(dataclasses.replace(leader_part, party=7))
    game.leader.close_uploads()
    with pytest.raises(ProtocolError, match="arrived after the aggregator closed the uploads"):
        game.leader.receive_upload(leader_part)


def test_a_signed_share_of_the_wrong_shape_is_refused_at_upload_not_at_verify() -> None:
    game = new_round({0: 1.0})
    small = new_round({0: 1.0}, dimension=game.context.dimension - 1)
    short = small.upload(0, encoded(small.context, 0))[0]
    # Signed by party 0 for this round, with the share of a smaller layout: the site's own signature binds it.
    digest = leader_digest(short.share)
    signature = identity.sign(game.site_keys[0], statement(game.context, 0, digest, short.helper_digest))
    with pytest.raises(ProtocolError, match="does not match its layout"):
        game.leader.receive_upload(dataclasses.replace(short, signature=signature))
    layout = game.context.layout(0)
    inputs, values = np.full(layout.input_length, field.P, np.uint64), np.zeros(layout.polynomial_values, np.uint64)
    outside = LeaderShare(inputs, short.share.wire_seed, values, short.share.blind, short.share.peer_parts)
    signature = identity.sign(
        game.site_keys[0], statement(game.context, 0, leader_digest(outside), short.helper_digest)
    )
    with pytest.raises(ProtocolError, match="not a field element"):
        game.leader.receive_upload(LeaderUpload(0, outside, short.helper_digest, signature))


def test_a_site_cannot_upload_over_its_bound_honestly() -> None:
    game = new_round({0: 1.0})
    with pytest.raises(ConfigError, match="exceeds its bound"):
        game.upload(0, 3 * encoded(game.context, 0))
