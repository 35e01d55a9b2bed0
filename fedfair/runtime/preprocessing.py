"""Federated preprocessing: the one secure sum before training that gives every site the same encoder.

With a ``[schema]`` the aggregator runs a *statistics aggregation* before round 1: each
collaborator checks its table and sends its statistics (exact, or under ``report_epsilon``
noised and charged: :mod:`fedfair.datasets.statistics`) through the six secure-aggregation
stages of an evaluation, bound to round 0. Only the total is revealed. The aggregator turns it
into the :class:`~fedfair.datasets.schema.Encoder` and serves the encoder's JSON as
the input of every TRAIN stage, so a collaborator that joins (or rejoins) later
encodes with the same statistics; the encoder also goes into the model bundle.

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Collection

from fedfair.core.errors import ConfigError
from fedfair.core.models import load_factory
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import Schema
from fedfair.datasets.statistics import (
    NOISED_MAX_SITE_ROWS,
    NOISED_STATISTICS_FRACTIONAL_BITS,
    STATISTICS_CLIP,
    STATISTICS_FRACTIONAL_BITS,
    STATISTICS_MAX_WEIGHT,
    STATISTICS_MODULUS_BITS,
)
from fedfair.runtime.plan.aggregator_plan import json_object
from fedfair.runtime.plan.model import ModelSettings
from fedfair.secagg import EncodingConfig

STATISTICS_ROUND = 0
"""The statistics aggregation is bound to round 0 (training rounds count from 1)."""

STATISTICS_KIND = "statistics"
"""RoundParameters.kind of the statistics aggregation (training is "train", evaluation "evaluate")."""

STATISTICS_ENCODING = EncodingConfig(
    clip=STATISTICS_CLIP,
    max_weight=STATISTICS_MAX_WEIGHT,
    fractional_bits=STATISTICS_FRACTIONAL_BITS,
    modulus_bits=STATISTICS_MODULUS_BITS,
)
"""How a statistics vector is encoded: integers below 2^47, weight 1, summed exactly modulo 2^64."""

NOISED_STATISTICS_ENCODING = EncodingConfig(
    clip=float(NOISED_MAX_SITE_ROWS),
    max_weight=STATISTICS_MAX_WEIGHT,
    fractional_bits=NOISED_STATISTICS_FRACTIONAL_BITS,
    modulus_bits=STATISTICS_MODULUS_BITS,
)
"""How a noised statistics vector is encoded (each party then adds its Skellam share to the words):
coordinates below 2^32, 2^-12 resolution, weight 1, modulo 2^64."""


def statistics_encoding(noised: bool) -> EncodingConfig:
    """The statistics' encoding: the noised layout's when the plan's [privacy] noises them, else the exact one's."""
    return NOISED_STATISTICS_ENCODING if noised else STATISTICS_ENCODING


MAX_ENCODER_BYTES = 4 << 20
"""An encoder's JSON is a few KB per hundred features; anything past this is not one."""


def encoder_payload(encoder: Encoder) -> bytes:
    """The encoder as canonical JSON: the TRAIN stage's input when the plan has a schema."""
    return json.dumps(encoder.to_mapping(), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def read_encoder_payload(payload: bytes, schema: Schema, source: str = "the aggregator's encoder") -> Encoder:
    """Parse an encoder sent by the aggregator, refusing one that is not for this plan's schema."""
    if len(payload) > MAX_ENCODER_BYTES:
        raise ConfigError(f"{source}: {len(payload):,} bytes, more than an encoder can be; the aggregator is faulty")
    encoder = Encoder.from_mapping(json_object(payload, source), source)
    if encoder.schema != schema:
        raise ConfigError(
            f"{source} is for another schema than the plan's [schema]; the aggregator is faulty or runs another plan"
        )
    return encoder


def model_for(model: ModelSettings, encoder: Encoder, allowed: Collection[str] = ()) -> ModelSettings:
    """The plan's [model] with the input size and classes the schema's encoder gives.

    Nobody knows the input size before the statistics aggregation (learnt categories
    decide it), so a model factory is handed ``features`` and ``classes`` as keyword
    arguments when its signature takes them (or any keyword), over what [model]
    arguments say: the encoder is what the model will be fed. Reading the factory's signature
    imports it, so ``allowed`` (this party's own list) must name it.
    """
    sizes = {"features": encoder.num_features, "classes": len(encoder.class_names)}
    arguments = model.arguments
    if model.factory is not None:
        parameters = inspect.signature(load_factory(model.factory, allowed)).parameters
        takes_any = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())
        arguments = {**arguments, **{key: value for key, value in sizes.items() if takes_any or key in parameters}}
    return dataclasses.replace(model, features=sizes["features"], classes=sizes["classes"], arguments=arguments)
