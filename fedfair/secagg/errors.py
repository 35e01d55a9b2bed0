"""Protocol violations of secure aggregation.

A :class:`ProtocolError` means a message or request broke the protocol: the
receiving state machine refused it and its own state did not change. The runtime
drops the message (and, if it came from a party, treats that party as silent).
Bad *configuration* is a :class:`fedfair.core.errors.ConfigError` instead.
"""

from __future__ import annotations

from fedfair.core.errors import FedfairError


class ProtocolError(FedfairError):
    """A message is malformed, out of order, duplicated or inconsistent with the round."""


class AuthenticationError(ProtocolError):
    """A signature, credential or encrypted share fails to verify (forged or swapped key)."""


class StaleMessageError(ProtocolError):
    """A message belongs to another federation, round, stage or session (a replay or a late message)."""


class ThresholdError(ProtocolError):
    """Fewer parties than the threshold t remain, so the round is aborted without revealing anything."""


class UnmaskRefusedError(ProtocolError):
    """A request would reveal both kinds of share of one party, or contradicts what this party saw or signed."""


class SumOutOfRangeError(ProtocolError):
    """The unmasked sum is impossible for honest inputs (a weight or coordinate beyond the encoding's bounds).

    Some contributor encoded more than the encoding allows; the round is void and nothing may be applied.
    """


class PrivacyWarning(UserWarning):
    """A configuration runs but protects less than secure aggregation usually does."""
