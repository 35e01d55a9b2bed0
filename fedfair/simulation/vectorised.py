"""All K collaborators' local steps as one batched computation, for the in-process federation.

`VectorisedClients.blocker` says why a federation cannot be vectorised (buffers such as
BatchNorm's running statistics, random layers, samples that interact within a batch, an
operation vmap does not support); the simulation then keeps the loop.

Why: docs/design.md, "Inside the simulation".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedfair.core import server
from fedfair.core.algorithm import ClientRound
from fedfair.core.local import LocalLearner
from fedfair.core.update import Update
from fedfair.core.objective import RCVaRThreshold

COUPLING_TOLERANCE = 1e-4
"""Relative change of a sample's loss, when another sample joins its batch, above which samples interact.

A model that mixes samples (batch statistics) changes a loss by far more; independent
samples change it only by the kernel's reduction order (float32: about 1e-7)."""


@dataclass(frozen=True)
class StackedUpdates:
    """One round's updates of all K collaborators, one row per client (the loop's `Update`s, stacked)."""

    deltas: torch.Tensor
    """[K, D] theta_k - theta_t in the model's dtype and device, as `LocalLearner.finish` computes it."""
    delta_c: torch.Tensor
    """[K] c_k - c_t in float64 (zeros without a threshold)."""
    weights: tuple[float, ...]
    """w_k = b_k."""
    controls: torch.Tensor | None = None
    """[K, D + 1] each client's new control variate sigma_k+ (float64), with drift correction."""

    def updates(self) -> list[Update]:
        """The per-client `Update`s, for an aggregation that needs them one by one (e.g. secure sums)."""
        controls: list[torch.Tensor | None] = (
            [None] * len(self.weights) if self.controls is None else list(self.controls)
        )
        return [
            Update(delta=delta, delta_c=float(delta_c), weight=weight, control=control)
            for delta, delta_c, weight, control in zip(self.deltas, self.delta_c, self.weights, controls, strict=True)
        ]

    def plain_sum(self) -> server.Aggregate:
        """`server.Aggregate.of(self.updates())` without building K updates: the same float operations.

        Each row is [delta_k in float64, delta_c_k(, sigma_k+)] * w_k, as `Update.weighted_vector` makes
        it, and the rows are summed over the client axis of one tensor, as `Aggregate.of` sums its
        stack, so the result is bit-for-bit the loop's.
        """
        parts = [self.deltas, self.delta_c.unsqueeze(1)]
        if self.controls is not None:
            parts.append(self.controls)
        # The rows widened into one float64 block and scaled in place: no [K, D] temporary beside it.
        rows = torch.empty(len(self.weights), sum(part.shape[1] for part in parts), dtype=torch.float64)
        start = 0
        for part in parts:
            rows[:, start : start + part.shape[1]].copy_(part)
            start += part.shape[1]
        rows.mul_(torch.tensor(self.weights, dtype=torch.float64).unsqueeze(1))
        summed = rows.sum(dim=0)
        return server.Aggregate.from_vector(summed, sum(self.weights), with_control=self.controls is not None)


CLIENTS_PER_GROUP = 2
"""Batching pays once each padded group replaces at least this many clients of the loop, plus one group's worth
for stacking and gathering: measured on Adult's logistic regression, a batched group costs about 1.5 loop
clients, so 3 clients by race (2 groups) are faster in the loop and 51 (1 or 2 groups) are 10-20x faster batched."""

FREE_PADDING_ROWS = 64
"""Padding rows per client that cost less than evaluating one more group (a handful of batched ops)."""


def size_groups(batch_sizes: Sequence[int]) -> list[list[int]]:
    """Clients (indices, ascending) grouped so that padding each group to its largest batch stays cheap.

    One group pads every batch to the federation's largest, which for very uneven clients
    (a country of 29,000 rows beside one of 10) multiplies the work many times over. Taking
    clients from the largest batch down, a client joins the current group while the group's
    padding stays within its real rows plus `FREE_PADDING_ROWS` per client; otherwise it
    starts the next group. Near-equal clients make one group; padding never more than
    doubles the rows (plus the free ones), at the cost of one more batched evaluation per group.
    """
    order = sorted(range(len(batch_sizes)), key=lambda client: -batch_sizes[client])
    groups: list[list[int]] = []
    width = real = 0
    for client in order:
        size = batch_sizes[client]
        members = len(groups[-1]) + 1 if groups else 1
        if groups and width * members - (real + size) <= real + size + FREE_PADDING_ROWS * members:
            groups[-1].append(client)
            real += size
        else:
            groups.append([client])
            width, real = size, size
    return [sorted(group) for group in groups]


