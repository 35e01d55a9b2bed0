"""One site's tag whose re-checked report carries a value field of the wrong length (31 bytes, not 64).

The field is signed by the site itself, so it passes every signature check; read, it raised ValueError in the
live aggregator (exit 1, no round logged) and in every honest site an aggregator relayed it to (the re-check red
team's finding 1). Such a tag does not parse (:meth:`AggregateTag.read` holds every tag to its lengths, the one
place that does): the aggregator refuses it as it reads the upload, naming its sender, and the round goes on as
without that tag (every survivor re-sums it from the tag set); every survivor and a site catching up that are
relayed it cannot read the tag set, and refuse the round as MALFORMED.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from fedfair.core.errors import ProtocolError, VerificationError, VerifyReason
from fedfair.pki.identity import sign
from fedfair.runtime.collaborator import steps
from fedfair.runtime.collaborator.kinds.masked import verdict
from fedfair.runtime.contract import TRAINING
from fedfair.secagg import config as config_module
from fedfair.secagg.bystander import PastRound
from fedfair.secagg.masked_round import VERIFY_CLAIM_STAGE
from fedfair.secagg.messages import SurvivorSet, UnmaskRequest
from fedfair.secagg.verify import aggregate_digest, tag_payload
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from tests.secagg.helpers import Harness, make_config

LIAR = 2

SHORT = "a field of 31 bytes, not 64 (party 2's re-checked value of party"
"""How the reader refuses the short value: its length, and whose tag and report it is in."""


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
    return replace(tag, values=values, signature=signature)


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


def relayed(tags: dict[int, AggregateTag]) -> bytes:
    """Every tag, the short one too, as an aggregator colluding with LIAR relays them (the tag set's bytes)."""
    return bytes(TagSet(tags[1].header, tuple(tags[p] for p in sorted(tags))).to_bytes())


def test_the_aggregator_refuses_the_short_report_as_it_reads_it_and_goes_on_without_it() -> None:
    harness, _claims, tags, *_ = tagged_round()
    true_sum = np.array(harness.server.running_sum, copy=True)  # unmasked in place at finish
    assert VERIFY_CLAIM_STAGE.upload is not None
    with pytest.raises(ProtocolError, match=re.escape(SHORT)):
        VERIFY_CLAIM_STAGE.upload(bytes(tags[LIAR].to_bytes()))  # as the aggregator parses the upload
    assert harness.server.untagged == (LIAR,)  # as a site whose tag never came: the tag set's fallback decides
    tag_set = TagSet.from_bytes(harness.server.tag_set().to_bytes())
    assert LIAR not in {tag.sender for tag in tag_set.tags} and len(tag_set.inputs) == harness.config.size
    for party in sorted(tags.keys() - {LIAR}):
        np.testing.assert_array_equal(harness.clients[party].verify(tag_set), true_sum)


def test_an_honest_survivor_refuses_a_relayed_short_report_as_malformed() -> None:
    harness, _claims, tags, *_ = tagged_round()
    tag_set = relayed(tags)
    for party in sorted(tags.keys() - {LIAR}):
        work = steps.Work(harness.config.round, TRAINING, None, 1.0, client=harness.clients[party])
        nobody: Any = None  # the verdict step reads nothing of its participant before the tag set parses
        with pytest.raises(VerificationError, match=re.escape(SHORT)) as caught:
            verdict(nobody, work, tag_set)
        assert caught.value.reason is VerifyReason.MALFORMED and caught.value.round == harness.config.round


def test_a_site_catching_up_cannot_read_a_relayed_short_report() -> None:
    """The catch-up refuses a round whose kept inputs do not parse as MALFORMED (``masked_catch_up._parsed``)."""
    harness, claims, tags, survivor_set, request = tagged_round()
    assert harness.directory is not None
    kept = [
        harness.directory.to_bytes(),
        survivor_set.to_bytes(),
        request.to_bytes(),
        replace(claims[1], inputs=()).to_bytes(),
        relayed(tags),
    ]
    with pytest.raises(ProtocolError, match=re.escape(SHORT)):
        PastRound.parsed(kept)
