"""The collaborator's steps in a training round's bounded sum: SHARE, DECIDE on the verdict record, VERIFY the total.

Under ``[secure_aggregation] input_bound = "two_verifiers"`` a training round runs
:data:`~fedfair.secagg.bounded.stages.BOUNDED_ROUND` instead of the masking stages
(its training stages, :func:`~fedfair.runtime.contract.training_of`). A site uploads at SHARE, once it checked the round's public
parameters and every relayed certificate, its update encoded within its bound with the witness that proves it
(:class:`~fedfair.secagg.bounded.peers.BoundedSite`); at DECIDE, once the signed verdict record holds up (kept in its
folder first), its signed tags of the total, or its dispute of the aggregator's false message; at VERIFY, once no
dispute holds, the liars the record names, and its verdict once the tags check the total, which its model chain then
steps. A record, a dispute or a total that does not hold up stops the site.

Why: docs/security.md, "Bounded inputs (two verifiers)".
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedfair.core.errors import (
    AuthenticationError,
    ConfigError,
    IdentityError,
    ProtocolError,
    Refusal,
    RefusedError,
    VerificationError,
    VerifyReason,
)
from fedfair.runtime.collaborator.kinds.bounded_settlement import drop_settlement, keep_settlement, kept_round
from fedfair.runtime.collaborator.outcome import Excluded
from fedfair.runtime.collaborator.steps import Participant, StageInput, Step, Work, register_kind_steps
from fedfair.runtime.contract import ACCEPTED, RoundParameters, relayed_keys, round_setup
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.plan.bounded_noise import bounded_fractional_bits, bounded_noise_mu
from fedfair.secagg.bounded.layout import Layout, squared_bound
from fedfair.secagg.bounded.parameters import round_parameters
from fedfair.secagg.bounded.peers import BoundedSite
from fedfair.secagg.bounded.record import RoundFindings, VerdictRecord, claimed_context
from fedfair.secagg.bounded.shares import Witness, encode_within_bound, honest_witness
from fedfair.secagg.round import AnyStage, RoundSetup, SecureRound
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, DECIDE_STAGE, SHARE_STAGE, VERIFY_STAGE
from fedfair.secagg.pieces import Pieces, placed

logger = logging.getLogger("fedfair.collaborator")

RECORD_SUFFIX = "verdict_record"
"""A round's verdict record is kept as NAME.FEDERATION.round-N.verdict_record, its bytes as the site received them."""


INSIDE_THE_BALL = 1.0 - 2.0**-40
"""What an update scaled to its bound is scaled by once more: float rounding cannot take it past the bound."""


@dataclass
class SiteRound:
    """This site's part in one bounded sum, kept as its round's party state (:attr:`Work.client`) from SHARE on.

    site: its state machine (:class:`~fedfair.secagg.bounded.peers.BoundedSite`).
    roster: the round's roster by party id (id 1 first), once this site shared: whom its verdict record names.
    liars: the parties the verdict record excludes, by this site's own check at DECIDE: named once no dispute clears
        them (VERIFY).
    """

    site: BoundedSite
    roster: tuple[str, ...]
    liars: tuple[Excluded, ...] = ()


def bounded_encoding(vector: np.ndarray | Pieces, name: str, shared: SharedSettings) -> np.ndarray:
    """A site's training update (w times delta) as the bounded sum encodes it: signed integers within its bound.

    Each coordinate is clipped to clip times w, as the masked encoding clips it, and the whole scaled into the ball
    of update_norm times w (the plan's weight, which both verifiers check the bound with), then fixed point with the
    plan's fractional bits (under distributed DP the noise's), rounded stochastically (:func:`encode_within_bound`).

    Raises:
        ConfigError: the update is not finite, or the bound does not fit the field at these fractional bits.
    """
    secure = shared.secure_aggregation
    weight = shared.influence.weight_of(name, shared.batch_fraction)
    values = np.empty(vector.size, dtype=np.float64)
    if isinstance(vector, np.ndarray):
        values[:] = vector
    else:
        for start, piece in placed(vector, 1 << 20):
            values[start : start + piece.size] = piece
    np.clip(values, -secure.clip * weight, secure.clip * weight, out=values)
    bound = shared.influence.update_norm * weight
    norm = math.sqrt(math.fsum(values * values))
    if norm > bound:
        values *= bound / norm * INSIDE_THE_BALL
    bits = bounded_fractional_bits(shared, shared.collaborator_count, values.size)
    bound_sq = squared_bound(shared.influence.update_norm, weight, bits)
    return encode_within_bound(values, bound_sq, bits, os.urandom(32))


