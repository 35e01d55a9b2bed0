"""FedSRCVaR's rules: a step is plain SGD at each tensor's rate, corrected and projected as configured, and
the same rules on K stacked clients give each client's own result."""

from __future__ import annotations

import math

import pytest
import torch

from fedfair.core import server
from fedfair.core.algorithm import FedSRCVaR
from fedfair.core.config import LocalConfig
from fedfair.core.errors import ConfigError


def state(seed: int, clients: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A 2x3 weight, a bias of 2 and c, float64 (theta has D = 8 coordinates), optionally K rows of each."""
    generator = torch.Generator().manual_seed(seed)
    lead = () if clients is None else (clients,)
    weight = torch.randn(*lead, 2, 3, generator=generator, dtype=torch.float64)
    bias = torch.randn(*lead, 2, generator=generator, dtype=torch.float64)
    c = torch.rand(lead, generator=generator, dtype=torch.float64) * 3
    return weight, bias, c


def test_a_step_without_correction_is_torch_sgd_at_each_tensors_rate_bit_for_bit() -> None:
    local = LocalConfig(lr=0.3, threshold_lr=0.07)
    algorithm = FedSRCVaR(local, bound=2.0)
    ours = [tensor.clone() for tensor in state(0)]
    reference = [torch.nn.Parameter(tensor.clone()) for tensor in state(0)]
    gradients = [tensor.clone() for tensor in state(1)]
    for tensor, gradient in zip(reference, gradients, strict=True):
        tensor.grad = gradient.clone()
    sgd = torch.optim.SGD(
        [{"params": reference[:2], "lr": local.lr}, {"params": reference[2:], "lr": local.threshold_lr}]
    )
    sgd.step()
    round_ = algorithm.client_init(
        torch.cat([ours[0].flatten(), ours[1]]), 1.0, ours, own_control=None, server_control=None
    )
    algorithm.client_step(round_, ours, gradients)
    for mine, theirs in zip(ours, reference, strict=True):
        assert torch.equal(mine, theirs.detach())
    assert round_.steps == 1


def test_c_is_projected_after_a_step_only_when_asked() -> None:
    for project_locally, expected in ((False, 2.0 + 0.5), (True, 2.0)):
        algorithm = FedSRCVaR(LocalConfig(threshold_lr=1.0, project_locally=project_locally), bound=2.0)
        c = torch.tensor(2.0, dtype=torch.float64)
        round_ = algorithm.client_init(torch.zeros(1), 2.0, [c], own_control=None, server_control=None)
        algorithm.client_step(round_, [c], [torch.tensor(-0.5, dtype=torch.float64)])
        assert float(c) == expected


def test_without_a_threshold_every_tensor_takes_thetas_rate_and_delta_c_is_zero() -> None:
    algorithm = FedSRCVaR(LocalConfig(lr=0.5, threshold_lr=9.0))
    theta = torch.ones(3, dtype=torch.float64)
    round_ = algorithm.client_init(theta.clone(), 0.0, [theta], own_control=None, server_control=None)
    algorithm.client_step(round_, [theta], [torch.ones(3, dtype=torch.float64)])
    delta, delta_c, control = algorithm.client_final(round_, theta, None, None)
    assert torch.equal(delta, torch.full((3,), -0.5, dtype=torch.float64))
    assert float(delta_c) == 0.0 and control is None


def test_stacked_clients_follow_each_clients_own_rules_bit_for_bit_drift_correction_included() -> None:
    """K = 4 clients stacked along a leading axis, each with its own sigma_k, against each run alone."""
    clients, dimension = 4, 8
    local = LocalConfig(local_steps=3, lr=0.2, threshold_lr=0.1, project_locally=True, drift_correction="scaffold")
    algorithm = FedSRCVaR(local, bound=2.0)
    generator = torch.Generator().manual_seed(5)
    own_controls = torch.randn(clients, dimension + 1, generator=generator, dtype=torch.float64)
    server_control = torch.randn(dimension + 1, generator=generator, dtype=torch.float64)
    start = state(2)
    start_theta = torch.cat([start[0].flatten(), start[1]])
    steps = [state(10 + step, clients) for step in range(local.local_steps)]

    flat = start_theta.repeat(clients, 1)
    thresholds = start[2].repeat(clients)
    round_ = algorithm.client_init(
        start_theta, float(start[2]), [flat, thresholds], own_control=own_controls, server_control=server_control
    )
    for weight, bias, c in steps:
        algorithm.client_step(round_, [flat, thresholds], [torch.cat([weight.flatten(1), bias], dim=1), c])
    deltas, delta_c, controls = algorithm.client_final(round_, flat, thresholds, own_controls)
    assert controls is not None

    for client in range(clients):
        tensors = [tensor.clone() for tensor in start]
        alone = algorithm.client_init(
            start_theta, float(start[2]), tensors, own_control=own_controls[client], server_control=server_control
        )
        for weight, bias, c in steps:
            algorithm.client_step(alone, tensors, [weight[client], bias[client], c[client]])
        theta = torch.cat([tensors[0].flatten(), tensors[1]])
        delta, own_delta_c, control = algorithm.client_final(alone, theta, tensors[2], own_controls[client])
        assert torch.equal(deltas[client], delta)
        assert torch.equal(delta_c[client], own_delta_c)
        assert control is not None and torch.equal(controls[client], control)
    assert float(thresholds.max()) <= 2.0


def test_the_new_control_variate_is_scaffolds_option_two_in_step_units() -> None:
    """sigma_k+ = sigma_k - sigma + (x_t - x_k) / tau, with x = [theta, c]."""
    local = LocalConfig(local_steps=2, lr=0.1, threshold_lr=0.1, drift_correction="scaffold")
    algorithm = FedSRCVaR(local, bound=5.0)
    theta, c = torch.zeros(2, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    own, sigma = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), torch.tensor([0.4, 0.0, -0.1], dtype=torch.float64)
    round_ = algorithm.client_init(theta.clone(), 1.0, [theta, c], own_control=own, server_control=sigma)
    for _ in range(2):
        algorithm.client_step(
            round_, [theta, c], [torch.ones(2, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)]
        )
    delta, delta_c, control = algorithm.client_final(round_, theta, c, own)
    drift = torch.cat([delta, delta_c.reshape(1)])
    # Each step moves x by -lr * g - (sigma - sigma_k); two of them.
    expected_drift = 2 * (-0.1 * torch.ones(3, dtype=torch.float64) - (sigma - own))
    torch.testing.assert_close(drift, expected_drift, rtol=0, atol=1e-15)
    assert control is not None
    torch.testing.assert_close(control, own - sigma - drift / 2, rtol=0, atol=0)


def test_a_client_refuses_a_control_variate_it_cannot_use() -> None:
    plain = FedSRCVaR(LocalConfig(), bound=1.0)
    with pytest.raises(ConfigError, match="does not correct drift"):
        plain.client_init(torch.zeros(2), 1.0, [torch.zeros(2)], own_control=None, server_control=torch.zeros(3))
    corrected = FedSRCVaR(LocalConfig(drift_correction="scaffold"), bound=1.0)
    with pytest.raises(ConfigError, match="has 5 entries, this model needs 3"):
        corrected.client_init(
            torch.zeros(2),
            1.0,
            [torch.zeros(2)],
            own_control=torch.zeros(3, dtype=torch.float64),
            server_control=torch.zeros(5, dtype=torch.float64),
        )


def test_a_drift_corrected_round_needs_a_step_and_the_step_one_gradient_per_tensor() -> None:
    algorithm = FedSRCVaR(LocalConfig(drift_correction="scaffold"))
    own = torch.zeros(3, dtype=torch.float64)
    theta = torch.zeros(2, dtype=torch.float64)
    round_ = algorithm.client_init(theta.clone(), 0.0, [theta], own_control=own, server_control=None)
    with pytest.raises(ValueError, match="2 gradients for 1 state tensors"):
        algorithm.client_step(round_, [theta], [None, None])
    with pytest.raises(RuntimeError, match="after no local step"):
        algorithm.client_final(round_, theta, None, own)


def test_the_server_rules_start_c_at_the_bound_and_keep_it_at_zero_without_a_threshold() -> None:
    theta = torch.zeros(2)
    rcvar = FedSRCVaR(LocalConfig(), bound=3.0)
    state0 = rcvar.server_init(theta)
    assert state0.c == 3.0 and state0.control is None
    aggregate = server.Aggregate(torch.ones(2, dtype=torch.float64), 10.0, 2.0)
    assert rcvar.server_apply(state0, aggregate).c == 3.0, "c + 5 is projected back onto [0, B]"
    fedavg = FedSRCVaR(LocalConfig(drift_correction="scaffold"))
    started = fedavg.server_init(theta)
    assert started.c == 0.0 and started.control is not None and started.control.numel() == 3


@pytest.mark.parametrize("momentum", [-0.1, 1.0, math.nan])
def test_a_server_momentum_outside_zero_one_is_refused(momentum: float) -> None:
    with pytest.raises(ConfigError, match="server momentum must be in"):
        FedSRCVaR(LocalConfig(), bound=1.0, momentum=momentum)


def test_the_algorithms_server_step_is_fedadam_when_asked() -> None:
    """FedSRCVaR's server_apply hands its Adam settings to the one server step; with momentum too it is refused."""
    adam = server.Adam(lr=0.01)
    algorithm = FedSRCVaR(LocalConfig(), bound=1.0, adam=adam)
    state = algorithm.server_init(torch.zeros(3, dtype=torch.float64))
    aggregate = server.Aggregate.from_vector(torch.tensor([0.3, -0.2, 0.1, -0.5], dtype=torch.float64), 2.0)
    expected = server.apply(state, aggregate, bound=1.0, adam=adam)
    got = algorithm.server_apply(state, aggregate)
    assert torch.equal(got.theta, expected.theta) and got.c == expected.c == 0.75
    with pytest.raises(ConfigError, match="not both"):
        FedSRCVaR(LocalConfig(), bound=1.0, momentum=0.9, adam=adam)
