"""A stage added in one place runs in the in-process round: no runner is told about it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fedfair.core.errors import ProtocolError
from fedfair.secagg.messages import Message
from fedfair.secagg.simulate import simulate_round
from tests.secagg.echo_round import ECHO, ECHO_ROUND, Echo, EchoCall
from tests.secagg.helpers import encode_all, make_config, make_inputs


def test_every_survivor_echoes_and_the_sum_is_unchanged() -> None:
    config = make_config(5)
    inputs = make_inputs(config, seed=3)
    encoded = encode_all(config, inputs)
    seen: list[object] = []

    def observe(message: Message) -> None:
        seen.append(message)

    trace = simulate_round(
        config, lambda party: encoded[party].copy(), observe=observe, verified=True, protocol=ECHO_ROUND
    )
    echoes = [message for message in seen if isinstance(message, Echo)]
    assert sorted(echo.sender for echo in echoes) == list(trace.result.contributors) == [1, 2, 3, 4, 5]
    decoded = trace.result.decoded
    truth = sum(vector for vector, _ in inputs.values())
    assert np.max(np.abs(decoded.weighted_sum - truth)) <= decoded.error_bound
    assert set(trace.verified) == {1, 2, 3, 4, 5}


def test_the_server_refuses_an_echo_of_another_call() -> None:
    """The echo's server check bites: a party that answers another nonce is refused."""
    config = make_config(4)
    encoded = encode_all(config, make_inputs(config, seed=4))
    wrong = replace(ECHO, step=lambda client, call, own: ECHO.step(client, EchoCall(bytes(16)), own))
    lying = replace(ECHO_ROUND, sum_stages=tuple(wrong if spec is ECHO else spec for spec in ECHO_ROUND.sum_stages))
    with pytest.raises(ProtocolError, match="echo does not match"):
        simulate_round(config, lambda party: encoded[party].copy(), verified=True, protocol=lying)
