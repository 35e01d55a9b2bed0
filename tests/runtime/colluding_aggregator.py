"""An aggregator colluding with one site above the re-sum bound: ``python colluding_aggregator.py PLAN ROUND KEY``.

It runs the real aggregator (``fedfair aggregator start --plan PLAN``) with RESUMMED_WORDS patched to 0 words, so
every sum is above the bound and, as the plan allows a colluder, re-checked. Training round ROUND's unmasked sum has
a word moved by 2^12 (within every bound the aggregator checks), its own check of the tags is skipped, and the
colluding site's tag (site-c, whose identity key KEY it was handed) is replaced, before the tags are relayed, by one
that covers the change: its tags moved by <r, S' - S>, so the tags sum to the forged sum's as the tag check alone
would accept (issue 79), and its first re-checked value moved by the same, so the reported values sum to the forged
sum's too. ROUND 0 forges nothing: an honest aggregator above the bound. Used by tests/runtime/test_rechecked_sums.py.
"""

from __future__ import annotations

import sys

from fedfair.secagg import config

config.RESUMMED_WORDS = 0  # before any round is made: every sum is above the bound

from fedfair.cli import main  # noqa: E402 -- after the patch above
from fedfair.pki.identity import sign  # noqa: E402
from fedfair.pki.store import load_private_key  # noqa: E402
from fedfair.runtime.contract import TRAINING, session_round  # noqa: E402
from fedfair.secagg.server import AggregateResult, Server  # noqa: E402
from fedfair.secagg.verify import Challenge, decode_tags, encode_tags, tag_payload  # noqa: E402
from fedfair.secagg.verify_messages import AggregateTag, TagSet  # noqa: E402

COLLUDER = 3
"""site-c's party id, of site-a, site-b and site-c."""
ERROR = 1 << 12
"""What the forged sum adds to its first word."""


def collude(round_number: int, key_path: str) -> None:
    """Rewrite :class:`Server` so round `round_number`'s sum is forged and site-c's tag covers it."""
    finish, tag_set, tags_add_up = Server.finish, Server.tag_set, Server.tags_add_up
    session = session_round(round_number, TRAINING)
    key = load_private_key(key_path)

    def forged_finish(server: Server) -> AggregateResult:
        if server.config.round == session:
            server.running_sum[0] += server.running_sum.dtype.type(ERROR)
        return finish(server)

    def covered_tag_set(server: Server) -> TagSet:
        if server.config.round == session and COLLUDER in server._tags:
            forged = server.running_sum
            true = forged.copy()
            true[0] -= true.dtype.type(ERROR)
            challenge = Challenge(server.session_id, server._digest, forged.size)
            shift = [moved - kept for moved, kept in zip(challenge.dots(forged), challenge.dots(true), strict=True)]
            honest = server._tags[COLLUDER]
            tags = encode_tags(value + delta for value, delta in zip(decode_tags(honest.tags), shift, strict=True))
            peer, reported = honest.values[0]
            moved = encode_tags(value + delta for value, delta in zip(decode_tags(reported), shift, strict=True))
            values = ((peer, moved), *honest.values[1:])
            signature = sign(key, tag_payload(server.session_id, server._digest, COLLUDER, tags, values))
            server._tags[COLLUDER] = AggregateTag(honest.header, COLLUDER, tags, signature, values)
        return tag_set(server)

    def relayed_anyway(server: Server) -> bool:
        return True if server.config.round == session else tags_add_up(server)

    setattr(Server, "finish", forged_finish)  # noqa: B010 -- the rewrite is the attack
    setattr(Server, "tag_set", covered_tag_set)  # noqa: B010
    setattr(Server, "tags_add_up", relayed_anyway)  # noqa: B010


if __name__ == "__main__":
    plan, forged_round, colluder_key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if forged_round:
        collude(forged_round, colluder_key)
    sys.exit(main(["aggregator", "start", "--plan", plan]))
