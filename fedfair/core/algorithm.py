"""FedSRCVaR (Algorithm 1) written once: what a client does with a gradient, and what the server does with a sum.

`FedSRCVaR` holds the rules and no data:

- client: `client_init` (the round starts from the global pair), `client_step` (one step
  from a gradient), `client_final` (the round's update and, with drift correction, the
  new control variate);
- server: `server_init` and `server_apply` (`fedfair.core.server`'s pure step).

Why: docs/design.md, "Inside the learning core".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fedfair.core import server
from fedfair.core.config import SERVER_MOMENTUM, LocalConfig
from fedfair.core.errors import ConfigError


@dataclass
class ClientRound:
    """A round in progress at one client (or at K clients, stacked): where it started, what corrects each step."""

    start_theta: torch.Tensor
    """theta_t as the client's executor holds it: [D], or [K, D] for stacked clients."""
    start_c: float
    server_control: torch.Tensor | None
    """sigma, the server's control variate ([D + 1], float64); None without drift correction."""
    corrections: list[torch.Tensor] = field(default_factory=list)
    """sigma - sigma_k shaped like each state tensor (empty without drift correction)."""
    steps: int = 0


@dataclass(frozen=True)
class FedSRCVaR:
    """Algorithm 1's rules for local steps `local`.

    `bound` is B, or None without a threshold (then the objective is the plain mean loss and the rules are
    FedAvg's, with c absent).

    `momentum` is the server's heavy-ball beta on the decoded mean update (`fedfair.core.server`);
    0 is Algorithm 1's plain averaging step. `adam`, instead, is FedAdam's server step on theta
    (`fedfair.core.server.Adam`; momentum must then be 0). Neither changes anything at the clients.
    """

    local: LocalConfig
    bound: float | None = None
    momentum: float = 0.0
    adam: server.Adam | None = None

    def __post_init__(self) -> None:
        if self.momentum not in SERVER_MOMENTUM:
            raise ConfigError(
                f"server momentum must be in {SERVER_MOMENTUM.text}, got {self.momentum}; "
                "0 is Algorithm 1's step, 0.9 fedfair's default"
            )
        if self.adam is not None and self.momentum > 0.0:
            raise ConfigError("the server takes FedAdam's step or heavy-ball momentum, not both; set momentum to 0")

    @property
    def has_threshold(self) -> bool:
        """True when the objective is RCVaR with a threshold c (`bound` set), False for FedAvg's plain mean loss."""
        return self.bound is not None

    # ------------------------------------------------------------------ client

    def client_init(
        self,
        start_theta: torch.Tensor,
        start_c: float,
        tensors: Sequence[torch.Tensor],
        *,
        own_control: torch.Tensor | None,
        server_control: torch.Tensor | None,
    ) -> ClientRound:
        """Begin a round from (theta_t, c_t) whose values the executor has loaded into `tensors`.

        With drift correction, `own_control` is sigma_k ([D + 1] or [K, D + 1], float64) and
        `server_control` sigma ([D + 1]; None counts as zeros); each step will then subtract
        sigma - sigma_k, precomputed here in the shape of each state tensor. A client that does not
        correct drift refuses a server control variate: the two sides disagree on the algorithm.
        """
        if own_control is None:
            if server_control is not None:
                raise ConfigError(
                    "the server sent a control variate but this collaborator does not correct drift; "
                    "set drift_correction = 'scaffold' in its LocalConfig, as the server's"
                )
            return ClientRound(start_theta=start_theta, start_c=float(start_c), server_control=None)
        sigma = torch.zeros(own_control.shape[-1], dtype=torch.float64) if server_control is None else server_control
        if sigma.shape[-1:] != own_control.shape[-1:]:
            raise ConfigError(
                f"the server's control variate has {sigma.shape[-1]} entries, this model needs "
                f"{own_control.shape[-1]} (its parameters and c); both sides must train the same model"
            )
        sigma = sigma.detach().to(own_control.device, torch.float64)
        difference = sigma - own_control
        clients = math.prod(difference.shape[:-1])
        corrections: list[torch.Tensor] = []
        offset = 0
        for tensor in tensors:
            count = tensor.numel() // clients
            part = difference[..., offset : offset + count].reshape(tensor.shape)
            corrections.append(part.to(tensor.dtype))
            offset += count
        return ClientRound(
            start_theta=start_theta, start_c=float(start_c), server_control=sigma, corrections=corrections
        )

    @torch.no_grad()
    def client_step(
        self, round_: ClientRound, tensors: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor | None]
    ) -> None:
        """One local step on the state `tensors`, in place, from their `gradients` (None: no gradient).

        x -= eta * g for theta's tensors and x -= eta_c * g for c, the last state tensor when there is
        a threshold (plain SGD, as `torch.optim.SGD` takes it); then, with drift correction,
        x -= sigma - sigma_k (SCAFFOLD's correction in step units, after the step, so that it composes
        with any gradient, a private one included: it is post-processing of released values); then c
        is projected onto [0, B] if `local.project_locally` asks for it (Algorithm 1 itself projects
        only at the server).
        """
        if len(gradients) != len(tensors):
            raise ValueError(f"{len(gradients)} gradients for {len(tensors)} state tensors; pass one per tensor")
        rates = [self.local.lr] * len(tensors)
        if self.has_threshold:
            rates[-1] = self.local.threshold_lr
        for tensor, gradient, rate in zip(tensors, gradients, rates, strict=True):
            if gradient is not None:
                tensor.add_(gradient, alpha=-rate)
        if round_.corrections:
            for tensor, correction in zip(tensors, round_.corrections, strict=True):
                tensor.sub_(correction)
        round_.steps += 1
        if self.bound is not None and self.local.project_locally:
            tensors[-1].clamp_(0.0, self.bound)

    @torch.no_grad()
    def client_final(
        self, round_: ClientRound, theta: torch.Tensor, c: torch.Tensor | None, own_control: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The round's (theta_k - theta_t, c_k - c_t, sigma_k+) from the client's `theta` and `c` now.

        delta_c is float64 (zeros without a threshold). With drift correction,
        sigma_k+ = sigma_k - sigma + (x_t - x_k) / tau (SCAFFOLD's option II in step units: the
        round's mean uncorrected step); None without.
        """
        delta = theta - round_.start_theta
        lead = delta.shape[:-1]
        if c is None:
            delta_c = torch.zeros(lead, dtype=torch.float64, device=delta.device)
        else:
            delta_c = c.to(torch.float64) - round_.start_c
        if own_control is None or round_.server_control is None:
            return delta, delta_c, None
        if round_.steps < 1:
            raise RuntimeError("the round ended after no local step; a drift-corrected round needs at least one step")
        drift = torch.cat([delta.to(torch.float64), delta_c.to(own_control.device).unsqueeze(-1)], dim=-1)
        return delta, delta_c, own_control - round_.server_control - drift / round_.steps

    # ------------------------------------------------------------------ server

    def server_init(self, theta: torch.Tensor, c: float | None = None) -> server.ServerState:
        """Before round 1: theta^1 the initial model, c^1 = B unless given, sigma = 0 with drift correction."""
        return server.init(theta, bound=self.server_bound, c=c, drift_correction=self.local.corrects_drift)

    def server_apply(
        self, state: server.ServerState, aggregate: server.Aggregate, *, average_from: int = 0, consume: bool = False
    ) -> server.ServerState:
        """A round's server step from the sums secure aggregation reveals (`fedfair.core.server.apply`).

        With `consume` the caller gives `state` up, and the new one is formed in its tensors.
        """
        return server.apply(
            state,
            aggregate,
            bound=self.server_bound,
            average_from=average_from,
            momentum=self.momentum,
            adam=self.adam,
            consume=consume,
        )

    @property
    def server_bound(self) -> float:
        """B for the server's projection; 0 without a threshold, where c stays 0."""
        return 0.0 if self.bound is None else self.bound