def share(me: Participant, work: Work, inputs: StageInput) -> bytes:
    """SHARE: check the round's public parameters and the relayed certificates, then this site's two parts.

    The encoded update is shared once, with one roster: a round run again over other sites would let the two
    verifiers' totals be subtracted, so this input is bound to its roster on disk before it leaves.

    Raises:
        RefusedError: reason :attr:`Refusal.WITHDRAWN` when the parameters differ from the plan, a certificate does
            not check, this input was shared already, or with another roster.
    """
    spec = SHARE_STAGE
    assert spec.received is not None  # the sites' first stage carries the round's parameters and the auditor's key
    opening = spec.received(inputs)
    parameters = me.check_parameters(work, opening.public)
    config = parameters.secagg_config(me.shared.federation_id, work.stages)
    try:
        bounded = round_parameters(config, site_setup(me, parameters))
    except ConfigError as error:
        raise RefusedError(Refusal.WITHDRAWN, f"the round's parameters cannot be checked: {error}") from None
    if work.encoded is None:
        raise RefusedError(Refusal.WITHDRAWN, "this round's encoding was shared already; it is not shared twice")
    roster = frozenset(parameters.parties)
    if work.view.survivors is not None and work.view.survivors != roster:
        raise RefusedError(
            Refusal.WITHDRAWN,
            "this input was already shared with another roster (in an earlier session or round, or before a "
            "restart); two bounded sums over different sites would let one be subtracted from the other",
        )
    party = config.party_id(me.name)
    own_bound = squared_bound(bounded.update_norm, bounded.weights[party], bounded.fractional_bits)
    encoded, witness = lying(work.encoded, own_bound)
    work.encoded = None
    site = BoundedSite(bounded, party, me.identity_key, witness or honest_witness)
    upload = spec.step(site, opening, lambda: encoded)
    work.client = SiteRound(site, config.parties)
    work.view.bind(roster)  # kept on disk before the parts leave
    keep_settlement(me, work.round, bytes(opening.public), site)  # so does what answers the record after a restart
    return bytes(upload.to_bytes())


def decide(me: Participant, work: Work, inputs: StageInput) -> bytes:
    """DECIDE: :func:`answer` the verdict record, as this process's site or, restarted since SHARE, as the one it kept.

    The kept settlement (:mod:`.bounded_settlement`) is removed once the record is answered, however that ends (a
    restarted process that cannot take its part up withdraws: that ends it too).

    Raises:
        What :func:`answer` and :func:`resumed` raise.
    """
    try:
        held = work.client if isinstance(work.client, SiteRound) else resumed(me, work, inputs)
        return answer(me, work, held, inputs)
    finally:
        drop_settlement(me)


