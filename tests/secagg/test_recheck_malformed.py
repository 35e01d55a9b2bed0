"""One site's tag whose re-checked report carries a value field of the wrong length (31 bytes, not 64).

The field is signed by the site itself, so it passes every signature check; read, it raised ValueError in the
live aggregator (exit 1, no round logged) and in every honest site an aggregator relayed it to (the re-check red
team's finding 1). The server refuses such a tag at receipt (the round goes on without it, as without the tag),
and every survivor and a site catching up refuse it as BAD_TAG.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from fedfair.core.errors import ProtocolError, VerificationError, VerifyReason
from fedfair.pki.identity import sign
from fedfair.secagg import config as config_module
from fedfair.secagg.bystander import PastRound, check_past_sum
from fedfair.secagg.messages import KeyDirectory, SurvivorSet, UnmaskRequest
from fedfair.secagg.verify import aggregate_digest, tag_payload
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from tests.secagg.helpers import Harness, make_config

LIAR = 2


@pytest.fixture(autouse=True)
def above_the_bound() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config_module, "RESUMMED_WORDS", 0)
        yield


def short_report(harness: Harness, tag: AggregateTag, claim: AggregateClaim) -> AggregateTag:
    """``tag`` with its first reported value cut to 31 bytes, re-signed by its own sender (no collusion needed)."""
    view = harness.clients[tag.sender].signed_view
    assert view is not None
    session = harness.server.session_id
    digest = aggregate_digest(session, view[1], view[2], claim.vector, claim.carries)
    peer, field = tag.values[0]
    values = ((peer, field[:31]), *tag.values[1:])
    signature = sign(harness.key(tag.sender), tag_payload(session, digest, tag.sender, tag.tags, values))
    return AggregateTag.from_bytes(replace(tag, values=values, signature=signature).to_bytes())


Round = tuple[Harness, dict[int, AggregateClaim], dict[int, AggregateTag], SurvivorSet, UnmaskRequest]


def tagged_round(parties: int = 5) -> Round:
    """A re-checked round through VERIFY's tags, site LIAR's with the short report; the server holds the others."""
    harness = Harness(make_config(parties, modulus_bits=16, max_colluding=1), verified=True)
    survivor_set = harness.through_masking(list(range(1, parties + 1)))
    harness.sign(survivor_set)
    request = harness.server.unmask_request()
    harness.unmask(request)
    harness.server.finish()
    assert harness.config.rechecked
    claims = {party: AggregateClaim.from_bytes(claim.to_bytes()) for party, claim in harness.server.claims().items()}
    tags = {party: harness.clients[party].tag(claims[party]) for party in claims}
    tags[LIAR] = short_report(harness, tags[LIAR], claims[LIAR])
    for party, tag in tags.items():
        if party != LIAR:
            harness.server.receive_tag(tag)
    return harness, claims, tags, survivor_set, request


def relayed(tags: dict[int, AggregateTag]) -> TagSet:
    """Every tag, the short one too, as an aggregator colluding with LIAR relays them."""
    return TagSet.from_bytes(TagSet(tags[1].header, tuple(tags[p] for p in sorted(tags))).to_bytes())


def test_the_server_refuses_the_short_report_at_receipt_and_goes_on_without_it() -> None:
    harness, _claims, tags, *_ = tagged_round()
    with pytest.raises(ProtocolError, match="not 64 bytes"):
        harness.server.receive_tag(tags[LIAR])
    assert harness.server.untagged == (LIAR,)  # as a site whose tag never came: the tag set's fallback decides


def test_an_honest_survivor_refuses_a_relayed_short_report() -> None:
    harness, _claims, tags, *_ = tagged_round()
    tag_set = relayed(tags)
    for party in sorted(tags):
        if party == LIAR:
            continue
        with pytest.raises(VerificationError, match="31 bytes") as caught:
            harness.clients[party].verify(tag_set)
        assert caught.value.reason is VerifyReason.BAD_TAG


def test_a_site_catching_up_refuses_a_relayed_short_report() -> None:
    harness, claims, tags, survivor_set, request = tagged_round()
    assert harness.directory is not None
    past = PastRound(
        KeyDirectory.from_bytes(harness.directory.to_bytes()),
        SurvivorSet.from_bytes(survivor_set.to_bytes()),
        UnmaskRequest.from_bytes(request.to_bytes()),
        AggregateClaim.from_bytes(replace(claims[1], inputs=()).to_bytes()),
        relayed(tags),
    )
    with pytest.raises(VerificationError, match="31 bytes") as caught:
        check_past_sum(past, harness.config, harness.verify)
    assert caught.value.reason is VerifyReason.BAD_TAG
