"""A site that lies in one re-checked report: ``python lying_site.py ROUND LIE fedfair-arguments...``.

It runs the real collaborator (``fedfair`` with the arguments given) with RESUMMED_WORDS patched to 0 words, as
tests/runtime/test_voided_rounds.py's ``ABOVE_THE_BOUND`` does, so every sum is above the bound and, as the plan
allows a colluder, re-checked. In training round ROUND the first value it re-checks is, by LIE, ``moved`` by 1 (the
re-check red team's finding 2) or cut ``short`` to 31 bytes (finding 1) before it signs its tag: a false report
signed with its own key, which needs no aggregator's help. Used by tests/runtime/test_rechecked_sums.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator

from fedfair.secagg import config

config.RESUMMED_WORDS = 0  # before any round is made: every sum is above the bound

from fedfair.cli import main  # noqa: E402 -- after the patch above
from fedfair.runtime.contract import TRAINING, session_round  # noqa: E402
from fedfair.secagg import verify_client  # noqa: E402
from fedfair.secagg.config import SecAggConfig  # noqa: E402

LIES = ("moved", "short")


def lie(round_number: int, how: str) -> None:
    """Rewrite what this site reports in round `round_number`: its first re-checked value, moved by 1 or cut short."""
    true_values, true_encoding = verify_client.peer_values, verify_client.encode_tags
    session = session_round(round_number, TRAINING)
    cutting: list[bool] = []  # set as the round's first value is found, for its encoding to cut

    def false_values(*args: object, config: SecAggConfig, **keywords: object) -> Iterator[tuple[int, tuple[int, ...]]]:
        for at, (peer, value) in enumerate(true_values(*args, config=config, **keywords)):  # type: ignore[arg-type]
            first = at == 0 and config.round == session
            cutting.append(first and how == "short")
            yield peer, (value[0] + (first and how == "moved"), *value[1:])

    def short_encoding(tags: Iterable[int]) -> bytes:
        field = true_encoding(tags)
        return field[:31] if cutting and cutting.pop() else field

    setattr(verify_client, "peer_values", false_values)  # noqa: B010 -- the rewrite is the attack
    setattr(verify_client, "encode_tags", short_encoding)  # noqa: B010


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] not in LIES:
        sys.exit(f"usage: {sys.argv[0]} ROUND {{{','.join(LIES)}}} fedfair-arguments...")
    lie(int(sys.argv[1]), sys.argv[2])
    sys.exit(main(sys.argv[3:]))
