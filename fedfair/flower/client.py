"""The client app: Algorithm 1's local steps on a site's own data, through `fedfair.core.local.LocalLearner`.

Each round the app builds the site's learner from the settings the strategy sent (the same objective head,
seeded sampler and per-sample loss `fedfair.api.federate` gives each client), loads the global pair, takes
the round's local steps and replies with [b_k dtheta, b_k dc, b_k] (under SecAgg+, (dtheta, dc) and b_k for
Flower's mod to weight and mask). A ClientApp keeps no state between
rounds (a SuperNode may run each round in a fresh process), so the sampler is replayed to the round's
place: seeded by the site's partition id, it draws the mini-batches fedfair's own collaborator draws.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.typing import ConfigRecordValues
from flwr.clientapp import ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE
from flwr.compat.common import recorddict_compat

from fedfair.core.data import ClientData, client_seed, local_batch_size
from fedfair.core.device import device_for
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner, PerSampleLoss
from fedfair.core.update import Update
from fedfair.core.models import seeded, trainable_module
from fedfair.core.objective import RCVaRThreshold
from fedfair.flower.settings import (
    ARRAYS,
    BATCH_FRACTION,
    BATCH_SIZE,
    CONFIG,
    EXAMPLES,
    METRICS,
    PARTITION,
    SERVER_ROUND,
    UPDATE,
    FlowerSettings,
    read_pair,
    vector_of,
    whole,
)
from fedfair.simulation.federation import Batches, ModelFactory, client_tensors

DataLoaderFactory = Callable[[Context], Batches]
"""Loads the site's training data from its Flower context: a (features, labels) pair or a loader of them."""
LocalUpdate = Callable[[Context, Mapping[str, ConfigRecordValues], torch.Tensor, float], tuple[int, Update]]
"""A site's round: (context, the round's config, theta, c) to (its partition id, its update)."""


def partition_of(context: Context) -> int:
    """The site's partition id, its place in the federation.

    Raises:
        ConfigError: when the node config has none (a SuperNode started without it).
    """
    if PARTITION not in context.node_config:
        raise ConfigError(
            f"this SuperNode has no '{PARTITION}' in its node config; start it with "
            "--node-config 'partition-id=K num-partitions=N' (K from 0), which also seeds its sampler"
        )
    return whole(context.node_config[PARTITION], f"the node config's {PARTITION}")


def client_app(
    model_factory: ModelFactory,
    load_data: DataLoaderFactory,
    *,
    loss: PerSampleLoss | None = None,
    device: str = "cpu",
    require_secaggplus: bool = False,
) -> ClientApp:
    """A Flower ClientApp that trains `model_factory`'s model with FedSRCVaR on `load_data(context)`.

    `model_factory` and `loss` are what `fedfair.api.federate` takes (cross-entropy by default; a loss
    must return one value per sample). The app answers the strategy's size query with n_k and its
    partition id, and each train message with its weighted update; the data is loaded once per process.
    A server that trains through `fedfair.flower.secaggplus.train_with_secaggplus` gets Flower's
    `secaggplus_mod` instead: the site replies (dtheta, dc) with weight b_k, which the mod scales, quantises
    and masks (docs/flower.md, "Under SecAgg+"). With `require_secaggplus` the site refuses to train for a
    server that does not mask its update.
    """
    app = ClientApp(mods=[secaggplus_when_asked])
    loaded: dict[int, ClientData] = {}

    def site_data(context: Context) -> tuple[int, ClientData]:
        partition = partition_of(context)
        if partition not in loaded:
            loaded[partition] = client_tensors(f"partition-{partition}", load_data(context))
        return partition, loaded[partition]

    def local_update(
        context: Context, config: Mapping[str, ConfigRecordValues], theta: torch.Tensor, c: float
    ) -> tuple[int, Update]:
        partition, data = site_data(context)
        settings = FlowerSettings.from_config(config)
        learner = site_learner(model_factory, data, settings, batch_size(config, data.size), partition, loss, device)
        replay_sampler(learner, whole(config[SERVER_ROUND], "the server round"))
        return partition, learner.train_round(theta, c)

    @app.query()
    def size(message: Message, context: Context) -> Message:
        partition, data = site_data(context)
        metrics = MetricRecord({EXAMPLES: data.size, PARTITION: partition})
        return Message(RecordDict({METRICS: metrics}), reply_to=message)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        if RECORD_KEY_CONFIGS in message.content.config_records:
            return Message(masked_reply(message, context, local_update), reply_to=message)
        if require_secaggplus:
            raise ConfigError(
                "this site trains only under SecAgg+ (require_secaggplus) and the server sent its round unmasked; "
                "run the ServerApp with fedfair.flower.secaggplus.train_with_secaggplus"
            )
        config = dict(message.content.config_records[CONFIG].items())
        theta, c = read_pair(message.content.array_records[ARRAYS])
        partition, update = local_update(context, config, theta, c)
        vector = torch.cat([update.weighted_vector(torch.float64), torch.tensor([update.weight], dtype=torch.float64)])
        content = RecordDict(
            {
                ARRAYS: ArrayRecord(array_dict={UPDATE: Array(vector.numpy())}),
                METRICS: MetricRecord({EXAMPLES: int(update.weight), PARTITION: partition}),
            }
        )
        return Message(content, reply_to=message)

    return app


