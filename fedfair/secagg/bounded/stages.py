"""The bounded secure sum declared once, a round kind registered by name: its stages, in order, and who uploads.

A second kind of secure sum beside :data:`fedfair.secagg.masked_round.SECURE_ROUND` (docs/security.md, "Bounded inputs
(two verifiers)"). The auditor is one more peer of the round (party :data:`~fedfair.secagg.bounded.parameters.AUDITOR`)
that uploads to the aggregator, which relays what the two verifiers say to each other (:class:`BoundedStage`
says who uploads what, stage by stage). A runner loops over :data:`BOUNDED_ROUND`'s stages as it does over
SECURE_ROUND's; its server (:class:`~fedfair.secagg.bounded.server.BoundedServer`) keeps the
:class:`~fedfair.secagg.round.SecureSum` names for who is at fault.
"""

from __future__ import annotations

import enum

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.exchange import AuditorTotal, Commitments, Reveal, Roster, SeedReveal
from fedfair.secagg.bounded.messages import (
    Exchange,
    SeedRelay,
    ShareOpening,
    SignedRoundKey,
    SiteShare,
    aggregator_seed,
    auditor_messages,
    auditor_rosters,
)
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.parameters import round_parameters
from fedfair.secagg.bounded.peers import Auditor, BoundedSite, bounded_peer
from fedfair.secagg.bounded.record import Dispute, VerdictRecord
from fedfair.secagg.bounded.server import BoundedServer
from fedfair.secagg.bounded.total import CHALLENGE_ROWS, SignedTags, TagSet, decide_upload
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.server import AggregateResult
from fedfair.secagg.round import (
    MESSAGE_OVERHEAD_BYTES,
    Opening,
    RoundSetup,
    SecureRound,
    StageSpec,
    Uploaders,
    register_round_kind,
    roster_input,
    small_upload,
)


class BoundedStage(enum.IntEnum):
    """The stages of a bounded secure sum, in order, and who uploads what in each.

    Commit-reveal stays sound in this order: each verifier's half of the query seed is fixed by a commitment the
    other held before it revealed its own, and each verifier's messages by commitments it sent before it saw the
    other's messages.
    """

    AUDITOR_KEY = 1
    """The auditor: its X25519 round key, signed with its identity key; the round's context follows."""
    SHARE = 2
    """Each site checks the key's signature, then uploads its part and its seed sealed to the auditor."""
    ROSTERS = 3
    """The auditor, sent the sealed seeds and the aggregator's roster (with its commitment to its half of the
    query seed): its own roster (with its commitment) and its half."""
    MESSAGES = 4
    """The auditor, sent the aggregator's half and commitments: its commitments and signed messages."""
    TOTAL = 5
    """The auditor, sent the aggregator's signed messages: every present site decided, its signed total."""
    DECIDE = 6
    """Each present site and the auditor are sent the signed verdict record, which commits the total. Each present
    site checks it (refusing, it stops); each accepted one uploads its signed tags of its share under the challenge
    drawn from the record, an excluded one the aggregator framed its dispute, and the auditor, once the record accepts
    the sites its total covers, its signed tags of that total."""
    VERIFY = 7
    """Each accepted site is sent every accepted site's tags and the auditor's, and the disputes that held: it refuses
    the round if a dispute holds, and accepts the total only if the tags check it."""


WITNESS_ROOM = 1 << 14
"""Field elements a site's part or a verifier's messages hold beside d: the witness bits (B^2 below about 2^43 keeps
them within 512 tests of at most 26 bits) and the proof's seeds and polynomial points (layout.DEFAULT_POINTS)."""


def part_bytes(dimension: int) -> int:
    """The most a site's two parts take at d = `dimension`: x, its witness bits, a proof, the sealed seed, framing."""
    return MESSAGE_OVERHEAD_BYTES + field.ELEMENT_BYTES * (2 * dimension + WITNESS_ROOM)


def share_upload(config: SecAggConfig) -> int:
    """The largest SHARE upload: a site's two parts (:func:`part_bytes`)."""
    return part_bytes(config.dimension)


