"""The collaborator's side of each built-in kind of round: importing this package registers their own steps.

A kind's steps plug in by name (:func:`~fedfair.runtime.collaborator.steps.register_kind_steps`), as its round does
(:func:`~fedfair.secagg.round.register_round_kind`): the masked round's (:mod:`.masked`) and the bounded sum's
(:mod:`.bounded`), with the encoding its sites contribute, and each one's catch-up of a missed round
(:mod:`.masked_catch_up`, :mod:`.bounded_catch_up`). No other module of the collaborator names a kind; a
plug-in's kind registers its steps the same way, from its own module.
"""

from fedfair.runtime.collaborator.kinds import bounded as bounded
from fedfair.runtime.collaborator.kinds import bounded_catch_up as bounded_catch_up
from fedfair.runtime.collaborator.kinds import masked as masked
from fedfair.runtime.collaborator.kinds import masked_catch_up as masked_catch_up
