"""Secure aggregation: the server learns the weighted sum of the parties' updates, nothing else.

Bonawitz et al. (2017) double masking with Shamir t-of-n recovery of dropped parties,
in its variant against an active aggregator (protocol v2): every round's keys, share
entries, share checks and consistency views are signed by the parties' identity keys,
a round runs six stages (ADVERTISE, SHARE, CHECK, MASK, CONSISTENCY, UNMASK), parties
unmask only a view of the round that t survivors signed, and rebuilt secrets are
verified against commitments so that bad shares are named rather than trusted. The
threshold rule (:func:`threshold_for`, :func:`check_threshold`) ties t to the number
of colluding parties tolerated. An optional SecAgg+ neighbour graph cuts the cost for
large federations. The modules, bottom up:

- :mod:`~fedfair.secagg.prg`: AES-256-CTR keystream masks.
- :mod:`~fedfair.secagg.shamir`: secret sharing over GF(2^127 - 1).
- :mod:`~fedfair.secagg.keys`: X25519, HKDF-SHA256, AES-256-GCM share encryption.
- :mod:`~fedfair.secagg.encode`: fixed-point encoding modulo 2^k, wraparound check, error bound.
- :mod:`~fedfair.secagg.graph`: complete or random k-regular neighbour graphs.
- :mod:`~fedfair.secagg.config`: the round's public parameters and the threshold rule.
- :mod:`~fedfair.secagg.messages`: plain, serialisable messages.
- :mod:`~fedfair.secagg.client` / :mod:`~fedfair.secagg.server`: the two state machines.
- :mod:`~fedfair.secagg.simulate`: a whole round in one process.
- :mod:`~fedfair.secagg.demo`: the ``fedfair secagg-demo`` command.
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
from fedfair.secagg.simulate import RoundTrace, simulate_round

__all__ = [
    "AggregateResult",
    "AuthenticationError",
    "Client",
    "Decoded",
    "Encoder",
    "EncodingConfig",
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
