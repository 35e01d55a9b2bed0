"""The client app: Algorithm 1's local steps on a site's own data, through `fedfair.core.local.LocalLearner`.

Each round the app builds the site's learner from the settings the strategy sent (the same objective head,
seeded sampler and per-sample loss `fedfair.api.federate` gives each client), loads the global pair, takes
the round's local steps and replies with [b_k dtheta, b_k dc, b_k]. A ClientApp keeps no state between
rounds (a SuperNode may run each round in a fresh process), so the sampler is replayed to the round's
place: seeded by the site's partition id, it draws the mini-batches fedfair's own collaborator draws.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedfair.core.data import ClientData, client_seed, local_batch_size
from fedfair.core.device import device_for
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner, PerSampleLoss
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
    whole,
)
from fedfair.simulation.federation import Batches, ModelFactory, client_tensors

DataLoaderFactory = Callable[[Context], Batches]
"""Loads the site's training data from its Flower context: a (features, labels) pair or a loader of them."""


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
) -> ClientApp:
    """A Flower ClientApp that trains `model_factory`'s model with FedSRCVaR on `load_data(context)`.

    `model_factory` and `loss` are what `fedfair.api.federate` takes (cross-entropy by default; a loss
    must return one value per sample). The app answers the strategy's size query with n_k and its
    partition id, and each train message with its weighted update; the data is loaded once per process.
    """
    app = ClientApp()
    loaded: dict[int, ClientData] = {}

    def site_data(context: Context) -> tuple[int, ClientData]:
        partition = partition_of(context)
        if partition not in loaded:
            loaded[partition] = client_tensors(f"partition-{partition}", load_data(context))
        return partition, loaded[partition]

    @app.query()
    def size(message: Message, context: Context) -> Message:
        partition, data = site_data(context)
        metrics = MetricRecord({EXAMPLES: data.size, PARTITION: partition})
        return Message(RecordDict({METRICS: metrics}), reply_to=message)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        partition, data = site_data(context)
        config = dict(message.content.config_records[CONFIG].items())
        settings = FlowerSettings.from_config(config)
        learner = site_learner(model_factory, data, settings, batch_size(config, data.size), partition, loss, device)
        replay_sampler(learner, whole(config[SERVER_ROUND], "the server round"))
        theta, c = read_pair(message.content.array_records[ARRAYS])
        update = learner.train_round(theta, c)
        vector = torch.cat([update.weighted_vector(torch.float64), torch.tensor([update.weight], dtype=torch.float64)])
        content = RecordDict(
            {
                ARRAYS: ArrayRecord(array_dict={UPDATE: Array(vector.numpy())}),
                METRICS: MetricRecord({EXAMPLES: int(update.weight), PARTITION: partition}),
            }
        )
        return Message(content, reply_to=message)

    return app


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
