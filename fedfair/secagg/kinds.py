"""The built-in kinds of secure round: importing this module registers each (:func:`~.round.register_round_kind`).

A runner looks a kind up by name (:func:`~.round.round_kind`) or takes the default (:func:`~.round.default_round_kind`)
and names none: the masked round (:mod:`.masked_round`, the default) and the bounded sum (:mod:`.bounded.stages`) are
registered here, as a plug-in's kind is by the module that declares it.
"""

from __future__ import annotations

from fedfair.secagg import masked_round as masked_round
from fedfair.secagg.bounded import stages as bounded_stages

__all__ = ["bounded_stages", "masked_round"]