def resumed(me: Participant, work: Work, record: StageInput) -> SiteRound:
    """This site as it stood after SHARE of `work`'s round, from what it kept there: a restart lost it from memory.

    The round's parameters were checked against the plan before the parts left; they are derived again from the kept
    copy, with every relayed certificate checked against the manifest again, and the model chain takes the round's
    model up again by the digest they state (:meth:`~fedfair.runtime.collaborator.chain.ModelChain.taken_up`).

    Raises:
        RefusedError: reason :attr:`Refusal.WITHDRAWN` when this site kept nothing of this round (it did not share it
            in any process), the kept file is damaged, or the record is of another run of the round (another session)
            than the one it shared in.
    """
    kept = kept_round(me)
    if kept is None or kept.round != work.round:
        raise RefusedError(Refusal.WITHDRAWN, DECIDE_STAGE.unready)
    parameters = me.check_parameters_of(work.round, work.stages, kept.public)
    config = parameters.secagg_config(me.shared.federation_id, work.stages)
    bounded = round_parameters(config, site_setup(me, parameters))
    site = BoundedSite.resumed(bounded, config.party_id(me.name), me.identity_key, kept.settlement)
    try:
        claimed = claimed_context(record)
    except ProtocolError:
        claimed = b""  # an unreadable record is refused as such by the check that follows (MALFORMED)
    if claimed and claimed != bounded.context(kept.settlement.auditor_cipher_key).digest:
        raise RefusedError(
            Refusal.WITHDRAWN,
            f"the verdict record is of another run of round {work.round} than the one this site shared in before its "
            "restart: its update is in no sum of this run",
        )
    # Its model chain held the round's model, which it checked before its parts left, in memory alone: taken up by
    # the model digest it shared under, so that VERIFY steps the total as it would have.
    me.chain.taken_up(work.round, parameters.model)
    held = SiteRound(site, config.parties)
    work.client = held
    logger.info(
        "%s: round %d: took up its shared part, kept before its restart, to answer the verdict record",
        me.name,
        work.round,
    )
    return held


def answer(me: Participant, work: Work, held: SiteRound, inputs: StageInput) -> bytes:
    """This site's own check of the verdict record; its signed tags of the total once the record holds up.

    The record's bytes are kept in this site's folder before anything leaves (:func:`record_path`), so the liars it
    names, and the total it commits the aggregator to, can be shown later. The liars are named at VERIFY, once every
    excluded site's dispute is in (:func:`verify`). A site the record leaves out disputes it when the aggregator's own
    message about it is the false one (:meth:`BoundedSite.dispute`): it uploads the part it sent the aggregator, which
    every accepted site is shown at VERIFY, then stops (FRAMED) instead of withdrawing as a liar. One the auditor's
    message leaves out, where that message is not the one its share gives under the record's query seed (which the
    auditor signed it under), stops (FRAMED) naming the auditor, and shows nothing: that would take its update. A
    record with another query seed than the verifiers drew does not hold up (FORGED, naming the aggregator).

    Raises:
        VerificationError: the record does not hold up against both verifiers' signed evidence and the auditor's
            signed total (FORGED), is unreadable (MALFORMED), or accepts fewer sites than the plan's threshold
            (BELOW_FLOOR): the aggregator misbehaves, and the process stops rather than withdraw; FRAMED, the auditor's
            message about this site is false.
        RefusedError: reason :attr:`Refusal.WITHDRAWN` when the record leaves this site out and it cannot show
            otherwise (its update is not in the sum).
    """
    spec = DECIDE_STAGE
    site = held.site
    assert spec.received is not None  # DECIDE's input is the signed verdict record
    try:
        record: VerdictRecord = spec.received(inputs)
    except ProtocolError as error:
        raise VerificationError(
            work.round, VerifyReason.MALFORMED, f"the verdict record is unreadable: {error}"
        ) from None
    try:
        findings: RoundFindings = site.check(record)
    except VerificationError:
        raise  # a total over fewer inputs than the floor: refused as it is named (BELOW_FLOOR)
    except (AuthenticationError, ProtocolError) as error:
        raise VerificationError(
            work.round, VerifyReason.FORGED, f"the verdict record does not hold up against its evidence: {error}"
        ) from None
    kept = keep_record(me, work.round, bytes(inputs))
    digest = hashlib.sha256(inputs).hexdigest()
    held.liars = tuple(
        Excluded(work.round, held.roster[party - 1], "; ".join(reasons), digest, "" if kept is None else kept.name)
        for party, reasons in sorted(findings.liars.items())
    )
    if site.party in findings.accepted:
        return bytes(spec.step(site, record, _not_asked).to_bytes())
    if site.party not in findings.liars:
        raise RefusedError(
            Refusal.WITHDRAWN,
            "the verdict record leaves this site out as absent (the aggregator took no share of it this round), so its "
            "update is not in the sum and there is no verifier message about it to dispute",
        )
    where = f"the record's sha256 {digest}{'' if kept is None else f'; kept as {kept}'}"
    dispute = site.dispute()
    if dispute is not None:
        work.stop = VerificationError(
            work.round,
            VerifyReason.FRAMED,
            "the verdict record names this site a liar, but the aggregator's signed verifier message about it is not "
            "the one the part this site sent it gives: this site sent that part back as its dispute, shown to every "
            f"accepted site ({where})",
        )
        return dispute.to_bytes()
    if site.auditor_framed():
        raise VerificationError(
            work.round,
            VerifyReason.FRAMED,
            "the verdict record names this site a liar, but the auditor's signed verifier message about it is not the "
            "one this site's share for the auditor gives under the record's query seed, which the auditor signed it "
            "under: the auditor framed it. Showing it would take that share, "
            "which with the aggregator's part is this site's update, so it is shown to nobody; the other sites name "
            f"this site a liar for round {work.round} (docs/security.md, 'A framed site'; {where})",
        )
    raise RefusedError(Refusal.WITHDRAWN, "the verdict record leaves this site's update out of the sum")