@dataclass(frozen=True)
class PaddedGroup:
    """Clients whose batches are padded to one width and evaluated as one vmap call.

    Client `members[j]`'s b real rows sit at j * width, ..., j * width + b - 1 of the
    group's [len(members) * width] block; the rest is padding.
    """

    members: tuple[int, ...]
    clients: torch.Tensor
    """The members as an index into the stacked client axis (on the model's device)."""
    width: int
    positions: torch.Tensor
    """Where each real row goes in the block, in member order."""
    row_offsets: torch.Tensor
    """Each real row's client start in the concatenated data (sampler indices are per client)."""
    padding: torch.Tensor
    """The block's default gather: each member's own first row, real (finite) data of weight zero."""
    row_weights: torch.Tensor
    """[members, width]: 1 / b_k on real rows, as the loop's mean weighs them, 0 on padding."""

    @classmethod
    def build(
        cls,
        members: Sequence[int],
        batch_sizes: Sequence[int],
        starts: Sequence[int],
        dtype: torch.dtype,
        device: torch.device,
    ) -> PaddedGroup:
        """The group of `members`, whose data starts at `starts[k]` in the concatenated rows."""
        sizes = [batch_sizes[client] for client in members]
        width = max(sizes)
        positions = torch.cat([torch.arange(size) + slot * width for slot, size in enumerate(sizes)])
        row_offsets = torch.cat(
            [torch.full((size,), starts[client], dtype=torch.long) for client, size in zip(members, sizes, strict=True)]
        )
        padding = torch.tensor([starts[client] for client in members], dtype=torch.long).repeat_interleave(width)
        real = torch.zeros(len(members) * width, dtype=torch.bool)
        real[positions] = True
        # 1 / b_k computed in the model's dtype, as the mean's backward computes it.
        per_client = torch.ones(len(members), dtype=dtype) / torch.tensor(sizes, dtype=dtype)
        row_weights = real.view(len(members), width) * per_client.unsqueeze(1)
        return cls(
            members=tuple(members),
            clients=torch.tensor(members, dtype=torch.long, device=device),
            width=width,
            positions=positions,
            row_offsets=row_offsets,
            padding=padding,
            row_weights=row_weights.to(device, dtype),
        )


