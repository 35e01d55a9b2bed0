"""Secure aggregation: the server learns the weighted sum of the parties' updates, nothing else.

Bonawitz et al. (2017) double masking with Shamir t-of-n recovery of dropped parties, against an
active aggregator: keys, share entries, share checks and consistency views are signed by the
parties' identity keys, parties unmask only a view of the round that t survivors signed, and
rebuilt secrets are verified against commitments so that bad shares are named rather than
trusted. The threshold rule (:func:`threshold_for`, :func:`check_threshold`) ties t to the
number of colluding parties tolerated; an optional SecAgg+ neighbour graph cuts the cost for
large federations. docs/layout.md lists the modules, docs/design.md section 5 the argument.
"""

from fedfair.core.errors import (
    AuthenticationError,
    PrivacyWarning,
    ProtocolError,
    StaleMessageError,
    SumOutOfRangeError,
    ThresholdError,
    UnmaskRefusedError,
)
from fedfair.secagg.client import Client
from fedfair.secagg.config import SecAggConfig, check_threshold, threshold_for
from fedfair.secagg.encode import (
    Decoded,
    Encoder,
    EncodingConfig,
    check_no_wraparound,
    largest_safe_fractional_bits,
)
from fedfair.secagg.wire import Stage
from fedfair.secagg.server import AggregateResult, Server
from fedfair.secagg.simulate import DropOut, Faults, RoundTrace, simulate_round

__all__ = [
    "AggregateResult",
    "AuthenticationError",
    "Client",
    "Decoded",
    "DropOut",
    "Encoder",
    "EncodingConfig",
    "Faults",
    "PrivacyWarning",
    "ProtocolError",
    "RoundTrace",
    "SecAggConfig",
    "Server",
    "Stage",
    "StaleMessageError",
    "SumOutOfRangeError",
    "ThresholdError",
    "UnmaskRefusedError",
    "check_no_wraparound",
    "check_threshold",
    "largest_safe_fractional_bits",
    "simulate_round",
    "threshold_for",
]