def verify(me: Participant, work: Work, inputs: StageInput) -> bytes:
    """VERIFY: every dispute, then the total against every accepted site's tags (`inputs`); the chain steps the total.

    A dispute that holds shows the aggregator signed a false message about the disputing site: nothing of the round is
    applied, the site is named no liar, and the process stops (FRAMED). Otherwise the liars the record names are
    logged by name, with the reasons this site's own check gave, and kept in its outcome record with the record's
    digest.

    Raises:
        VerificationError: naming the round and the reason (FRAMED, FORGED, MISSING_TAG, BAD_TAG, MALFORMED): nothing
            of the round is applied, and the process stops rather than withdraw.
        RefusedError: reason :attr:`Refusal.WITHDRAWN` when this site did not take DECIDE this round.
    """
    spec = VERIFY_STAGE
    held = work.client
    if not isinstance(held, SiteRound) or not held.site.tagged:
        raise RefusedError(Refusal.WITHDRAWN, "this site tagged no bounded total this round")
    site = held.site
    assert spec.received is not None  # VERIFY's input is the tag set
    try:
        tags = spec.received(inputs)
    except ProtocolError as error:
        raise VerificationError(work.round, VerifyReason.MALFORMED, f"the tags are unreadable: {error}") from None
    framed = site.framings(tags)
    if framed:
        shown = "; ".join(
            f"{held.roster[party - 1]}, whose proof "
            + ("checks with the true message" if verdict.accepted else "fails with the record's query seed anyway")
            for party, verdict in sorted(framed.items())
        )
        raise VerificationError(
            work.round,
            VerifyReason.FRAMED,
            f"the aggregator framed {shown}: its signed verifier message in the verdict record is not the one the "
            "part the site signed and sent it gives (the site's dispute, relayed at VERIFY)",
        )
    kept = record_path(me, work.round)
    for named in held.liars:
        if me.outcome is not None:
            me.outcome.excluded(named)
        logger.warning(
            "%s: round %d: the verdict record names %s: its proof failed (%s); it is not in the sum (the record's "
            "sha256 %s, as rounds.jsonl verdict_record_sha256 names it%s)",
            me.name,
            work.round,
            named.party,
            named.reasons,
            named.record_sha256,
            "" if kept is None else f"; kept as {kept}",
        )
    total = spec.step(site, tags, _not_asked)
    accepted = [held.roster[party - 1] for party in site.accepted]
    me.chain.verified_fixed_point(work.round, total, accepted, site.parameters.fractional_bits)
    return ACCEPTED


