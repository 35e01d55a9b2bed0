"""Which torch device trains: the one asked for, or CUDA when present under 'auto'."""

from __future__ import annotations

import torch

from fedfair.core.errors import ConfigError


def device_for(name: str) -> torch.device:
    """'auto' picks CUDA when present; anything else is taken as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device '{name}' asked for but no CUDA device is available; pass --device cpu or auto")
    return torch.device(name)
