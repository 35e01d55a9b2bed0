"""Choosing the torch device: names are taken as given, 'auto' falls back to the CPU, absent CUDA is refused."""

from __future__ import annotations

import re

import pytest
import torch

from fedfair.core.device import device_for
from fedfair.core.errors import ConfigError

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour of a machine without CUDA")
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("name", ["cpu", "meta"])
def test_a_non_cuda_name_is_taken_as_given(name: str) -> None:
    assert device_for(name) == torch.device(name)


@NO_CUDA
def test_auto_falls_back_to_the_cpu_without_cuda() -> None:
    assert device_for("auto") == torch.device("cpu")


@NO_CUDA
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_asked_for_without_cuda_is_refused_naming_the_device_and_the_fix(name: str) -> None:
    message = f"device '{name}' asked for but no CUDA device is available; pass --device cpu or auto"
    with pytest.raises(ConfigError, match=re.escape(message)):
        device_for(name)


@pytest.mark.gpu
@NEEDS_CUDA
@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_an_explicit_cuda_name_is_taken_as_given_when_cuda_is_present(name: str) -> None:
    device = device_for(name)
    assert device == torch.device(name)
    assert torch.zeros(1, device=device).is_cuda
