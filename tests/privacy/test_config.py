"""`PrivacyConfig`: the settings it refuses."""

from __future__ import annotations

import pytest

from fedfair.core.errors import ConfigError
from fedfair.privacy.config import PrivacyConfig


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"enabled": True}, "noise_multiplier = 1.0 or target_epsilon"),
        ({"enabled": True, "noise_multiplier": 1.0, "target_epsilon": 3.0}, "not both"),
        ({"noise_multiplier": -1.0}, "noise_multiplier must be"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
        ({"delta": 1.0}, "delta must be"),
        ({"budget_epsilon": 0.0}, "budget_epsilon"),
        ({"accountant": "gdp"}, "prv or rdp"),
    ],
)
def test_privacy_config_validation(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        PrivacyConfig(**kwargs)
