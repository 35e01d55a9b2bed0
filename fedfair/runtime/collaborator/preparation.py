"""Joining a federation: fetch and check the plan, then prepare this institution's data and learner.

:func:`join` fetches the plan's shared settings and checks them against what this
institution allows (its federation, its manifest, the model factories it trusts) before
anything is built. Without a [schema] the data is cut and the learner built at once
(:func:`prepare`); under a [schema] the table is checked now and encoded once the
statistics of every site's table arrive with the first start stage (:func:`encode_table`,
`fedfair.runtime.preprocessing`). A plan served once joined is the peer's to check (`plan_change`).

The learner is built exactly as the in-process simulation builds client i (same model
seed, same sampler seed), and kept for the whole process: it holds the drift
correction's sigma_k across rounds.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedfair.core.errors import ConfigError, PermanentFailureError, WireError
from fedfair.core.local import LocalLearner, RoundTrainer
from fedfair.core.models import flat_parameters
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.statistics import noised_statistics_vector, statistics_vector
from fedfair.runtime.collaborator.charges import open_ledger, open_record
from fedfair.runtime.peer.connection import get_plan
from fedfair.runtime.collaborator.consent import check_input_bound
from fedfair.runtime.collaborator.input_record import InputRecord
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.collaborator.identity import Identity
from fedfair.runtime.collaborator.receipt import federation_file
from fedfair.runtime.peer.retries import Backoff
from fedfair.runtime.collaborator.steps import Participant
from fedfair.runtime.collaborator.trainer import (
    LocalData,
    LocalTable,
    SchemaTable,
    TrainerFactory,
    build_learner,
    check_schema_table,
    encoded_data,
)
from fedfair import pki
from fedfair.runtime.composition_counts import composition_columns
from fedfair.runtime.failures import FEDERATION_MISMATCH, LOCAL_PRIVACY, plan_mismatch
from fedfair.runtime.manifest_plan import check_shared_settings
from fedfair.runtime.plan.aggregator_plan import SharedSettings, json_object, load_shared_settings
from fedfair.runtime.plan.kind_checks import check_plan_at_size
from fedfair.runtime.plan.model import ModelSettings
from fedfair.runtime.preprocessing import model_for, read_encoder_payload
from fedfair.runtime.plan.privacy import privacy_shortfall
from fedfair.runtime.transport import pb_grpc

logger = logging.getLogger("fedfair.collaborator")


def as_participant(
    config: CollaboratorConfig,
    identity: Identity,
    shared: SharedSettings,
    parameters: int,
    model: ModelSettings | None = None,
    outcome: OutcomeRecord | None = None,
) -> Participant:
    """This collaborator as the aggregations know it, for a model of `parameters` parameters.

    `model` is the plan's model as this site builds it (under a [schema], sized by the federation's encoder):
    its model chain takes round 1's model only if it is that model built from the plan's seed. None: no model
    is built yet (the statistics aggregation), so no round 1 is checked. `outcome` keeps the liars its bounded
    rounds' verdict records name.
    """
    initial = None if model is None else functools.partial(initial_parameters, model, shared.training.seed, config)
    return Participant(
        config.name,
        shared,
        parameters,
        identity.key,
        identity.credential,
        identity.verify,
        config.manifest,
        config.source.parent,
        initial,
        None if model is None else model.classes,
        ca_certificate=pki.load_certificate(config.certificates.ca),
        outcome=outcome,
    )


def initial_parameters(model: ModelSettings, seed: int, config: CollaboratorConfig) -> torch.Tensor:
    """The plan's initial model as this site builds it: `model` under the plan's `seed`, its parameters flat.

    The aggregator builds round 1's model the same way (``fedfair.runtime.aggregator.bundles.initial_state``), so
    an honest one sends these values bit for bit; a factory is built only if this site's own config allows it.
    """
    return flat_parameters(model.build(seed, allowed=config.factories))


def check_plan_fits(shared: SharedSettings, parameters: int | None) -> None:
    """Refuse a plan the training kind's rounds cannot run at this site's model of `parameters` numbers.

    The kind's own check (:func:`~fedfair.runtime.plan.kind_checks.check_plan_at_size`), as the aggregator runs it
    before round 1; None: as the plan arrives, before the model is built (the bounds alone). A site so refused
    says why before round 1 rather than failing every round.

    Raises:
        PermanentFailureError: ``plan-mismatch``, the check's message naming the cause and the fix.
    """
    try:
        check_plan_at_size(shared, shared.collaborator_count, "the aggregator's plan", parameters)
    except ConfigError as error:
        raise plan_mismatch("collaborator", error) from None


@dataclass(frozen=True)
class Joined:
    """The federation as its fetched plan describes it, checked against this institution's config."""

    shared: SharedSettings
    plan_digest: str
    settings: dict[str, Any]
    """The shared settings as served (JSON values), which the final model bundle must hold."""
    record: InputRecord
    """What this institution answered, to whom, and the bits it sent (:mod:`fedfair.runtime.collaborator.input_record`)."""
    outcome: OutcomeRecord
    """The rounds this institution contributed to and the models it was sent (:mod:`.outcome`)."""
    participant: Participant
    """This collaborator before its model is built (no parameters): what the statistics aggregation needs."""
    schema_table: SchemaTable | None = None
    """Under a [schema], the checked table, encoded once the federation's encoder arrives."""
    statistics: np.ndarray | None = None
    """Under a [schema], the statistics of this institution's table (counts and sums only)."""


