"""The bounded round's parties refuse messages out of order, doubled or swapped, and say which."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedfair.core.errors import AuthenticationError, ConfigError, ProtocolError
from fedfair.secagg.bounded.messages import SeedRelay, SiteShare
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.peers import Auditor, BoundedSite
from fedfair.secagg.bounded.record import VerdictRecord, sign_record
from fedfair.secagg.bounded.server import BoundedServer
from fedfair.secagg.bounded.shares import encode_within_bound
from fedfair.secagg.bounded.stages import BOUNDED_ROUND
from fedfair.secagg.bounded.layout import squared_bound
from tests.secagg.bounded.roundkit import DIMENSION, FRACTIONAL_BITS, UPDATE_NORM, bounded_parameters, vector_at

SITES = (1, 2)


def honest(party: int) -> np.ndarray:
    bound_sq = squared_bound(UPDATE_NORM, 1.0, FRACTIONAL_BITS)
    return encode_within_bound(vector_at(0.5, DIMENSION, party), bound_sq, FRACTIONAL_BITS, bytes([party]) * 32)


def test_the_round_opens_to_the_auditor_alone_with_the_runners_own_input() -> None:
    """A runner asks the round whom its first stage addresses: the sites cannot share before the auditor's key."""
    parameters, private, aggregator = bounded_parameters(SITES, round_number=3)
    opening = BOUNDED_ROUND.open_sum(BoundedServer(parameters, aggregator))
    assert opening.among == (AUDITOR,) and opening.inputs is None
    assert BOUNDED_ROUND.sum_stages[0].received is None  # so the first stage's input is the runner's own


def test_the_aggregator_opens_share_only_once_the_auditor_key_arrived_and_takes_it_once() -> None:
    parameters, private, aggregator = bounded_parameters(SITES, round_number=3)
    server = BoundedServer(parameters, aggregator)
    with pytest.raises(ProtocolError, match="round key has not arrived"):
        server.open_shares()
    round_key = Auditor(parameters, private[AUDITOR]).round_key()
    server.receive_round_key(round_key)
    opening = server.open_shares()
    assert opening.among == SITES and opening.inputs.round_key == round_key and opening.inputs.public == b""
    with pytest.raises(ProtocolError, match="round key twice"):
        server.receive_round_key(round_key)


def test_a_site_cannot_send_another_sites_sealed_seed_and_a_refused_part_is_not_relayed() -> None:
    parameters, private, aggregator = bounded_parameters(SITES, round_number=3)
    server = BoundedServer(parameters, aggregator)
    round_key = Auditor(parameters, private[AUDITOR]).round_key()
    server.receive_round_key(round_key)
    shares = {party: BoundedSite(parameters, party, private[party]).share(round_key, honest(party)) for party in SITES}
    with pytest.raises(ProtocolError, match="auditor's part of another party"):
        server.receive_share(SiteShare(shares[1].leader, shares[2].sealed))
    server.receive_share(shares[1])
    with pytest.raises(ProtocolError, match="twice"):
        server.receive_share(shares[1])
    relay = server.relay_seeds()
    assert relay.among == (AUDITOR,)
    assert isinstance(relay.inputs, SeedRelay) and [seed.party for seed in relay.inputs.seeds] == [1]
    assert relay.inputs.roster.parties == (1,)


def test_the_auditor_makes_one_round_key_and_a_site_whose_seed_is_not_relayed_is_absent() -> None:
    parameters, private, aggregator = bounded_parameters(SITES, round_number=3)
    auditor = Auditor(parameters, private[AUDITOR])
    round_key = auditor.round_key()
    with pytest.raises(ProtocolError, match="one round key per round"):
        auditor.round_key()
    server = BoundedServer(parameters, aggregator)
    server.receive_round_key(round_key)
    for party in SITES:
        server.receive_share(BoundedSite(parameters, party, private[party]).share(round_key, honest(party)))
    relay = server.relay_seeds().inputs
    assert isinstance(relay, SeedRelay)
    # Site 1's seed swapped for a second copy of site 2's: site 1 is absent, the copy refused and said why.
    swapped = SeedRelay((relay.seeds[1], relay.seeds[1]), relay.roster)
    rosters = auditor.exchange_rosters(swapped)
    assert rosters.first.parties == (2,) and set(auditor.unopened) == {2} and "twice" in auditor.unopened[2]