class VectorisedClients:
    """The K collaborators of a simulation, trained together: `train_round` is the loop's round, batched.

    Built from the simulation's own learners (one per collaborator, same model shape,
    config and device, as `simulation.make_learners` makes them): their samplers draw
    the batches, their data is concatenated once, and their first model and threshold
    are only used as the function to evaluate (`functional_call`), never trained.
    Clients are evaluated in `size_groups`, all groups in one backward pass.
    """

    def __init__(self, learners: Sequence[LocalLearner]) -> None:
        if not learners:
            raise ValueError("no learners to vectorise; a federation needs at least one collaborator")
        first = learners[0]
        self.learners = list(learners)
        self.model: nn.Module = first.model
        self.threshold: RCVaRThreshold | None = first.threshold
        self.config = first.config
        self.algorithm = first.algorithm
        self.controls: torch.Tensor | None = None
        """[K, D + 1] every client's sigma_k (float64), with drift correction; as each learner's `control` starts."""
        if first.control is not None:
            self.controls = torch.stack([learner.control for learner in self.learners if learner.control is not None])
        self.loss = first.loss
        self.names = [name for name, _ in self.model.named_parameters()]
        self.shapes = [parameter.shape for _, parameter in self.model.named_parameters()]
        counts = [shape.numel() for shape in self.shapes]
        self.ends = [sum(counts[: index + 1]) for index in range(len(counts))]
        self.starts = [end - count for end, count in zip(self.ends, counts, strict=True)]
        parameter = next(self.model.parameters())
        self.device = parameter.device
        self.dtype = parameter.dtype
        self.batch_sizes = [learner.batch_size for learner in self.learners]
        self.weights = tuple(float(size) for size in self.batch_sizes)

        # Every client's rows, concatenated once; a group's batches are one gather from them.
        self.features = torch.cat([learner.features for learner in self.learners])
        self.labels = torch.cat([learner.labels for learner in self.learners])
        data_starts = [0]
        for learner in self.learners[:-1]:
            data_starts.append(data_starts[-1] + learner.num_samples)
        self.full_batch = [torch.arange(learner.num_samples) for learner in self.learners]
        self.groups = [
            PaddedGroup.build(members, self.batch_sizes, data_starts, self.dtype, self.device)
            for members in size_groups(self.batch_sizes)
        ]
        self._losses = vmap(self._client_losses)

    def _client_losses(
        self, parameters: dict[str, torch.Tensor], features: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """One client's per-sample losses at its own theta: the model and loss of `LocalLearner.objective`."""
        return self.loss(functional_call(self.model, parameters, (features,)), labels)

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Rows of flat parameters ([G, D], model order) as one [G, *shape] view per parameter."""
        return [
            flat[:, start:end].view(flat.shape[0], *shape)
            for shape, start, end in zip(self.shapes, self.starts, self.ends, strict=True)
        ]

    def _objective(
        self,
        parameters: Sequence[torch.Tensor],
        thresholds: torch.Tensor | None,
        features: torch.Tensor,
        labels: torch.Tensor,
    ) -> torch.Tensor:
        """[G, width] per-sample objective, client j at its own (parameters[.][j], thresholds[j]) on its own rows."""
        losses = self._losses(dict(zip(self.names, parameters, strict=True)), features, labels)
        if self.threshold is None or thresholds is None:
            return losses
        # The head is elementwise in (loss, c), so one call with c broadcast along each client's row serves all.
        objective: torch.Tensor = functional_call(self.threshold, {"c": thresholds.unsqueeze(1)}, (losses,))
        return objective

    def _draw_batches(self) -> list[torch.Tensor]:
        """Each client's next mini-batch indices from its own sampler, in the loop's order of draws."""
        indices = []
        for learner, everything in zip(self.learners, self.full_batch, strict=True):
            drawn = learner.sampler.next_batch()
            indices.append(everything if drawn is None else drawn)
        return indices

    def _gather(self, group: PaddedGroup, indices: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's batches, padded and stacked: ([members, width, ...], [members, width])."""
        gather = group.padding.clone()
        gather[group.positions] = torch.cat([indices[client] for client in group.members]) + group.row_offsets
        # Non-blocking, as in LocalLearner: the step loop never waits on the device's queue.
        gather = gather.to(self.device, non_blocking=True)
        shape = (len(group.members), group.width)
        features = self.features.index_select(0, gather)
        return features.view(*shape, *features.shape[1:]), self.labels.index_select(0, gather).view(shape)

    def _total_objective(
        self, leaves: Sequence[Sequence[torch.Tensor]], batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Sum over clients of each client's mean objective: its gradient, row j of a group's leaves, is client j's."""
        total = self.features.new_zeros((), dtype=self.dtype)
        for group, tensors, (features, labels) in zip(self.groups, leaves, batches, strict=True):
            thresholds = tensors[-1] if self.threshold is not None else None
            objective = self._objective(tensors[: len(self.names)], thresholds, features, labels)
            total = total + (objective * group.row_weights).sum()
        return total

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> StackedUpdates:
        """Every collaborator's begin, tau steps and finish from the global (theta, c), batched.

        With drift correction `control` is the server's sigma and each client's sigma_k is row k of `controls`.
        Each size group holds its members' flat thetas in one [members, D] block (model order, as
        flat_parameters) and trains one leaf per parameter viewing its columns, and one for the thresholds:
        a [K, D] leaf gathered per group and sliced per parameter made every backward pass fill a zero
        [K, D] tensor per group and a zero block per parameter (half the CPU of a 51-site Census-Income
        round). The views keep the strides the sliced leaf gave each parameter, so the same kernels run.
        """
        start_theta = theta.detach().to(self.device, self.dtype)
        leaves: list[list[torch.Tensor]] = []
        rounds: list[ClientRound] = []
        blocks: list[torch.Tensor] = []
        owns: list[torch.Tensor | None] = []
        for group in self.groups:
            members = len(group.members)
            block = start_theta.unsqueeze(0).repeat(members, 1)
            tensors = [part.detach().requires_grad_(True) for part in self._split(block)]
            if self.threshold is not None:
                # c lives in the model's dtype, as the loop's threshold holds it.
                thresholds = torch.full((members,), float(c), dtype=self.dtype, device=self.device)
                tensors.append(thresholds.requires_grad_(True))
            own = None if self.controls is None else self.controls.index_select(0, group.clients)
            rounds.append(self.algorithm.client_init(start_theta, c, tensors, own_control=own, server_control=control))
            leaves.append(tensors)
            blocks.append(block)
            owns.append(own)
        everything = [tensor for tensors in leaves for tensor in tensors]
        reused = self._batches() if self.config.reuse_batch else None
        for _ in range(self.config.local_steps):
            batches = reused if reused is not None else self._batches()
            gradients = list(torch.autograd.grad(self._total_objective(leaves, batches), everything))
            for round_, tensors in zip(rounds, leaves, strict=True):
                self.algorithm.client_step(round_, tensors, gradients[: len(tensors)])
                del gradients[: len(tensors)]
        return self._finish(rounds, leaves, blocks, owns)

    def _finish(
        self,
        rounds: Sequence[ClientRound],
        leaves: Sequence[Sequence[torch.Tensor]],
        blocks: Sequence[torch.Tensor],
        owns: Sequence[torch.Tensor | None],
    ) -> StackedUpdates:
        """Each group's `client_final` from its `blocks` of thetas (`owns`: its sigma_k), at its members' rows."""
        clients = len(self.learners)
        deltas = torch.empty(clients, self.ends[-1], dtype=self.dtype, device=self.device)
        delta_c = torch.empty(clients, dtype=torch.float64, device=self.device)
        controls = None if self.controls is None else torch.empty_like(self.controls)
        for group, round_, tensors, block, own in zip(self.groups, rounds, leaves, blocks, owns, strict=True):
            c = tensors[-1].detach() if self.threshold is not None else None
            delta, change, control = self.algorithm.client_final(round_, block, c, own)
            deltas.index_copy_(0, group.clients, delta)
            delta_c.index_copy_(0, group.clients, change)
            if controls is not None and control is not None:
                controls.index_copy_(0, group.clients, control)
        if controls is not None:
            self.controls = controls
        return StackedUpdates(deltas=deltas, delta_c=delta_c, weights=self.weights, controls=controls)

    def _batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One step's batches: every client draws, then each group gathers its members' rows."""
        indices = self._draw_batches()
        return [self._gather(group, indices) for group in self.groups]

    def blocker(self) -> str | None:
        """Why these collaborators cannot train as one batched computation, or None when they can.

        Checks that batching pays (see `CLIENTS_PER_GROUP`), the model's state (buffers would
        be per client and updated by each forward), then evaluates the objective under vmap on a two-row batch per client: it must run
        (no random layers, only operations vmap supports) and a sample's loss must not change
        when another sample joins its batch (padding adds rows). The check draws no batch and
        touches no random generator, so a loop that follows starts as if it never ran.
        """
        clients, groups = len(self.learners), len(self.groups)
        if clients < CLIENTS_PER_GROUP * (groups + 1):
            return (
                f"{clients} clients in {groups} size group(s) are too few to gain from batching "
                f"(it pays from {CLIENTS_PER_GROUP * (groups + 1)} clients)"
            )
        if any(True for _ in self.model.buffers()):
            return "the model has buffers (e.g. BatchNorm running statistics) that each collaborator updates on its own"
        features = torch.stack([learner.features[[0, -1]] for learner in self.learners])
        labels = torch.stack([learner.labels[[0, -1]] for learner in self.learners])
        start = torch.cat([parameter.detach().reshape(-1) for parameter in self.model.parameters()])
        flat = start.unsqueeze(0).repeat(clients, 1)
        c = torch.ones(clients, dtype=self.dtype, device=self.device)
        try:
            with torch.no_grad():
                pair = self._objective(self._split(flat), c, features, labels)
                alone = self._objective(self._split(flat), c, features[:, :1], labels[:, :1])
        except Exception as error:  # noqa: BLE001 - any failure means "keep the loop", which then raises the real error
            return f"the model or loss does not run under torch.func.vmap ({type(error).__name__}: {error})"
        if pair.shape != (clients, 2) or alone.shape != (clients, 1):
            return f"the objective gave shape {tuple(pair.shape)} for {clients} clients x 2 samples, not one per sample"
        scale = alone.abs().clamp(min=1.0)
        if not bool(((pair[:, :1] - alone).abs() <= COUPLING_TOLERANCE * scale).all()):
            return "a sample's loss changes when another sample joins its batch, so padding would change the batches"
        return None