def join(
    stub: pb_grpc.FederationStub,
    config: CollaboratorConfig,
    backoff: Backoff,
    identity: Identity,
    table: LocalTable,
    reset_state: bool = False,
) -> Joined:
    """Fetch and check the plan, and load this institution's record of that federation.

    Under a [schema] it also checks this institution's table against the plan. `reset_state`: the
    operator accepts that a lost record starts again.

    Raises:
        PermanentFailureError: the plan or record does not fit; its failure class names the fix.
    """
    # Joined without naming the federation, so that another federation's aggregator answers with
    # its id (compared below, named in the message) rather than a generic refusal of the binding.
    reply = backoff.call("fetching the plan", lambda: get_plan(stub, "collaborator", config.aggregator))
    try:
        served = json_object(reply.settings, "the aggregator's plan")
        shared = load_shared_settings(reply.settings)
    except ConfigError as error:
        raise plan_mismatch("collaborator", error) from None
    ours, theirs = config.federation, shared.federation_id
    if ours is not None and theirs != ours:
        raise PermanentFailureError(FEDERATION_MISMATCH, address=config.aggregator, theirs=theirs, ours=ours)
    if config.manifest is not None:
        try:
            check_shared_settings(config.manifest, shared, served)
        except ConfigError as error:
            raise plan_mismatch("collaborator", error) from None
    check_input_bound(shared, config.refused_auditors, config.manifest, config.source)
    check_plan_fits(shared, None)  # no model is built yet: the training kind's bounds alone
    factory = shared.model.factory
    if factory is not None and factory not in config.factories:
        # Checked before anything is built: a plan is data, and only this institution's own config
        # may let it name code to run here.
        raise plan_mismatch(
            "collaborator",
            f"it names the model factory '{factory}', which this institution does not allow, so it "
            f"was not imported; if you trust that code, list it in {config.source} under [model] "
            f"factories",
        )
    shortfall = privacy_shortfall(config.privacy, shared.privacy, shared.secure_aggregation.enabled)
    if shortfall is not None:
        raise plan_mismatch("collaborator", shortfall)
    record = open_record(config, shared.federation_id, open_ledger(config), reset=reset_state)
    outcome = OutcomeRecord(
        federation_file(config, shared.federation_id, OUTCOME_SUFFIX), shared.training.average_from_round
    )
    joined = Joined(shared, reply.plan_digest, served, record, outcome, as_participant(config, identity, shared, 0))
    if shared.schema is None:
        return joined
    # The table is checked now, before any round; it is encoded once the statistics of every
    # site's table arrive with the first TRAIN stage (fedfair.runtime.preprocessing).
    # Its warnings were logged before connecting when the manifest pins the plan (check_pinned_table).
    pinned = config.manifest is not None and config.manifest.plan is not None
    schema_table = check_schema_table(config, shared, table, warn=not pinned)
    # Under the plan's [privacy] the noised layout (values clipped into public ranges, nothing withheld),
    # whose noise the statistics step adds and charges (Charges.statistics).
    describe = noised_statistics_vector if shared.privacy.noised else statistics_vector
    statistics = describe(shared.schema, schema_table.train, schema_table.source)
    return dataclasses.replace(joined, schema_table=schema_table, statistics=statistics)


