"""A party whose evaluation runs the echo round: ``python echo_party.py ARGS...`` runs ``fedfair ARGS...``.

It installs :data:`tests.secagg.echo_round.ECHO_ROUND` as the secure round of every evaluation, then runs the
real command (``fedfair ARGS``): the aggregator's driver and the collaborator's steps loop over the round's
declaration, so neither is told about the echo. The institution's own process chooses its round, never the
wire. Used by tests/runtime/test_one_place_stage.py.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from fedfair.cli import main
from fedfair.runtime.collaborator.stage_steps import STEPS, round_steps
from fedfair.runtime.collaborator.steps import KIND_STEPS, register_kind_steps
from fedfair.runtime.contract import EVALUATION
from fedfair.secagg.round import SECURE_ROUND
from tests.secagg.echo_round import ECHO_ROUND


def install() -> None:
    """Make every evaluation of this process run :data:`ECHO_ROUND` (the module constant every part imported).

    The echo round is the masked round with a stage more: it plugs in the masked round's collaborator steps.
    """
    register_kind_steps(ECHO_ROUND.name, KIND_STEPS[SECURE_ROUND.name])
    echoing = replace(EVALUATION, protocol=ECHO_ROUND)
    object.__setattr__(EVALUATION, "protocol", echoing.protocol)
    object.__setattr__(EVALUATION, "specs", echoing.specs)
    STEPS.update(round_steps(EVALUATION))


if __name__ == "__main__":
    install()
    sys.exit(main(sys.argv[1:]))
