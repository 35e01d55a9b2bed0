"""`auto` between norm-only and per-sample clipping: timed once per model, device and batch, on no record."""

from __future__ import annotations

import torch
from torch import nn

from fedfair.core.config import LocalConfig
from fedfair.core.local import LocalLearner
from fedfair.core.models import flat_parameters
from fedfair.privacy.learner import PrivateLearner
from fedfair.privacy.clipping import ClippingMode
from fedfair.privacy.probe import PER_SAMPLE_PROBE_BYTES, ModeProbe, per_sample_budget, per_sample_bytes
from tests.privacy.helpers import private_config, random_samples, scripted_probe


class TwiceConv(nn.Module):
    """One convolution applied twice, then dropout: only per-sample clipping can train it, and it draws."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)
        self.dropout = nn.Dropout(0.5)
        self.out = nn.Linear(36, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images = x.view(-1, 1, 6, 6)
        logits: torch.Tensor = self.out(self.dropout(self.conv(self.conv(images))).flatten(1))
        return logits


def conv_learner(batch_size: int, model: nn.Module | None = None) -> LocalLearner:
    features, labels = random_samples(120, 36, seed=6)
    network = model or nn.Sequential(nn.Unflatten(1, (1, 6, 6)), nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(32, 1))
    return LocalLearner(network.double(), features, labels, batch_size, LocalConfig(local_steps=1))


def test_the_choice_is_timed_per_batch_size_and_cached_per_model_shape() -> None:
    probe = scripted_probe(1.0, 2.0, 5.0, 1.0)  # batch 10: norm-only faster; batch 30: per-sample faster
    assert PrivateLearner(conv_learner(10), private_config(noise_multiplier=1.0), probe=probe).clipping == "norm"
    assert PrivateLearner(conv_learner(30), private_config(noise_multiplier=1.0), probe=probe).clipping == "per_sample"
    # A fresh model of the same shape at a timed batch size: from the cache (the clock has run out).
    assert PrivateLearner(conv_learner(10), private_config(noise_multiplier=1.0), probe=probe).clipping == "norm"
    assert len(probe.choices) == 2
    heads = nn.ModuleList([conv_learner(10).model])  # the learner's model and threshold (none here)
    assert probe.choices[ModeProbe.key(heads, torch.device("cpu"), 10)] == "norm"


def test_a_mode_that_refuses_the_model_is_left_out_and_the_probe_draws_nothing() -> None:
    """A layer run twice: norm-only clipping refuses it while timing, so auto takes per-sample clipping untimed;
    the global generator is where it was (the model's dropout drew inside the probe only)."""
    probe = scripted_probe()  # no reading: a single runnable mode is not timed
    learner = conv_learner(10, TwiceConv())
    torch.manual_seed(4)
    before = torch.random.get_rng_state()
    private = PrivateLearner(learner, private_config(noise_multiplier=1.0), probe=probe)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert private.clipping == "per_sample"
    update = private.train_round(flat_parameters(private.learner.model), 0.0)
    assert bool(torch.isfinite(update.delta).all()) and float(update.delta.abs().max()) > 0


def test_a_mode_that_runs_out_of_device_memory_is_left_out() -> None:
    """Per-sample gradients over the memory the budget guessed: the probe drops the mode instead of failing."""

    def step(mode: ClippingMode) -> None:
        if mode == "per_sample":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 42.70 GiB")

    probe = ModeProbe(timer=iter([]).__next__)  # one runnable mode is not timed: no clock reading
    assert probe.choose("key", ["norm", "per_sample"], step) == "norm"
    assert probe.choices == {"key": "norm"}


def test_off_a_gpu_per_sample_clipping_is_timed_up_to_the_fixed_budget() -> None:
    assert per_sample_budget(torch.device("cpu")) == PER_SAMPLE_PROBE_BYTES
    heads = nn.ModuleList([conv_learner(10).model])
    # 2 x 9 + 2 + 32 + 1 = 53 float64 parameters: 424 bytes a sample.
    assert per_sample_bytes(heads, 10) == 10 * 53 * 8
