"""The auditor's side of each built-in kind of round with a second verifier: importing this package registers it.

The bounded sum's (:mod:`.bounded`) registers its steps by name
(:func:`~fedfair.runtime.auditor.steps.register_auditor_steps`); no other module of the auditor names a kind.
"""

from fedfair.runtime.auditor.kinds import bounded as bounded