def say_joined(config: CollaboratorConfig, joined: Joined, prepared: Prepared | None, device: torch.device) -> None:
    """Log that this institution joined: once the aggregator took its task stream, never before.

    Under a [schema], what fits the plan's schema (the model is built once the statistics arrive); without
    one, the trainer that `prepared` holds.
    """
    shared, table = joined.shared, joined.schema_table
    secure = "on" if shared.secure_aggregation.enabled else "OFF"
    if table is not None:
        logger.info(
            "%s: joined federation %s (secure aggregation %s); %d training and %d held-out rows fit the "
            "plan's schema; waiting for the federation's statistics",
            config.name,
            shared.federation_id,
            secure,
            len(table.train),
            len(table.test),
        )
    elif prepared is not None and prepared.data is not None and prepared.learner is not None:
        logger.info(
            "%s: joined federation %s (secure aggregation %s); %d training rows, batch %d, %d held-out rows, device %s",
            config.name,
            shared.federation_id,
            secure,
            prepared.data.train.size,
            prepared.learner.batch_size,
            prepared.data.test.size,
            device,
        )
    else:  # a trainer that brings no learner of fedfair's (benchmarks/round_bench.py)
        logger.info("%s: joined federation %s (secure aggregation %s)", config.name, shared.federation_id, secure)


def encode_table(
    config: CollaboratorConfig, joined: Joined, payload: bytes
) -> tuple[LocalData, SharedSettings, Encoder]:
    """Encode this institution's table with the federation's encoder (`payload`).

    `payload` is the first start stage's input under a [schema]. Returns the encoded data (with its
    held-out rows' levels in the plan's composition columns), the plan's settings with the model
    that encoder implies, and the encoder (the final model bundle must hold it).

    Raises:
        WireError: `payload` is not an encoder for the plan's schema.
    """
    schema = joined.shared.schema
    assert schema is not None and joined.schema_table is not None
    try:
        encoder = read_encoder_payload(payload, schema)
    except ConfigError as error:
        raise WireError(str(error)) from None
    # The held-out rows' levels in the plan's composition columns are kept for the final evaluation.
    composition = composition_columns(schema, joined.shared.evaluation.composition)
    with_model = dataclasses.replace(joined.shared, model=model_for(joined.shared.model, encoder, config.factories))
    return encoded_data(config, joined.schema_table, encoder, composition), with_model, encoder


@dataclass(frozen=True)
class Prepared:
    """What trains and evaluates here: the round trainer and, for fedfair's own learner, its data."""

    trainer: RoundTrainer
    learner: LocalLearner | None
    """The learner the trainer wraps, kept for the whole process; None for a trainer that brings no
    learner of fedfair's (benchmarks/round_bench.py)."""
    parameters: int
    """The model's number of parameters: a training update is this long, plus c."""
    data: LocalData | None = None
    evaluation_model: torch.nn.Module | None = None


def prepare(
    config: CollaboratorConfig,
    data: LocalData,
    shared: SharedSettings,
    device: torch.device,
    trainer_factory: TrainerFactory,
) -> Prepared:
    """Build the round trainer and the evaluation model for this institution's encoded data."""
    learner = build_learner(data, shared, device, config.factories, name=config.name)
    try:
        trainer = trainer_factory(learner, config, shared)
    except PermanentFailureError:
        raise
    except ConfigError as error:  # [privacy] settings, or the accountant's state file
        raise PermanentFailureError(LOCAL_PRIVACY, reason=error, config=config.source) from None
    parameters = int(flat_parameters(learner.model).numel())
    check_plan_fits(shared, parameters)
    evaluation_model = shared.model.build(allowed=config.factories).to(device)
    if shared.schema is None:
        return Prepared(trainer, learner, parameters, data, evaluation_model)  # say_joined says it once joined
    logger.info(
        "%s: ready to train in federation %s (secure aggregation %s); %d training rows, batch %d, %d held-out rows, "
        "device %s",
        config.name,
        shared.federation_id,
        "on" if shared.secure_aggregation.enabled else "OFF",
        data.train.size,
        learner.batch_size,
        data.test.size,
        device,
    )
    return Prepared(trainer, learner, parameters, data, evaluation_model)
