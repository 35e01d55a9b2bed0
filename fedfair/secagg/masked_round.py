"""The masked round (SecAgg with verification) declared once, a round kind registered by name: its stages, in order.

:data:`SECURE_ROUND` is one :class:`~fedfair.secagg.round.SecureRound`, registered as a kind like any other: the
state machines (:class:`~fedfair.secagg.client.Client`, :class:`~fedfair.secagg.server.Server`) do each step, the
runners of :mod:`fedfair.secagg.round` keep the order.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from dataclasses import replace

from fedfair.secagg.client import Client
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import (
    AdvertiseKeys,
    ConsistencySignature,
    KeyDirectory,
    MaskedInput,
    MaskingSet,
    ShareBundle,
    ShareCheck,
    ShareKeys,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
)
from fedfair.secagg.resum import resum_decides
from fedfair.secagg.round import (
    Opening,
    RoundSetup,
    SecureRound,
    StageSpec,
    claim_input,
    register_round_kind,
    small_upload,
    tag_set_input,
    vector_upload,
)
from fedfair.secagg.server import AggregateResult, Server
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from fedfair.secagg.wire import Stage


def _key_directory(server: Server) -> Opening:
    directory = server.key_directory()
    return Opening(tuple(advertisement.sender for advertisement in directory.advertisements), directory)


def _bundles(server: Server) -> Opening:
    bundles = server.share_bundles()
    return Opening(tuple(sorted(bundles)), bundles)


def _masking_set(server: Server) -> Opening:
    masking = server.masking_set()
    return Opening(masking.parties, masking)


def _survivor_set(server: Server) -> Opening:
    survivors = server.survivor_set()
    return Opening(survivors.survivors, survivors)


def _unmask_request(server: Server) -> Opening:
    request = server.unmask_request()
    return Opening(request.survivors, request)


def _masked_server(config: SecAggConfig, setup: RoundSetup) -> Server:
    """SECURE_ROUND's server: the parties' certificates are checked as they advertise their keys."""
    return Server(config, setup.verify)


def _masked_client(
    config: SecAggConfig,
    setup: RoundSetup,
    name: str,
    identity_key: ec.EllipticCurvePrivateKey,
    credential: bytes,
    *,
    verified: bool = False,
) -> Client:
    """SECURE_ROUND's party: it relays its certificate as it advertises its keys, and checks its peers' so."""
    return Client(config, name, identity_key, credential, setup.verify, verified=verified)


def _every_party(server: Server) -> Opening:
    return Opening(tuple(map(server.config.party_id, server.config.parties)), None)


def _claim(server: Server, result: AggregateResult) -> Opening:
    """Each survivor's claim where the round is re-checked (its own peers' inputs), else one claim for every survivor.

    A re-checked round's shared part (the claim less the inputs) is what a site that missed the round checks.
    """
    if not server.config.rechecked:
        return Opening(result.contributors, server.claim())
    claims = server.claims()
    return Opening(result.contributors, claims, replace(next(iter(claims.values())), inputs=()))


def _tag_set(server: Server) -> Opening:
    tag_set = server.tag_set()
    return Opening(tuple(tag.sender for tag in tag_set.tags), tag_set)


def _tags_withheld(server: Server) -> str | None:
    """Why the survivors' tags must not be relayed: a tag is missing where the tags check the sum, or they do not add up.

    Relayed, either would make every survivor refuse the sum and stop; aborted instead, the model stays as it
    was and the federation goes on. Where every survivor's own re-sum decides (:func:`resum_decides`: the complete
    graph), the tags that arrived are relayed without the missing ones: the leavers' inputs are in the sum every
    survivor re-sums, from the claim or, above RESUMMED_WORDS, from the tag set (:meth:`Server.tag_set`). With no tag
    at all there is no survivor left to re-sum it (an honest one that found the claim forged tags nothing): nobody
    verified it, so it is never applied. In a re-checked round a survivor whose signed report is false is named and
    its tag dropped first (:meth:`Server.refuse_false_reports`), so it counts among the missing.
    """
    liars = [server.config.name_of(party) for party in server.refuse_false_reports()]
    # Why a dropped tag is missing, where the round is then void.
    false = f" ({', '.join(liars)} reported false re-checked values: named, and left out)" if liars else ""
    untagged = [server.config.name_of(party) for party in server.untagged]
    if len(untagged) == len(server.survivors):
        return f"no survivor tagged the claimed sum ({', '.join(untagged)} sent none{false}): nobody verified it"
    if untagged and resum_decides(server.config):
        return None
    if untagged:
        return f"no tag of the claimed sum from {', '.join(untagged)}{false}: nobody could verify it"
    if not server.tags_add_up():
        return (
            "the survivors' tags do not add up to the sum this aggregator unmasked: a survivor tagged "
            "something other than its input (verified aggregation cannot say which)"
        )
    return None


NO_INPUT = "no masked input was sent this round"

# Each stage by name, typed (its party, server, input and upload): a kind that reuses one takes it so.

ADVERTISE_KEYS_STAGE = StageSpec[Client, Server, None, AdvertiseKeys](
    Stage.ADVERTISE,
    "ADVERTISE_KEYS",
    "key advertisements",
    "evaluation key advertisements",
    received=None,
    step=lambda client, _nothing, _own: client.advertise(),
    upload=AdvertiseKeys.from_bytes,
    receive=Server.receive_advertisement,
    close=_key_directory,
    upload_bytes=small_upload,
    words="key exchange",
    unready="this round's client was never started",
)


SHARE_KEYS_STAGE = StageSpec[Client, Server, KeyDirectory, ShareKeys](
    Stage.SHARE,
    "SHARE_KEYS",
    "encrypted shares",
    "evaluation encrypted shares",
    received=KeyDirectory.from_bytes,
    step=lambda client, directory, _own: client.share_keys(directory),
    upload=ShareKeys.from_bytes,
    receive=Server.receive_shares,
    close=_bundles,
    upload_bytes=small_upload,
    words="sharing key parts",
    unready="no keys were advertised this round",
)


CHECK_SHARES_STAGE = StageSpec[Client, Server, ShareBundle, ShareCheck](
    Stage.CHECK,
    "CHECK_SHARES",
    "share checks",
    "evaluation share checks",
    received=ShareBundle.from_bytes,
    step=lambda client, bundle, _own: client.check_shares(bundle),
    upload=ShareCheck.from_bytes,
    receive=Server.receive_share_check,
    close=_masking_set,
    upload_bytes=small_upload,
    words="checking key parts",
    unready="no keys were shared this round",
)


MASKED_INPUT_STAGE = StageSpec[Client, Server, MaskingSet, MaskedInput](
    Stage.MASK,
    "MASKED_INPUT",
    "masked inputs",
    "masked evaluation sums",
    received=MaskingSet.from_bytes,
    step=lambda client, masking, own: client.masked_input(masking, own()),
    upload=MaskedInput.from_bytes,
    receive=Server.receive_masked_input,
    close=_survivor_set,
    upload_bytes=vector_upload,
    words="upload",
    unready="no shares were checked this round",
)


CONSISTENCY_STAGE = StageSpec[Client, Server, SurvivorSet, ConsistencySignature](
    Stage.CONSISTENCY,
    "CONSISTENCY",
    "consistency signatures",
    "evaluation consistency signatures",
    received=SurvivorSet.from_bytes,
    step=lambda client, survivors, _own: client.consistency(survivors),
    upload=ConsistencySignature.from_bytes,
    receive=Server.receive_consistency,
    close=_unmask_request,
    upload_bytes=small_upload,
    words="agreeing who is in",
    unready=NO_INPUT,
    repeatable=True,
)


UNMASK_STAGE = StageSpec[Client, Server, UnmaskRequest, UnmaskResponse](
    Stage.UNMASK,
    "UNMASK",
    "unmasking responses",
    "evaluation unmasking responses",
    received=UnmaskRequest.from_bytes,
    step=lambda client, request, _own: client.unmask(request),
    upload=UnmaskResponse.from_bytes,
    receive=Server.receive_unmask_response,
    close=None,
    upload_bytes=small_upload,
    words="unmasking the sum",
    unready=NO_INPUT,
    # It ends as soon as every secret can be rebuilt and checked: a survivor that withholds its
    # shares costs nothing once enough others answered.
    ready=Server.ready,
    repeatable=True,
    skippable=True,
)


VERIFY_CLAIM_STAGE = StageSpec[Client, Server, AggregateClaim, AggregateTag](
    Stage.VERIFY,
    "VERIFY_CLAIM",
    "tags of the claimed sum",
    "tags of the claimed evaluation sums",
    received=AggregateClaim.from_bytes,
    step=lambda client, claim, _own: client.tag(claim),
    upload=AggregateTag.from_bytes,
    receive=Server.receive_tag,
    close=_tag_set,
    upload_bytes=small_upload,
    input_bytes=claim_input,
    unready=NO_INPUT,
    withheld=_tags_withheld,
    repeatable=True,
)


VERIFY_TAGS_STAGE = StageSpec[Client, Server, TagSet, np.ndarray](
    Stage.VERIFY,
    "VERIFY_TAGS",
    "verdicts on the claimed sum",
    "verdicts on the claimed evaluation sums",
    received=TagSet.from_bytes,
    step=lambda client, tags, _own: client.verify(tags),
    upload=None,
    receive=None,
    close=None,
    upload_bytes=small_upload,
    input_bytes=tag_set_input,
    unready=NO_INPUT,
    repeatable=True,
)


SECURE_ROUND = register_round_kind(
    SecureRound(
        name="secagg-v3",
        sum_stages=(
            ADVERTISE_KEYS_STAGE,
            SHARE_KEYS_STAGE,
            CHECK_SHARES_STAGE,
            MASKED_INPUT_STAGE,
            CONSISTENCY_STAGE,
            UNMASK_STAGE,
        ),
        verify_stages=(
            VERIFY_CLAIM_STAGE,
            VERIFY_TAGS_STAGE,
        ),
        server=_masked_server,
        client=_masked_client,
        open_sum=_every_party,
        open_verification=_claim,
        contribution=Stage.MASK,
        committed=Stage.CONSISTENCY,
        kept=Stage.MASK,
        keeps_past_rounds=True,
    ),
    default=True,
)
"""The secure round this project runs: Bonawitz et al.'s six stages, then the two that verify the sum (the default
kind: every evaluation's, and a training round's where the plan names no other)."""