def messages_upload(config: SecAggConfig) -> int:
    """The largest MESSAGES upload: per site, a commitment and a signed message of about 4 d / (N - 2) elements."""
    return MESSAGE_OVERHEAD_BYTES + config.size * (1024 + field.ELEMENT_BYTES * (config.dimension // 8 + WITNESS_ROOM))


def total_upload(config: SecAggConfig) -> int:
    """The largest TOTAL upload: d field elements, the accepted sites and a signature."""
    return MESSAGE_OVERHEAD_BYTES + 4 * config.size + field.ELEMENT_BYTES * config.dimension


def _bounded_party(
    config: SecAggConfig,
    setup: RoundSetup,
    name: str,
    identity_key: ec.EllipticCurvePrivateKey,
    credential: bytes,
    *,
    verified: bool = False,
) -> BoundedSite | Auditor:
    """The bounded sum's party named `name`: the round's auditor (:attr:`RoundSetup.auditor`), or a site.

    Its parameters are every party's alike (:func:`round_parameters`). `credential` and `verified` are not read: the
    aggregator relays every party's certificate with the round's public parameters, and a site keeps the share it tags.
    """
    party = AUDITOR if name == setup.auditor else config.party_id(name)
    return bounded_peer(round_parameters(config, setup), party, identity_key)


def _the_auditor(_server: BoundedServer) -> Opening:
    """The auditor opens a bounded sum: the sites need its round key before they share."""
    return Opening((AUDITOR,), None)


def _tag_set(server: BoundedServer, _result: AggregateResult) -> Opening:
    """VERIFY opens once the sum is made: every site that tagged it is sent every accepted site's tags."""
    return server.tag_set()


def _verdict_record(server: BoundedServer) -> bytes:
    """The evidence of a finished bounded sum: its signed verdict record, which names who is in it and why."""
    return server.record


def decide_upload_bytes(config: SecAggConfig) -> int:
    """The largest DECIDE upload: a party's tags, or an excluded site's dispute (its SHARE part again)."""
    return max(MESSAGE_OVERHEAD_BYTES + field.ELEMENT_BYTES * CHALLENGE_ROWS, part_bytes(config.dimension))


def record_input(sites: int, words: int) -> int:
    """The largest DECIDE input: the verdict record, for a d of at most `words` as for a claim, and a part per site."""
    return roster_input(sites, words) + record_bytes(sites, words)


def auditor_tags_input(sites: int, words: int) -> int:
    """The largest VERIFY input: every accepted site's tags and the auditor's, and at most a dispute per site."""
    return roster_input(sites + 1, words) + sites * part_bytes(words)


def record_bytes(sites: int, dimension: int) -> int:
    """The most a verdict record holds beside its framing, for `sites` sites and d = `dimension`.

    Per site, both verifiers' messages (each at most d / 8 elements and the witness's room, as a verifier's upload is
    bounded), and the total (d elements).
    """
    return field.ELEMENT_BYTES * (sites * 2 * (dimension // 8 + WITNESS_ROOM) + dimension)


# Each stage by name, typed (its party, server, input and upload): the site's and the auditor's own steps take them so.

AUDITOR_KEY_STAGE = StageSpec[Auditor, BoundedServer, None, SignedRoundKey](
    BoundedStage.AUDITOR_KEY,
    "BOUNDED_AUDITOR_KEY",
    "auditor round keys",
    "evaluation auditor round keys",
    received=None,
    step=lambda auditor, _parameters, _own: auditor.round_key(),
    upload=SignedRoundKey.from_bytes,
    receive=BoundedServer.receive_round_key,
    close=BoundedServer.open_shares,
    upload_bytes=small_upload,
    unready="this round's auditor was never started",
    uploaders=Uploaders.AUDITOR,
)


SHARE_STAGE = StageSpec[BoundedSite, BoundedServer, ShareOpening, SiteShare](
    BoundedStage.SHARE,
    "BOUNDED_SHARE",
    "bounded shares",
    "evaluation bounded shares",
    received=ShareOpening.from_bytes,
    step=lambda site, opening, own: site.share(opening.round_key, own()),
    upload=SiteShare.from_bytes,
    receive=BoundedServer.receive_share,
    close=BoundedServer.relay_seeds,
    upload_bytes=share_upload,
    unready="the auditor sent no round key this round",
)


ROSTERS_STAGE = StageSpec[Auditor, BoundedServer, SeedRelay, Exchange[Roster, SeedReveal]](
    BoundedStage.ROSTERS,
    "BOUNDED_ROSTERS",
    "auditor rosters",
    "evaluation auditor rosters",
    received=SeedRelay.from_bytes,
    step=lambda auditor, relay, _own: auditor.exchange_rosters(relay),
    upload=auditor_rosters,
    receive=BoundedServer.receive_auditor_roster,
    close=BoundedServer.send_seed,
    upload_bytes=small_upload,
    unready="no site shared its update this round",
    uploaders=Uploaders.AUDITOR,
)


MESSAGES_STAGE = StageSpec[Auditor, BoundedServer, Exchange[SeedReveal, Commitments], Exchange[Commitments, Reveal]](
    BoundedStage.MESSAGES,
    "BOUNDED_MESSAGES",
    "auditor verifier messages",
    "evaluation auditor verifier messages",
    received=aggregator_seed,
    step=lambda auditor, seed, _own: auditor.exchange_messages(seed),
    upload=auditor_messages,
    receive=BoundedServer.receive_auditor_messages,
    close=BoundedServer.send_reveal,
    upload_bytes=messages_upload,
    unready="the auditor sent no roster this round",
    uploaders=Uploaders.AUDITOR,
)


TOTAL_STAGE = StageSpec[Auditor, BoundedServer, Reveal, AuditorTotal](
    BoundedStage.TOTAL,
    "BOUNDED_TOTAL",
    "auditor totals",
    "evaluation auditor totals",
    received=Reveal.from_bytes,
    step=lambda auditor, reveal, _own: auditor.total(reveal),
    upload=AuditorTotal.from_bytes,
    receive=BoundedServer.receive_total,
    close=BoundedServer.send_record,
    upload_bytes=total_upload,
    unready="the auditor sent no verifier messages this round",
    uploaders=Uploaders.AUDITOR,
)


DECIDE_STAGE = StageSpec[BoundedSite | Auditor, BoundedServer, VerdictRecord, SignedTags | Dispute](
    BoundedStage.DECIDE,
    "BOUNDED_DECIDE",
    "verdicts on the verdict record",
    "verdicts on the evaluation verdict record",
    received=VerdictRecord.from_bytes,
    step=lambda peer, record, _own: peer.decide(record),
    upload=decide_upload,
    receive=BoundedServer.receive_tags,
    close=None,
    upload_bytes=decide_upload_bytes,
    input_bytes=record_input,
    unready="no bounded share was sent this round",
    withheld=BoundedServer.tags_withheld,
    uploaders=Uploaders.PARTIES | Uploaders.AUDITOR,
    rejoinable=True,  # a site restarted since SHARE answers the record from its kept settlement
)


VERIFY_STAGE = StageSpec[BoundedSite, BoundedServer, TagSet, np.ndarray](
    BoundedStage.VERIFY,
    "BOUNDED_VERIFY",
    "verdicts on the bounded total",
    "verdicts on the evaluation bounded total",
    received=TagSet.from_bytes,
    step=lambda site, tags, _own: site.verify(tags),
    upload=None,
    receive=None,
    close=None,
    upload_bytes=small_upload,
    input_bytes=auditor_tags_input,
    unready="no bounded share was sent this round",
    withheld=BoundedServer.framed,
)


BOUNDED_ROUND = register_round_kind(
    SecureRound(
        name="bounded-v2",
        sum_stages=(
            AUDITOR_KEY_STAGE,
            SHARE_STAGE,
            ROSTERS_STAGE,
            MESSAGES_STAGE,
            TOTAL_STAGE,
            DECIDE_STAGE,
        ),
        verify_stages=(VERIFY_STAGE,),
        server=BoundedServer.for_round,
        client=_bounded_party,
        open_sum=_the_auditor,
        open_verification=_tag_set,
        contribution=BoundedStage.SHARE,
        committed=BoundedStage.DECIDE,
        auditor=AUDITOR,
        binds_roster_at=BoundedStage.SHARE,
        evidence=_verdict_record,
        keeps_past_rounds=True,
    )
)
"""The bounded secure sum: AUDITOR_KEY, SHARE, ROSTERS, MESSAGES, TOTAL, DECIDE; then VERIFY, which checks its total."""


AUDITOR_STAGES = frozenset(spec.stage for spec in BOUNDED_ROUND.stages(True) if Uploaders.AUDITOR in spec.uploaders)
"""The stages the auditor uploads in: an aggregator admits it at these alone."""

AUDITOR_ONLY_STAGES = frozenset(
    spec.stage for spec in BOUNDED_ROUND.stages(True) if Uploaders.PARTIES not in spec.uploaders
)
"""The stages only the auditor uploads in: an aggregator admits no site there."""