def secaggplus_when_asked(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower's `secaggplus_mod` for a message of SecAgg+'s stages; any other message goes straight through."""
    if RECORD_KEY_CONFIGS in message.content.config_records:
        return secaggplus_mod(message, context, call_next)
    return call_next(message, context)


def batch_size(config: Mapping[str, object], num_samples: int) -> int:
    """b_k: the strategy's share of the total batch, or round(fraction * n_k) in a federation of fractions."""
    if BATCH_SIZE in config:
        return whole(config[BATCH_SIZE], "the batch size")
    fraction = config.get(BATCH_FRACTION)
    if isinstance(fraction, float):
        return local_batch_size(num_samples, fraction)
    raise ConfigError("the train message names no batch size; run fedfair.flower.FedSRCVaRStrategy on the server")


def site_learner(
    model_factory: ModelFactory,
    data: ClientData,
    settings: FlowerSettings,
    batch: int,
    partition: int,
    loss: PerSampleLoss | None,
    device: str,
) -> LocalLearner:
    """The site's learner, as `fedfair.simulation.rounds.make_learners` builds collaborator `partition`'s."""
    model = trainable_module(seeded(model_factory, settings.seed), "the model factory")
    model = model.to(device_for(device), settings.torch_dtype)
    threshold = RCVaRThreshold(settings.objective, dtype=settings.torch_dtype).to(device_for(device))
    return LocalLearner(
        model,
        data.features,
        data.labels,
        batch,
        settings.local,
        threshold=threshold,
        seed=client_seed(settings.seed, partition),
        loss=loss,
    )


def replay_sampler(learner: LocalLearner, server_round: int) -> None:
    """Draw the batches rounds 1 .. server_round - 1 took, so this round draws its own (one per local step)."""
    for _ in range((server_round - 1) * learner.config.local_steps):
        learner.sampler.next_batch()


def masked_reply(message: Message, context: Context, local_update: LocalUpdate) -> RecordDict:
    """A site's reply under `secaggplus_mod`: its (dtheta, dc) with weight b_k, as the mod reads a fit result.

    Raises:
        ConfigError: when the mod would clip the update (b_k / max_weight * |entry| > clipping_range) or
            weight it past max_weight: either would change the model silently, so the site refuses instead.
    """
    fitins = recorddict_compat.recorddict_to_fitins(message.content, keep_input=True)
    pair = torch.from_numpy(vector_of(fitins.parameters))
    partition, update = local_update(context, fitins.config, pair[:-1], float(pair[-1]))
    delta = torch.cat([update.delta.detach().to(torch.float64).reshape(-1), torch.tensor([update.delta_c])]).numpy()
    check_unclipped(delta, update.weight, context)
    fitres = FitRes(
        Status(Code.OK, "FedSRCVaR local steps"),
        ndarrays_to_parameters([delta]),
        num_examples=int(update.weight),
        metrics={PARTITION: partition},
    )
    return recorddict_compat.fitres_to_recorddict(fitres, keep_input=True)


def check_unclipped(delta: np.ndarray, weight: float, context: Context) -> None:
    """Refuse an update `secaggplus_mod` would clip or overweight (its settings are in the context's state).

    Raises:
        ConfigError: naming the workflow setting to raise.
    """
    state = context.state.config_records.get(RECORD_KEY_STATE)
    if state is None or "clipping_range" not in state:
        raise ConfigError("this train message came without SecAgg+'s setup stage; run the server's SecAggPlusWorkflow")
    clipping_range, max_weight = float(cast(float, state["clipping_range"])), float(cast(float, state["max_weight"]))
    if weight > max_weight:
        raise ConfigError(
            f"this site's weight b_k = {weight:g} exceeds SecAggPlusWorkflow's max_weight {max_weight:g}; "
            "raise max_weight to the largest b_k"
        )
    largest = weight / max_weight * float(np.abs(delta).max())
    if largest > clipping_range:
        raise ConfigError(
            f"SecAgg+ would clip this site's update (b_k / max_weight * |entry| = {largest:.3g} > clipping_range "
            f"{clipping_range:g}) and train another model than FedSRCVaR's; raise SecAggPlusWorkflow's clipping_range"
        )