def record_path(me: Participant, round_number: int) -> Path | None:
    """Where this site keeps round `round_number`'s verdict record: beside its config, or None without a folder."""
    if me.folder is None:
        return None
    return me.folder / f"{me.name}.{me.shared.federation_id}.round-{round_number}.{RECORD_SUFFIX}"


def keep_record(me: Participant, round_number: int, data: bytes) -> Path | None:
    """Keep the verdict record's bytes in this site's folder (written whole, then renamed); its path, or None."""
    path = record_path(me, round_number)
    if path is None:
        return None
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)
    return path


def site_setup(me: Participant, parameters: RoundParameters) -> RoundSetup:
    """The round's setup as this site derives it: every relayed certificate checked against its manifest's pins.

    Raises:
        ConfigError: this site has no manifest (a plan with an input bound is refused without one), or a relayed
            certificate names someone the manifest does not list.
        RefusedError: reason :attr:`Refusal.WITHDRAWN` when a certificate is not the one pinned for its name.
    """
    manifest, ca_certificate = me.manifest, me.ca_certificate
    if manifest is None or ca_certificate is None:
        raise ConfigError("a bounded round's keys are checked against the manifest's pins: this site holds none")
    try:
        keys = relayed_keys(parameters, manifest, ca_certificate)
    except IdentityError as error:
        raise RefusedError(Refusal.WITHDRAWN, str(error)) from None
    secure = me.shared.secure_aggregation
    return round_setup(
        parameters,
        me.verify,
        keys,
        me.shared.influence,
        me.shared.batch_fraction,
        aggregator=manifest.aggregator.name,
        auditor=secure.auditor,
        noise_mu=bounded_noise_mu(me.shared, me.shared.collaborator_count, parameters.dimension),
    )


def _not_asked() -> np.ndarray:
    """The encoded input, which only SHARE takes."""
    raise ProtocolError("only SHARE takes this site's encoded update")


LIAR_VARIABLE = "FEDFAIR_TEST_LIAR"
"""``FEDFAIR_TEST_LIAR=FACTOR``: this site lies in every bounded sum, its update FACTOR times its bound (test-only,
as the faults of :mod:`fedfair.runtime.faults`)."""


def lying(encoded: np.ndarray, bound_sq: int) -> tuple[np.ndarray, Witness | None]:
    """The update a site sends in a bounded sum, and the witness it proves it with (None: the honest one).

    Where FEDFAIR_TEST_LIAR names a factor, the update is scaled to that factor times the bound (B = sqrt(bound_sq),
    the encoded scale; a zero update points along every coordinate) and proven with :func:`lying_witness`.
    """
    wanted = os.environ.get(LIAR_VARIABLE)
    if not wanted:
        return encoded, None
    direction = encoded.astype(np.float64) if np.any(encoded) else np.ones(encoded.size)
    scale = float(wanted) * math.sqrt(bound_sq) / float(np.linalg.norm(direction))
    return np.round(direction * scale).astype(np.int64), lying_witness


def lying_witness(layout: Layout, x: np.ndarray, projections: np.ndarray) -> np.ndarray:
    """What a liar can claim: the true values, cut to the bits the layout has (a negative slack wraps)."""
    values = [layout.bound_sq - sum(int(v) ** 2 for v in x), *(int(v) + layout.test_offset for v in projections)]
    widths = [layout.norm_bits] + [layout.test_bits] * layout.tests
    return np.array([(value >> bit) & 1 for value, width in zip(values, widths) for bit in range(width)], np.uint64)


def _bounded_steps(protocol: SecureRound) -> dict[AnyStage, Step]:
    """The bounded sum's own steps: a site takes SHARE, DECIDE and VERIFY alone, each the runtime's own."""
    return {
        protocol.spec(protocol.contribution): share,
        protocol.spec(protocol.committed): decide,
        protocol.verify_stages[0]: verify,
    }


register_kind_steps(BOUNDED_ROUND.name, _bounded_steps, bounded_encoding)
