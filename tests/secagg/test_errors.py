"""The secure-aggregation error hierarchy: one ProtocolError base for refusals, distinct kinds, config errors apart."""

from __future__ import annotations

import itertools
import warnings

import pytest

from fedfair.core.errors import ConfigError, FedfairError
import fedfair.secagg
from fedfair.core import errors
from fedfair.secagg.codec import Reader
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig

REFUSALS = (
    errors.AuthenticationError,
    errors.StaleMessageError,
    errors.ThresholdError,
    errors.UnmaskRefusedError,
    errors.SumOutOfRangeError,
)
"""Every specific kind of refusal the state machines raise."""


@pytest.mark.parametrize("kind", [errors.ProtocolError, *REFUSALS], ids=lambda kind: kind.__name__)
def test_every_refusal_reaches_a_protocol_error_handler_and_the_clis_fedfair_error_handler(kind: type) -> None:
    assert issubclass(kind, errors.ProtocolError)  # the runtime drops the message
    assert issubclass(kind, FedfairError)  # the CLI prints the line


@pytest.mark.parametrize("kind", [errors.ProtocolError, *REFUSALS], ids=lambda kind: kind.__name__)
def test_no_refusal_is_a_value_error_or_a_config_error(kind: type) -> None:
    """`except ValueError` around a conversion must not swallow a protocol violation, nor a config handler."""
    assert not issubclass(kind, ValueError)
    assert not issubclass(kind, ConfigError)


@pytest.mark.parametrize(("first", "second"), list(itertools.permutations(REFUSALS, 2)), ids=lambda kind: kind.__name__)
def test_a_handler_for_one_kind_of_refusal_does_not_catch_another(first: type, second: type) -> None:
    """E.g. catching ThresholdError to abort the round must not catch a stale message, which is only dropped."""
    assert not issubclass(first, second)


def test_bad_configuration_is_a_config_error_and_not_a_protocol_error() -> None:
    encoding = EncodingConfig(clip=1.0, max_weight=1.0, fractional_bits=8)
    with pytest.raises(ConfigError, match="at least 2 parties") as caught:
        SecAggConfig("federation", 0, ("only",), 4, encoding)
    assert not isinstance(caught.value, errors.ProtocolError)


def test_malformed_bytes_raise_a_protocol_error_that_is_not_a_config_error() -> None:
    with pytest.raises(errors.ProtocolError, match="malformed") as caught:
        Reader(b"\x00").u32()
    assert not isinstance(caught.value, ConfigError)


def test_the_privacy_warning_is_a_user_warning_that_a_filter_can_escalate_not_an_error() -> None:
    assert issubclass(errors.PrivacyWarning, UserWarning)
    assert not issubclass(errors.PrivacyWarning, FedfairError)
    encoding = EncodingConfig(clip=1.0, max_weight=1.0, fractional_bits=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.PrivacyWarning)
        with pytest.raises(errors.PrivacyWarning, match="2 parties"):
            SecAggConfig("federation", 0, ("a", "b"), 4, encoding)


def test_the_package_exports_the_same_error_classes() -> None:
    for kind in (errors.ProtocolError, errors.PrivacyWarning, *REFUSALS):
        assert getattr(fedfair.secagg, kind.__name__) is kind
        assert kind.__name__ in fedfair.secagg.__all__
