"""The server half of Algorithm 1: an explicit ServerState and `apply`, pure unless the caller gives the state up.

The server sees only sums over collaborators (what secure aggregation reveals):
sum w_k (theta_k - theta_t), sum w_k (c_k - c_t) and sum w_k. It moves to the
weighted mean, projects c onto [0, B] (the only projection Algorithm 1 makes) and
keeps the running average of the iterates, which is the algorithm's output (the
last iterate is kept too). With drift correction it also sees sum w_k sigma_k+ and
keeps the federation's control variate sigma, the weighted mean of the collaborators'
new control variates (SCAFFOLD in step units, see `fedfair.core.local`), to send with
the next round's pair.

Why: docs/design.md, "Inside the learning core".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from fedfair.core.errors import AggregateError, ConfigError
from fedfair.core.update import Update


@dataclass(frozen=True)
class Aggregate:
    """Sums over the collaborators that completed a round (`weighted_control` with drift correction)."""

    weighted_delta: torch.Tensor
    weighted_delta_c: float
    total_weight: float
    weighted_control: torch.Tensor | None = None

    @classmethod
    def of(cls, updates: Iterable[Update]) -> Aggregate:
        """The plain (unmasked) sum, as the simulation and the insecure mode compute it."""
        contributions = list(updates)
        if not contributions:
            raise AggregateError("no collaborator contributed to this round; nothing to aggregate")
        with_control = {update.control is not None for update in contributions}
        if len(with_control) > 1:
            raise AggregateError(
                "some collaborators sent a control variate and some did not; every collaborator of a "
                "federation must use the same drift_correction"
            )
        total = torch.stack([update.weighted_vector() for update in contributions]).sum(dim=0)
        weight = sum(update.weight for update in contributions)
        return cls.from_vector(total, weight, with_control=with_control.pop())

    @classmethod
    def from_vector(cls, weighted_sum: torch.Tensor, total_weight: float, *, with_control: bool = False) -> Aggregate:
        """Split a summed [w * delta, w * delta_c] vector, as secure aggregation returns it.

        `with_control`: the vector is [w * delta, w * delta_c, w * control], 2 (d + 1) long,
        as collaborators that correct drift send it (`Update.weighted_vector`).
        """
        control: torch.Tensor | None = None
        if with_control:
            if weighted_sum.numel() % 2:
                raise AggregateError(
                    f"a sum with control variates has 2 (d + 1) entries, got {weighted_sum.numel()}; "
                    "the collaborators did not send drift-corrected updates"
                )
            half = weighted_sum.numel() // 2
            weighted_sum, control = weighted_sum[:half], weighted_sum[half:]
        return cls(
            weighted_delta=weighted_sum[:-1],
            weighted_delta_c=float(weighted_sum[-1]),
            total_weight=total_weight,
            weighted_control=control,
        )


@dataclass(frozen=True)
class Adam:
    """FedAdam's server step on theta (Reddi et al. 2021).

    Step `lr`, moment decays `beta1`, `beta2`, adaptivity `tau` (their defaults 0.9, 0.99 and 1e-3).
    """

    lr: float
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        if not (self.lr > 0.0 and math.isfinite(self.lr)):
            raise ConfigError(f"FedAdam's server step must be a positive number, got {self.lr}; e.g. 0.003")
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ConfigError(f"FedAdam's decays must be in [0, 1), got {self.beta1} and {self.beta2}")
        if not self.tau > 0.0:
            raise ConfigError(f"FedAdam's adaptivity tau must be positive, got {self.tau}; e.g. 1e-3")


@dataclass(frozen=True)
class ServerState:
    """Everything the server carries between rounds (and checkpoints).

    In the paper's numbering (Algorithm 1), after `round` = t - 1 server steps `theta`
    and `c` are (theta^t, c^t), the pair broadcast in round t; theta^1 is the initial
    model. The paper outputs theta_bar_T = (1/T) sum_{t=1..T} theta^t: the pairs the
    rounds start from, the first included and the last server step's result left out.
    `theta_average` and `c_average` are the mean over the suffix t = T0, ..., `round`
    with T0 = average_from + 1 (see `apply`), `averaged_rounds` pairs in all; until
    the first pair enters (averaged_rounds = 0) they hold the current pair.

    `control` is the drift correction's server control variate sigma ([theta's coordinates, c]
    in step units, float64 on the CPU), sent with (theta, c) each round; None when drift is
    not corrected.

    `velocity` is the server momentum's v ([theta's coordinates, c], float64 on the CPU): the
    last server move, c's part as projected; None before the first momentum step or without
    momentum (then it counts as zeros).
    """

    round: int
    theta: torch.Tensor
    c: float
    theta_average: torch.Tensor
    c_average: float
    averaged_rounds: int
    control: torch.Tensor | None = None
    velocity: torch.Tensor | None = None
    second_moment: torch.Tensor | None = None


_SLICE = 1 << 20
"""Coordinates :func:`apply` forms a temporary for at a time (the finiteness check, the momentum term, the
average under `consume`): 8 MiB of float64, never a model's worth."""


