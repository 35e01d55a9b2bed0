"""Which clipping mode is fastest for a model on the device at hand: timed once, then cached.

Where `clipping_candidates` leaves several modes ("norm" and "per_sample": which wins
depends on the layers, the batch and the device; on an H100 per-sample clipping beat
norm-only clipping on the MNIST CNN, on one CPU thread the reverse), `PrivateLearner`
times one clipped step of each on a synthetic batch of the expected batch size and keeps
the fastest. The choice is cached per (model signature, device, batch size, dtype) for the
process, so a collaborator measures once and every learner after it reuses the choice.

A synthetic batch of standard normal features, because a choice timed on records would be a
(tiny) function of them that no accountant charges. Why: docs/design.md, "Inside the privacy library".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence

import torch
from torch import nn

from fedfair.core.errors import ConfigError
from fedfair.privacy.clipping import ClippingMode

logger = logging.getLogger(__name__)

Timer = Callable[[], float]
"""A clock in seconds; only differences of its readings are used."""

PER_SAMPLE_PROBE_BYTES = 4 << 30
"""Off a GPU, per-sample clipping is timed only where one step's per-sample gradients fit in this many bytes;
beyond it the mode would hold batch x parameters numbers at once, so it is left out rather than risk running
out of memory while timing it (it stays available by asking for clipping 'per_sample')."""

PER_SAMPLE_DEVICE_SHARE = 2 / 3
"""On a GPU, the share of its free memory one step's per-sample gradients may take for the mode to be timed.
Measured on an H100 (benchmarks/gpu_bench.py): ResNet-18-GN at batch 1024 holds 42.7 GiB of them and per-sample
clipping is then the fastest mode, so a fixed 4 GiB would leave the fastest mode out on a large card."""


def per_sample_budget(device: torch.device) -> int:
    """The bytes of per-sample gradients up to which per-sample clipping is a candidate on `device`.

    `PER_SAMPLE_DEVICE_SHARE` of the GPU's free memory now, else `PER_SAMPLE_PROBE_BYTES`; a mode
    that still runs out of memory while it is timed is left out (`ModeProbe.choose`).
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * PER_SAMPLE_DEVICE_SHARE)
    return PER_SAMPLE_PROBE_BYTES


def model_signature(module: nn.Module) -> tuple[Hashable, ...]:
    """What makes two models time alike: each layer's type and each parameter's name, shape and whether it trains."""
    layers = tuple(
        f"{name}:{type(layer).__module__}.{type(layer).__qualname__}" for name, layer in module.named_modules()
    )
    parameters = tuple(
        (name, tuple(parameter.shape), parameter.requires_grad) for name, parameter in module.named_parameters()
    )
    return layers, parameters


def per_sample_bytes(module: nn.Module, batch_size: int) -> int:
    """The bytes of one step's per-sample gradients: batch size x trainable parameters x element size."""
    return batch_size * sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


class ModeProbe:
    """Times candidate clipping modes once per (model signature, device, batch size, dtype) and remembers the fastest.

    `timer` reads the clock (injected by tests, so that no assertion depends on wall time);
    `repeats` timed steps per mode after one untimed warm-up step, the fastest counting (on a
    shared machine the slow ones measure the neighbours). The modes are timed in turn within
    each repeat, in the order given, so that a slow spell hits them alike.
    """

    def __init__(self, timer: Timer = time.perf_counter, repeats: int = 2) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {repeats}")
        self.timer = timer
        self.repeats = repeats
        self.choices: dict[Hashable, ClippingMode] = {}
        """The cached choices, by key (`key`)."""
        self.timings: dict[Hashable, dict[ClippingMode, float]] = {}
        """The best seconds per step each mode took when its key was timed."""

    @staticmethod
    def key(module: nn.Module, device: torch.device, batch_size: int) -> Hashable:
        """The cache key of `module` (its signature and dtype) on `device` at `batch_size`."""
        dtype = next((str(p.dtype) for p in module.parameters()), "")
        return model_signature(module), str(device), batch_size, dtype

    def choose(
        self,
        key: Hashable,
        candidates: Sequence[ClippingMode],
        step: Callable[[ClippingMode], None],
        synchronize: Callable[[], None] = lambda: None,
    ) -> ClippingMode:
        """The fastest of `candidates` for `key`: from the cache, else by timing `step(mode)` for each mode.

        `step` runs one clipped step in that mode (it must leave the model as it found it; a
        ConfigError from it, or running out of device memory, drops that mode); `synchronize` waits for the device, so that a
        timing covers the work queued on it. A single candidate is returned untimed.

        Raises:
            ConfigError: every candidate refused this model.
        """
        if len(candidates) == 1:
            return candidates[0]
        cached = self.choices.get(key)
        if cached is not None and cached in candidates:
            return cached
        runnable: list[ClippingMode] = []
        for mode in candidates:
            try:
                step(mode)  # warm-up: first-call allocations and kernel selection are not the mode's cost
            except ConfigError as refused:
                # E.g. a layer run twice in one forward pass, which only norm-only clipping refuses.
                logger.info("clipping: %s clipping cannot train this model (%s)", mode, refused)
                continue
            except torch.cuda.OutOfMemoryError:
                # Per-sample gradients over the budget's estimate: the mode cannot train at this batch size here.
                torch.cuda.empty_cache()
                logger.info("clipping: %s clipping ran out of device memory at this batch size", mode)
                continue
            runnable.append(mode)
        if not runnable:
            raise ConfigError(f"no clipping mode among {', '.join(candidates)} can train this model")
        if len(runnable) == 1:
            self.choices[key] = runnable[0]
            return runnable[0]
        candidates = runnable
        best = dict.fromkeys(candidates, float("inf"))
        for _ in range(self.repeats):
            for mode in candidates:
                synchronize()
                started = self.timer()
                step(mode)
                synchronize()
                best[mode] = min(best[mode], self.timer() - started)
        chosen = min(candidates, key=lambda mode: best[mode])
        self.choices[key] = chosen
        self.timings[key] = best
        timings = ", ".join(f"{mode} {seconds * 1e3:.2f} ms" for mode, seconds in best.items())
        logger.info("clipping: timed one step per mode (%s); the fastest is %s", timings, chosen)
        return chosen


PROBE = ModeProbe()
"""The process's probe: one measurement per model, device and batch size, shared by every PrivateLearner."""
