"""A forging aggregator process: ``python forging_aggregator.py PLAN ROUND [sum|model|evaluation|initial|bounded|
one-share|one-share-to-all|frame|false-seed|tamper-one|past|bounded-past|withhold]``: attacks that verification stops.

It runs the real aggregator (``fedfair aggregator start --plan PLAN``) rewritten for training round ROUND.
``sum`` (the default): the unmasked sum has a word moved before it is decoded, so the model it applies is not
the sum of the sites' inputs (the issue 65 attack: a backdoor or a flipped model, here one coordinate), and the
server's own check of the survivors' tags is skipped so that it shows every site that sum and relays their tags
all the same. ``model``: the true sum is claimed and verified, and the model the server step makes of it is
flipped (theta negated) before it is sent for round ROUND + 1. ``evaluation``: as ``sum``, for the evaluation
sums of round ROUND (the report's figures). ``initial``: round 1's model is the plan's initial model with +1.0 on
its first weight (a backdoor; ROUND is ignored). ``past``: what the aggregator keeps of round ROUND for a site that
missed it has its claimed sum's first word moved (every survivor of the round was shown the true one);
``bounded-past``: under a two-verifier input bound, its kept tag set lacks the first site's tags. ``withhold``:
round ROUND applies, but a site that missed it is told it is not kept (as if void), while the next round is served.
``older``: every kept input of round ROUND - 1 (applied, verified) is served as round ROUND's; ``older-tags``: round
ROUND's own kept inputs, but its claim and tag set are round ROUND - 1's.
``void-next``: honest, but round ROUND + 1 is made void once its sum verified (as the aggregator's own checks void a
round), and the loop pauses 20 s once round ROUND + 2 ended (printing ``paused``), for a site to rejoin at ROUND + 3. ``bounded``: under a two-verifier input bound, the aggregator's
share-sum of round ROUND's bounded sum has a coordinate moved before it claims it in its verdict record (and applies
it), and its own check of the sites' tags is skipped. ``one-share``: under a two-verifier input bound, the aggregator
keeps only site-a's SHARE upload of every round (the others' are dropped unread), so the auditor is asked to total
site-a alone. ``one-share-to-all``: as ``one-share``, with its own floor on the inputs a total covers removed, and the
verdict record sent to every site (the dropped ones too), so that each site's own check is what stands. ``frame``:
under a two-verifier input bound, the aggregator's verifier message about site-b is moved in round 1, so both
verifiers reject site-b's honest proof (ROUND is ignored); ``python forging_aggregator.py --framing-auditor ARGS`` is
``fedfair auditor start ARGS`` with the auditor's message moved instead. ``false-seed``: under a two-verifier input
bound, the verdict record of round 1 carries another query seed than the one both verifiers drew, the aggregator's
messages recomputed and signed under it, and site-b excluded (ROUND is ignored): the auditor's signatures bind the
seed it drew, so every site refuses the record. ``tamper-one``: under a two-verifier input
bound, the verdict record sent to site-c in round 1 has a byte of its total moved (ROUND is ignored). Used by
tests/runtime/test_verified_sums.py and tests/runtime/test_bounded_processes.py.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Collection, Mapping
from functools import partial
from typing import Any

import torch

from fedfair.cli import main
from fedfair.core import server as server_step
from fedfair.core.algorithm import FedSRCVaR
from fedfair.core.errors import AggregateError
import numpy as np

from fedfair.runtime.aggregator import checks, loop
from fedfair.runtime.aggregator.past_rounds import PastRounds
from fedfair.runtime.contract import EVALUATION, TRAINING, Stages, session_round, training_of
from fedfair.runtime.transport import pb
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.verify_messages import AggregateClaim
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded import server as bounded_server
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.record import VerdictRecord, sign_record
from fedfair.secagg.bounded.shares import LeaderShare
from fedfair.secagg.bounded.upload import LeaderUpload, SealedSeed
from fedfair.secagg.bounded.exchange import Commitments, SeedReveal
from fedfair.secagg.bounded.messages import Encoded
from fedfair.secagg.bounded.verifier import Role, Verifier, sign
from fedfair.secagg.bounded.verifying import RoundVerifier
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, BoundedStage
from fedfair.secagg.bounded.total import TagSet
from fedfair.secagg.round import AnyStage, Opening
from fedfair.secagg.round_order import ServerOrder
from fedfair.secagg.server import AggregateResult, Server

BOUNDED_TRAINING = training_of(BOUNDED_ROUND)
"""A training round under the bounded sum (this script runs alone: it takes nothing of the tests' modules)."""


def forge(round_number: int, stages: Stages = TRAINING) -> None:
    """Rewrite :class:`Server` so the sum of `round_number`'s aggregation over `stages` is forged and claimed."""
    finish, tags_add_up = Server.finish, Server.tags_add_up
    session = session_round(round_number, stages)

    def forged_finish(server: Server) -> AggregateResult:
        if server.config.round == session:
            # One word moved by 2^12 (a few thousandths of a coordinate of w * delta): within every bound the
            # aggregator checks, so only the sites' verification can tell.
            server.running_sum[0] += server.running_sum.dtype.type(1 << 12)
        return finish(server)

    def relayed_anyway(server: Server) -> bool:
        return True if server.config.round == session else tags_add_up(server)

    setattr(Server, "finish", forged_finish)  # noqa: B010 -- the rewrite is the attack
    setattr(Server, "tags_add_up", relayed_anyway)  # noqa: B010


def forge_bounded(round_number: int) -> None:
    """Rewrite the aggregator's verifier so its share-sum, and so round `round_number`'s bounded total, is moved in the
    record and applied."""
    share_sum = RoundVerifier.share_sum
    session = session_round(round_number, BOUNDED_TRAINING)

    def forged_share_sum(verifier: RoundVerifier) -> np.ndarray:
        total = share_sum(verifier)
        if verifier.role is Role.LEADER and verifier.context.round == session:
            # 2^12 in the encoded scale (2^-f of a unit at f = 12: one coordinate of w * delta moved by 1): within
            # every bound the aggregator checks, so only the sites' verification can tell.
            moved = np.zeros_like(total)
            moved[0] = 1 << 12
            total = field.add(total, moved)
        return total

    def relayed_anyway(_digest: bytes, _total: np.ndarray, _tags: object) -> bool:
        return True  # the server's own check of the tags (every round; the others are honest anyway)

    setattr(RoundVerifier, "share_sum", forged_share_sum)  # noqa: B010 -- the rewrite is the attack
    setattr(bounded_server, "tags_add_up", relayed_anyway)  # noqa: B010


def keep_one_share(*, to_all: bool) -> None:
    """Rewrite the aggregator's verifier to keep only site-a's share each round; with `to_all`, to form and send a
    total below the floor too (its own floor removed, the record sent to every site).

    The rewrites are of :class:`RoundVerifier`, whose methods the server looks up at each call (the round's
    declaration holds the server's own methods as they were imported).
    """
    receive_upload, record = RoundVerifier.receive_upload, RoundVerifier.record

    def kept_if_site_a(verifier: RoundVerifier, upload: LeaderUpload | SealedSeed) -> None:
        if upload.party == min(verifier.context.parties):  # site-a, the roster's first; the others' dropped unread
            receive_upload(verifier, upload)

    setattr(RoundVerifier, "receive_upload", kept_if_site_a)  # noqa: B010 -- the rewrite is the attack
    if not to_all:
        return

    def to_every_site(verifier: RoundVerifier) -> VerdictRecord:
        made = record(verifier)
        verifier.present = verifier.context.parties  # whom the server sends the record to: every site
        return made

    setattr(BoundedContext, "check_floor", lambda _context, _accepted, _who: None)  # noqa: B010
    setattr(RoundVerifier, "record", to_every_site)  # noqa: B010


def frame(role: Role) -> None:
    """Rewrite `role`'s verifier so its message about site-b (party 2 of round 1's roster) has its first output moved
    in round 1's bounded sum, before it commits to it: both verifiers reject site-b's honest proof, and the verdict record's evidence, signed
    by both, names it a liar. The aggregator's check of a dispute (:func:`~fedfair.secagg.bounded.record.framing`) is
    left as it is: a framing aggregator relays site-b's dispute, as the protocol has it."""
    receive_seed = RoundVerifier.receive_seed
    first = session_round(1, BOUNDED_TRAINING)

    def moved(verifier: RoundVerifier, peer: SeedReveal) -> Commitments:
        commitments = receive_seed(verifier, peer)
        framed = 2
        if verifier.role is not role or verifier.context.round != first or framed not in verifier.present:
            return commitments
        messages = verifier._messages
        assert messages is not None  # made by receive_seed
        message = messages[framed]
        outputs = message.share.outputs.copy()
        outputs[0] = (int(outputs[0]) + 1) % field.P
        message = dataclasses.replace(message, share=dataclasses.replace(message.share, outputs=outputs))
        messages[framed] = message  # what it signs and reveals
        pending = verifier._verifier(framed)._pending
        pending[framed] = (pending[framed][0], message)  # what it decides with
        return Commitments(tuple((party, messages[party].commitment()) for party, _ in commitments.entries))

    setattr(RoundVerifier, "receive_seed", moved)  # noqa: B010 -- the rewrite is the attack


def false_seed() -> None:
    """Rewrite the aggregator's verifier so round 1's verdict record carries another query seed than the one both
    verifiers drew, every message of the aggregator's recomputed and signed under it, and site-b (party 2) moved from
    accepted to excluded: the auditor's messages, signed under the seed it drew, do not check under the record's."""
    receive_upload, record = RoundVerifier.receive_upload, RoundVerifier.record
    first = session_round(1, BOUNDED_TRAINING)
    framed = 2
    kept: dict[tuple[bytes, int], LeaderShare] = {}  # each part, by round context: the verifier drops it once decided

    def keeping(verifier: RoundVerifier, upload: LeaderUpload | SealedSeed) -> None:
        receive_upload(verifier, upload)
        if isinstance(upload, LeaderUpload):
            kept[verifier.context.digest, upload.party] = upload.share

    def falsely_seeded(verifier: RoundVerifier) -> VerdictRecord:
        made = record(verifier)
        context = verifier.context
        if context.round != first or framed not in made.accepted:
            return made
        seed = bytes(32)
        evidence = {}
        for party, item in made.evidence.items():
            share = kept[context.digest, party]
            message = Verifier(context.layout(party), Role.LEADER, seed).receive(party, share)
            data, signature = sign(verifier._identity_key, context.digest, seed, message)
            evidence[party] = dataclasses.replace(item, leader_message=data, leader_signature=signature)
        accepted = tuple(party for party in made.accepted if party != framed)
        moved = dataclasses.replace(
            made, query_seed=seed, accepted=accepted, excluded={**made.excluded, framed: ("moved",)}, evidence=evidence
        )
        return sign_record(context, verifier._identity_key, moved)

    setattr(RoundVerifier, "receive_upload", keeping)  # noqa: B010 -- the rewrite is the attack
    setattr(RoundVerifier, "record", falsely_seeded)  # noqa: B010


def tamper_one() -> None:
    """Rewrite the aggregator's round order so the verdict record TOTAL's close sends site-c (party 3 of round 1's
    roster) in round 1 has one byte of its total moved, its signature unchanged; every other party is sent the record
    as signed. (The round's declaration holds the server's own close as it was imported, so the order's call of it is
    what is rewritten.)"""
    close = ServerOrder.close
    first = session_round(1, BOUNDED_TRAINING)

    def tampered_for_site_c(order: ServerOrder, spec: AnyStage, step: Callable[[], Any]) -> Any:
        opening = close(order, spec, step)
        server = step.args[0] if isinstance(step, partial) else None  # the driver's partial(close, server)
        if not isinstance(server, bounded_server.BoundedServer) or spec.stage is not BoundedStage.TOTAL:
            return opening
        if server.context.round != first or 3 not in opening.among:
            return opening
        record = opening.inputs
        assert isinstance(record, Encoded)  # one record, the same for every party
        moved = bytearray(record.data)
        moved[-100] ^= 1  # a byte of the total (the signature, at most 72 bytes, and its 8-byte length follow it)
        inputs = {party: Encoded(bytes(moved)) if party == 3 else record for party in opening.among}
        return Opening(opening.among, inputs)

    setattr(ServerOrder, "close", tampered_for_site_c)  # noqa: B010 -- the rewrite is the attack


def flip(round_number: int) -> None:
    """Rewrite the server step so the model made of `round_number`'s (true, verified) sum is sent negated."""
    apply = FedSRCVaR.server_apply

    def flipped_apply(
        algorithm: FedSRCVaR,
        state: server_step.ServerState,
        aggregate: server_step.Aggregate,
        *,
        average_from: int = 0,
        consume: bool = False,
    ) -> server_step.ServerState:
        moved = apply(algorithm, state, aggregate, average_from=average_from, consume=consume)
        if moved.round == round_number:  # every round before it applied (the test's honest rounds)
            moved.theta.neg_()
        return moved

    setattr(FedSRCVaR, "server_apply", flipped_apply)  # noqa: B010 -- the rewrite is the attack


def forge_past(round_number: int, *, bounded: bool) -> None:
    """Rewrite what the aggregator keeps of training round `round_number` for a site that missed it, while every
    party of the round was shown the true inputs: the kept claim has a word moved (by 2^12, as :func:`forge`); or,
    `bounded`, the kept tag set lacks its first site's signed tags."""
    opened = PastRounds.opened
    stages, protocol = (BOUNDED_TRAINING, BOUNDED_ROUND) if bounded else (TRAINING, SECURE_ROUND)
    last_step = stages.wire(protocol.verify_stages[0]).step

    def forged(inputs: bytes) -> bytes:
        if bounded:
            tag_set = TagSet.from_bytes(inputs)
            return dataclasses.replace(tag_set, tags=tag_set.tags[1:]).to_bytes()
        claim = AggregateClaim.from_bytes(inputs)
        vector = claim.vector.copy()
        vector[0] += vector.dtype.type(1 << 12)
        return dataclasses.replace(claim, vector=vector).to_bytes()

    def forged_opened(kept: PastRounds, binding: pb.Binding, inputs: bytes | Mapping[str, bytes]) -> None:
        if binding.round == round_number and binding.step == last_step and isinstance(inputs, bytes):
            inputs = forged(inputs)
        opened(kept, binding, inputs)

    setattr(PastRounds, "opened", forged_opened)  # noqa: B010 -- the rewrite is the attack


def withhold_past(round_number: int) -> None:
    """Answer a fetch of training round `round_number`'s kept inputs as if it were not kept, though it applied."""
    served = PastRounds.input

    def withheld(kept: PastRounds, binding: pb.Binding) -> bytes | None:
        return None if binding.round == round_number else served(kept, binding)

    setattr(PastRounds, "input", withheld)  # noqa: B010 -- the rewrite is the attack


def serve_older(round_number: int, *, from_step: int) -> None:
    """Serve round `round_number` - 1's kept inputs of the stages from `from_step` on as round `round_number`'s."""
    opened, served = PastRounds.opened, PastRounds.input
    earlier: dict[int, bytes] = {}

    def remembering(kept: PastRounds, binding: pb.Binding, inputs: bytes | Mapping[str, bytes]) -> None:
        if binding.round == round_number - 1 and isinstance(inputs, bytes) and binding.stage == pb.STAGE_TRAIN:
            earlier[binding.step] = inputs  # as it was sent: kept past the round's removal
        opened(kept, binding, inputs)

    def older(kept: PastRounds, binding: pb.Binding) -> bytes | None:
        if binding.round == round_number and binding.step >= from_step:
            return earlier.get(binding.step)
        return served(kept, binding)

    setattr(PastRounds, "opened", remembering)  # noqa: B010 -- the rewrite is the attack
    setattr(PastRounds, "input", older)  # noqa: B010


def void_next(round_number: int) -> None:
    """Void round `round_number` + 1 once its sum verified; pause the loop 20 s once round `round_number` + 2 ended."""
    agreed, ended = checks.check_agreed_influence, PastRounds.ended
    rounds = iter(range(1, 1 << 30))  # the training rounds, in the order the loop checks their weights

    def voiding(*args: Any, **kwargs: Any) -> Any:
        if next(rounds) == round_number + 1:
            raise AggregateError("voided by the test's aggregator once its sum verified")
        return agreed(*args, **kwargs)

    def pausing(
        kept: PastRounds, ended_round: int, applied: bool, verified_by: Collection[str], roster: Collection[str]
    ) -> None:
        ended(kept, ended_round, applied, verified_by, roster)
        if ended_round == round_number + 2:
            print("paused", flush=True)
            time.sleep(20.0)

    setattr(loop, "check_agreed_influence", voiding)  # noqa: B010 -- the rewrite is the attack
    setattr(PastRounds, "ended", pausing)  # noqa: B010


def backdoor_initial() -> None:
    """Rewrite the server's initial state so that round 1's model has +1.0 on its first weight."""
    init = FedSRCVaR.server_init

    def backdoored(algorithm: FedSRCVaR, theta: torch.Tensor, c: float | None = None) -> server_step.ServerState:
        state = init(algorithm, theta, c)
        state.theta[0] += 1.0
        return state

    setattr(FedSRCVaR, "server_init", backdoored)  # noqa: B010 -- the rewrite is the attack


if __name__ == "__main__":
    if sys.argv[1] == "--framing-auditor":  # the auditor framing site-b: `fedfair auditor start ARGS` so rewritten
        frame(Role.HELPER)
        sys.exit(main(["auditor", "start", *sys.argv[2:]]))
    plan, forged_round = sys.argv[1], int(sys.argv[2])
    if sys.argv[3:] == ["model"]:
        flip(forged_round)
    elif sys.argv[3:] == ["initial"]:
        backdoor_initial()
    elif sys.argv[3:] in (["past"], ["bounded-past"]):
        forge_past(forged_round, bounded=sys.argv[3] == "bounded-past")
    elif sys.argv[3:] == ["withhold"]:
        withhold_past(forged_round)
    elif sys.argv[3:] in (["older"], ["older-tags"]):
        claim_step = TRAINING.wire(SECURE_ROUND.verify_stages[0]).step
        serve_older(forged_round, from_step=claim_step if sys.argv[3] == "older-tags" else 0)
    elif sys.argv[3:] == ["void-next"]:
        void_next(forged_round)
    elif sys.argv[3:] == ["bounded"]:
        forge_bounded(forged_round)
    elif sys.argv[3:] == ["frame"]:
        frame(Role.LEADER)
    elif sys.argv[3:] == ["false-seed"]:
        false_seed()
    elif sys.argv[3:] == ["tamper-one"]:
        tamper_one()
    elif sys.argv[3:] in (["one-share"], ["one-share-to-all"]):
        keep_one_share(to_all=sys.argv[3] == "one-share-to-all")
    else:
        forge(forged_round, EVALUATION if sys.argv[3:] == ["evaluation"] else TRAINING)
    sys.exit(main(["aggregator", "start", "--plan", plan]))
