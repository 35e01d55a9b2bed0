"""The aggregator's side of secure aggregation (protocol v3): collect, forward, check, sum, unmask.

:class:`Server` is a state machine over plain messages with no I/O. Each stage has a ``receive_*``
step per arriving message, which raises a :class:`~fedfair.core.errors.ProtocolError` subclass
for a message it refuses, and a closing step (``key_directory``, ``share_bundles``,
``masking_set``, ``survivor_set``, ``unmask_request``, ``finish``) that fixes who survived and
raises :class:`~fedfair.core.errors.ThresholdError` when fewer than t parties remain.
:meth:`Server.ready` says when UNMASK may close early. Masked inputs are summed as they arrive,
so only the sum is ever unmasked; how culprits are named is in docs/design.md ("Inside secure
aggregation"). Its stages are split by job: the key stages (:mod:`fedfair.secagg.keys_server`), the masking
ones (:mod:`fedfair.secagg.masking_server`) and the verifying ones (:mod:`fedfair.secagg.verify_server`), over
the state they share (:mod:`fedfair.secagg.server_state`).
"""

from __future__ import annotations

from fedfair.secagg.keys_server import KeyStages
from fedfair.secagg.masking_server import MaskingStages
from fedfair.secagg.server_state import AggregateResult
from fedfair.secagg.verify_server import VerifyStages

__all__ = ["AggregateResult", "Server"]


class Server(KeyStages, MaskingStages, VerifyStages):
    """The aggregator's state for one round, and every stage's steps.

    verify_credential checks each advertisement's credential against the roster name, so a
    forged or swapped key is refused at the door (peers check again themselves).
    """