def test_a_site_is_sent_a_record_only_after_it_shared_and_no_site_may_have_the_auditors_id() -> None:
    parameters, private, aggregator = bounded_parameters(SITES, round_number=3)
    with pytest.raises(ProtocolError, match="before it shared"):
        BoundedSite(parameters, 1, private[1]).decide(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="auditor's id"):
        dataclasses.replace(parameters, weights={AUDITOR: 1.0}, site_keys={AUDITOR: parameters.auditor_key})


def test_the_auditor_tags_one_record_the_aggregator_signed_and_no_other() -> None:
    """At DECIDE the record goes to the auditor beside the sites; it tags its total under a record the aggregator
    signed with the query seed both verifiers drew, once."""
    parameters, private, aggregator = bounded_parameters(SITES, round_number=3)
    server = BoundedServer(parameters, aggregator)
    auditor = Auditor(parameters, private[AUDITOR])
    peers = {**{party: BoundedSite(parameters, party, private[party]) for party in SITES}, AUDITOR: auditor}
    opening = BOUNDED_ROUND.open_sum(server)
    for spec in BOUNDED_ROUND.sum_stages[:-1]:  # every stage before DECIDE, as a runner loops over them
        for party in opening.among:
            received = None if spec.received is None else spec.received(opening.inputs.to_bytes())
            upload = spec.step(peers[party], received, lambda party=party: honest(party))
            assert spec.upload is not None and spec.receive is not None and spec.close is not None
            spec.receive(server, spec.upload(upload.to_bytes()))
        opening = spec.close(server)
    assert opening.among == (*SITES, AUDITOR)
    record = VerdictRecord.from_bytes(opening.inputs.to_bytes())
    with pytest.raises(AuthenticationError, match="not signed by the aggregator"):
        auditor.decide(dataclasses.replace(record, signature=b""))
    reseeded = sign_record(server.context, aggregator, dataclasses.replace(record, query_seed=bytes(32)))
    with pytest.raises(ProtocolError, match="another query seed than the one both verifiers drew"):
        auditor.decide(reseeded)  # signed by the aggregator, but not under the seed the auditor drew
    server.receive_tags(auditor.decide(record))  # signed by the auditor over the record the sites are sent
    with pytest.raises(ProtocolError, match="one verdict record per round"):
        auditor.decide(record)


def test_a_site_a_record_leaves_out_as_absent_has_nothing_to_dispute_and_says_so() -> None:
    """A hostile aggregator that drops a site's share and sends it the record anyway (neither accepted nor excluded):
    the site has no evidence to check, so it neither disputes nor names the auditor, and is told it is not in it."""
    sites = (1, 2, 3)
    parameters, private, aggregator = bounded_parameters(sites, round_number=3)
    server = BoundedServer(parameters, aggregator)
    peers = {
        **{party: BoundedSite(parameters, party, private[party]) for party in sites},
        AUDITOR: Auditor(parameters, private[AUDITOR]),
    }
    opening = BOUNDED_ROUND.open_sum(server)
    for spec in BOUNDED_ROUND.sum_stages[:-1]:
        for party in opening.among:
            received = None if spec.received is None else spec.received(opening.inputs.to_bytes())
            upload = spec.step(peers[party], received, lambda party=party: honest(party))
            assert spec.upload is not None and spec.receive is not None and spec.close is not None
            if party != 3:  # the aggregator drops site 3's share
                spec.receive(server, spec.upload(upload.to_bytes()))
        opening = spec.close(server)
    record = VerdictRecord.from_bytes(opening.inputs.to_bytes())
    dropped = peers[3]
    assert isinstance(dropped, BoundedSite)
    findings = dropped.check(record)
    assert 3 not in findings.accepted and 3 not in findings.liars
    for asked in (dropped.dispute, dropped.auditor_framed):
        with pytest.raises(ProtocolError, match="neither accepts nor excludes party 3"):
            asked()