def _finite(values: torch.Tensor) -> bool:
    """Whether every value is finite, a slice at a time.

    torch.isfinite of a whole float64 vector forms its absolute values (a model's worth) and two masks.
    """
    return all(bool(torch.isfinite(values[start : start + _SLICE]).all()) for start in range(0, values.numel(), _SLICE))


def _copy(values: torch.Tensor, into: torch.Tensor | None) -> torch.Tensor:
    """`values` copied into `into` (a tensor given up, of the same shape), or into a new tensor when None."""
    return values.clone() if into is None else into.copy_(values)


def _folded_average(state: ServerState, count: int, consume: bool) -> torch.Tensor:
    """The running average a + (x - a) / k, k = `count`, of theta^t into the average so far.

    In one new tensor (the same roundings, a + t = t + a), not three; under `consume` in the average's own,
    a slice at a time.
    """
    if not consume:
        return (state.theta - state.theta_average).div_(count).add_(state.theta_average)
    average = state.theta_average
    for start in range(0, average.numel(), _SLICE):
        piece = average[start : start + _SLICE]
        piece.add_((state.theta[start : start + _SLICE] - piece).div_(count))
    return average


def init(theta: torch.Tensor, bound: float, c: float | None = None, *, drift_correction: bool = False) -> ServerState:
    """Before round 1.

    Theta^1 = the initial model, and c^1 at the upper bound B as the algorithm starts it; with
    `drift_correction` the control variate sigma starts at zero, as every collaborator's does.
    """
    start = theta.detach().to("cpu", torch.float64).clone()
    c0 = float(bound if c is None else c)
    control = torch.zeros(start.numel() + 1, dtype=torch.float64) if drift_correction else None
    return ServerState(
        round=0, theta=start, c=c0, theta_average=start.clone(), c_average=c0, averaged_rounds=0, control=control
    )


