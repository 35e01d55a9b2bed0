"""Secure aggregation in process: each round's updates summed through the real masking protocol."""

from __future__ import annotations

import torch

from fedfair.core import server
from fedfair.core.update import Update
from fedfair.secagg import EncodingConfig, SecAggConfig, simulate_round


class SecureSum:
    """Sums each round's updates through the real secure-aggregation protocol, in process.

    Every collaborator encodes [w * delta, w * delta_c] (followed by w * control with
    drift correction) and w, masks it, and the server recovers only the sum, exactly as in a deployment but without the network; the
    decoded sum differs from the plain one by at most `error_bounds[r]` per coordinate.
    """

    def __init__(self, encoding: EncodingConfig, federation_id: str = "simulation") -> None:
        self.encoding = encoding
        self.federation_id = federation_id
        self.error_bounds: list[float] = []

    def __call__(self, updates: list[Update]) -> server.Aggregate:
        vectors = [update.weighted_vector().numpy() for update in updates]
        config = SecAggConfig(
            federation_id=self.federation_id,
            round=len(self.error_bounds) + 1,
            parties=tuple(f"collaborator-{index}" for index in range(len(updates))),
            dimension=vectors[0].size,
            encoding=self.encoding,
        )
        trace = simulate_round(
            config, lambda party: config.encoder.encode(vectors[party - 1], updates[party - 1].weight)
        )
        decoded = trace.result.decoded
        self.error_bounds.append(decoded.error_bound)
        # Drift-corrected updates carry their control variates in the same masked vector.
        with_control = updates[0].control is not None
        weighted_sum = torch.from_numpy(decoded.weighted_sum.copy())
        return server.Aggregate.from_vector(weighted_sum, decoded.total_weight, with_control=with_control)
