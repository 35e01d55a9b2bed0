"""The collaborator's own steps in the masked round (SecAgg with verification), beside every kind's.

Every kind's steps (:func:`~fedfair.runtime.collaborator.steps.kind_steps`) check the round's parameters, start the
client and hand it the encoded input; the masked round's add: the survivors' signature, bound on disk before it
leaves (:func:`consistency`), and the verifying stages, which stop the site on a bad sum (:func:`tag`,
:func:`verdict`), whose verified sum steps the site's model chain.

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

from functools import partial

import numpy as np

from fedfair.core.errors import ProtocolError, Refusal, RefusedError, VerificationError, VerifyReason
from fedfair.runtime.collaborator.steps import (
    Participant,
    StageInput,
    Step,
    Work,
    kind_steps,
    not_asked,
    received,
    register_kind_steps,
    started,
    take,
    uploaded,
)
from fedfair.runtime.contract import ACCEPTED
from fedfair.runtime.transport import EVALUATE, TRAIN
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.round import AnyStage, SecureRound
from fedfair.secagg.verify_client import PLAIN_PIECE


def consistency(me: Participant, work: Work, inputs: StageInput) -> bytes:
    """This party's signature of the survivor set in `inputs`, bound on disk before it leaves.

    Raises RefusedError (:attr:`Refusal.WITHDRAWN`) when fewer survivors than the floor remain, or this input was
    already signed for with other survivors (two sums could then be subtracted).
    """
    protocol = work.stages.protocol
    spec = protocol.spec(protocol.committed)
    client = started(work, spec)
    survivor_set = received(spec, inputs)
    config = client.config
    # Ids outside the roster are the client's to refuse; the binding is checked before anything is signed.
    survivors = frozenset(config.name_of(party) for party in survivor_set.survivors if config.is_party(party))
    floor = me.survivor_floor
    if len(survivors) < floor:
        raise RefusedError(
            Refusal.WITHDRAWN,
            f"only {len(survivors)} survivors, fewer than the {floor} a round may have (the manifest's "
            "min_round_size, else max_colluding + 2): a sum that small could expose one institution's input",
        )
    if work.view.survivors is not None and work.view.survivors != survivors:
        raise RefusedError(
            Refusal.WITHDRAWN,
            "this input was already signed for with other survivors (in an earlier session or round, or before "
            "a restart); two sums over different survivors would let the aggregator subtract one from the other",
        )
    signature = uploaded(take(work, spec, partial(spec.take_step, client, survivor_set, not_asked)))
    work.view.bind(survivors)  # kept on disk before the signature leaves
    return signature


def tag(me: Participant, work: Work, inputs: StageInput) -> bytes:
    """This party's signed tags of its own input under the challenge of the sum the aggregator claims (`inputs`).

    Raises:
        VerificationError: the claim does not fit the round (MALFORMED) or differs from one tagged before
            (EQUIVOCATED): the aggregator misbehaves, and the process stops rather than withdraw.
        RefusedError: reason :attr:`Refusal.WITHDRAWN` when this party sent no masked input this round.
    """
    spec = work.stages.protocol.verify_stages[0]
    client = started(work, spec)
    try:
        claim = received(spec, inputs)
    except ProtocolError as error:  # unreadable: the aggregator's to answer for, as a claim that does not fit
        raise VerificationError(work.round, VerifyReason.MALFORMED, f"the claimed sum is unreadable: {error}") from None
    # The encoded input as the record kept it on disk (the job's view once it settled), read back a piece at a time
    # and handed down: no copy of the d + 1 words is held from masking to tagging.
    return bytes(take(work, spec, partial(client.tag, claim, work.view.read_words(PLAIN_PIECE))).to_bytes())


def verdict(me: Participant, work: Work, inputs: StageInput) -> bytes:
    """Check every survivor's tags (`inputs`) against the claimed sum and return the verdict.

    The verified sum (the encoded d + 1 words) is the only sum this site accepts a model of. A training round's
    is handed to the site's model chain, which applies the plan's server step to it and checks the next round's
    model against the result (:class:`~fedfair.runtime.collaborator.chain.ModelChain`); an evaluation's is made
    into the figures its kept bundle may carry (:mod:`~fedfair.runtime.collaborator.figures`). It keeps no copy.

    Raises:
        VerificationError: naming the round and the reason (FORGED, MISSING_TAG, BAD_TAG, MALFORMED).
        RefusedError: reason :attr:`Refusal.WITHDRAWN` when this party sent no masked input this round.
    """
    spec = verdicts_stage(work.stages.protocol)
    client = started(work, spec)
    try:
        tags = received(spec, inputs)
    except ProtocolError as error:
        raise VerificationError(work.round, VerifyReason.MALFORMED, f"the tags are unreadable: {error}") from None
    verified = take(work, spec, partial(spec.take_step, client, tags, not_asked))
    assert isinstance(verified, np.ndarray)  # a verdict's step returns the sum it verified
    if work.stages.start == TRAIN and work.view.survivors is not None:
        me.chain.verified(work.round, verified, work.view.survivors, client.config.encoder)
    elif work.stages.start == EVALUATE and work.view.survivors is not None:
        me.figures.verified(work.round, work.model, verified, work.view.survivors, client.config.encoder)
    return ACCEPTED


def verdicts_stage(protocol: SecureRound) -> AnyStage:
    """The verifying stage whose uploads are the survivors' verdicts (no message: :data:`ACCEPTED`)."""
    return next(spec for spec in protocol.verify_stages if spec.upload is None)


def masked_steps(protocol: SecureRound) -> dict[AnyStage, Step]:
    """The masked round's own steps, where the runtime adds to its client's.

    Beside every kind's (:func:`kind_steps`): the survivors' signature is bound on disk first, and the verifying
    stages stop the site on a bad sum.
    """
    steps: dict[AnyStage, Step] = {**kind_steps(protocol), protocol.spec(protocol.committed): consistency}
    if protocol.verify_stages:
        steps[protocol.verify_stages[0]] = tag
        steps[verdicts_stage(protocol)] = verdict
    return steps


register_kind_steps(SECURE_ROUND.name, masked_steps)