def apply(
    state: ServerState,
    aggregate: Aggregate,
    *,
    bound: float,
    average_from: int = 0,
    momentum: float = 0.0,
    adam: Adam | None = None,
    consume: bool = False,
) -> ServerState:
    """Round t = state.round + 1's server step.

    Theta^{t+1} = theta^t + sum(w dtheta)/sum(w), c^{t+1} = proj_[0,B](c^t + sum(w dc)/sum(w)).

    With `momentum` beta > 0 the move is instead v^{t+1} = beta v^t + (sum(w dtheta), sum(w dc))/sum(w)
    (v^1 = 0), and c's part of v^{t+1} is then set to the move c actually made after projection, so
    that c held at 0 or B does not build up speed against the box (it would have to unwind it first).
    beta = 0 is exactly the step above. With `adam` theta takes FedAdam's step (module docstring) and c
    the plain one; `momentum` must then be 0.

    The pair this round started from, (theta^t, c^t), enters the running average when
    t > `average_from`, so after T rounds the average is the mean of theta^t over
    t = average_from + 1, ..., T (suffix averaging from T0 = average_from + 1). With
    average_from = 0 that is exactly the paper's output, (1/T) sum_{t=1..T} theta^t:
    the initial model in, the final server step's result (the last iterate, kept in
    `theta`) out.

    With drift correction the control variate becomes sum(w sigma_k+) / sum(w), the weighted
    mean of the control variates this round's collaborators sent.

    With `consume` the new theta, average and velocity are formed in `state`'s own tensors (same values
    bit for bit: the same operations, in the same order, each sum written x + y = y + x): the caller gives
    `state` up, and the step holds one model fewer than old and new states side by side, which at 10^7
    parameters and more is what bounds the aggregator's memory. Every refusal is raised before any tensor
    of `state` changes.
    """
    if not aggregate.total_weight > 0.0 or not math.isfinite(aggregate.total_weight):
        raise AggregateError(f"total weight {aggregate.total_weight} is not a positive number; the round is void")
    summed = aggregate.weighted_delta.to(torch.float64)
    # [step, step_c] in one tensor of this call's own: under momentum it becomes the velocity itself, so the
    # aggregator's busiest moment holds no separate step beside it (torch.cat would copy the step).
    moved = torch.empty(summed.numel() + 1, dtype=torch.float64, device=summed.device)
    step = torch.div(summed, aggregate.total_weight, out=moved[:-1])
    step_c = aggregate.weighted_delta_c / aggregate.total_weight
    moved[-1] = step_c
    if not _finite(step) or not math.isfinite(step_c):
        raise AggregateError("the aggregated update contains NaN or Inf; the round is void and the model unchanged")
    control = _next_control(state, aggregate)
    velocity: torch.Tensor | None = None
    second: torch.Tensor | None = None
    if adam is not None:
        if momentum > 0.0:
            raise ConfigError("the server takes FedAdam's step or a heavy-ball one, not both; set momentum to 0")
        first = (1.0 - adam.beta1) * step
        second = (1.0 - adam.beta2) * step.square()
        if state.velocity is not None and state.second_moment is not None:
            first += adam.beta1 * state.velocity[:-1]
            second += adam.beta2 * state.second_moment
        velocity = torch.cat([first, torch.tensor([step_c], dtype=torch.float64, device=step.device)])
        step = adam.lr * first / (second.sqrt() + adam.tau)
    elif momentum > 0.0:
        if consume and state.velocity is not None:
            velocity = state.velocity.mul_(momentum).add_(moved)  # beta v^t + step, in v^t's own tensor
        else:
            velocity = moved
            if state.velocity is not None:
                # beta v^t formed and added a slice at a time: the same roundings as whole, no model-sized temporary.
                for start in range(0, velocity.numel(), _SLICE):
                    velocity[start : start + _SLICE] += momentum * state.velocity[start : start + _SLICE]
        step, step_c = velocity[:-1], float(velocity[-1])
    del moved  # a velocity's step is a view of it, kept; otherwise `step` is the only name left for it
    c = min(max(state.c + step_c, 0.0), bound)
    if velocity is not None:
        velocity[-1] = c - state.c
    round_number = state.round + 1
    # The average reads theta^t, so it is formed before theta^t moves (in place, under `consume`).
    count, theta_average, c_average = 0, None, c
    if round_number > average_from:
        count = state.averaged_rounds + 1
        if count > 1:
            theta_average = _folded_average(state, count, consume)
            c_average = state.c_average + (state.c - state.c_average) / count
        else:
            theta_average, c_average = _copy(state.theta, state.theta_average if consume else None), state.c
    if consume:
        theta = state.theta.add_(step)
    else:
        # Without a velocity, step is this call's own tensor: theta is formed in it (x + y = y + x exactly).
        theta = step.add_(state.theta) if velocity is None else state.theta + step
    if theta_average is None:
        theta_average = _copy(theta, state.theta_average if consume else None)
    return ServerState(
        round=round_number,
        theta=theta,
        c=c,
        theta_average=theta_average,
        c_average=c_average,
        averaged_rounds=count,
        control=control,
        velocity=velocity,
        second_moment=second,
    )


def _next_control(state: ServerState, aggregate: Aggregate) -> torch.Tensor | None:
    """sum(w sigma_k+) / sum(w), refusing an aggregate whose drift correction does not match the state's."""
    if state.control is None and aggregate.weighted_control is None:
        return None
    if state.control is None:
        raise AggregateError(
            "the aggregate carries control variates but the server does not correct drift; start the server "
            "with init(..., drift_correction=True) or turn drift correction off at the collaborators"
        )
    if aggregate.weighted_control is None:
        raise AggregateError(
            "the server corrects drift but the aggregate carries no control variates; the collaborators must "
            "use the same drift_correction as the server"
        )
    if aggregate.weighted_control.numel() != state.control.numel():
        raise AggregateError(
            f"the aggregate's control part has {aggregate.weighted_control.numel()} entries, the server's "
            f"control variate {state.control.numel()}; both must be the model's parameters and c"
        )
    control = aggregate.weighted_control.to("cpu", torch.float64) / aggregate.total_weight
    if not bool(torch.isfinite(control).all()):
        raise AggregateError(
            "the aggregated control variate contains NaN or Inf; the round is void and the model unchanged"
        )
    return control
