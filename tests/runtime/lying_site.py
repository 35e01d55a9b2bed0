"""A site that reports one false re-checked value: ``python lying_site.py ROUND fedfair-arguments...``.

It runs the real collaborator (``fedfair`` with the arguments given) with RESUMMED_WORDS patched to 0 words, as
tests/runtime/test_voided_rounds.py's ``ABOVE_THE_BOUND`` does, so every sum is above the bound and, as the plan
allows a colluder, re-checked. In training round ROUND the first value it re-checks is moved by 1 before it signs
its tag: a false report signed with its own key, which needs no aggregator's help (the re-check red team's finding
2). Used by tests/runtime/test_rechecked_sums.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from fedfair.secagg import config

config.RESUMMED_WORDS = 0  # before any round is made: every sum is above the bound

from fedfair.cli import main  # noqa: E402 -- after the patch above
from fedfair.runtime.contract import TRAINING, session_round  # noqa: E402
from fedfair.secagg import verify_client  # noqa: E402
from fedfair.secagg.config import SecAggConfig  # noqa: E402


def lie(round_number: int) -> None:
    """Rewrite what this site reports in round `round_number`: its first re-checked value, moved by 1."""
    true_values = verify_client.peer_values
    session = session_round(round_number, TRAINING)

    def false_values(*args: object, config: SecAggConfig, **keywords: object) -> Iterator[tuple[int, tuple[int, ...]]]:
        for at, (peer, value) in enumerate(true_values(*args, config=config, **keywords)):  # type: ignore[arg-type]
            moved = at == 0 and config.round == session
            yield peer, (value[0] + moved, *value[1:])

    setattr(verify_client, "peer_values", false_values)  # noqa: B010 -- the rewrite is the attack


if __name__ == "__main__":
    lie(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
