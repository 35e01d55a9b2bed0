"""The plan template's commented ``[evaluation] composition`` line, and what turning it on costs the headline.

``fedfair init`` writes the line with columns of its [schema] (a placeholder without one) and a note that
prices them: the final worst-group risk's 95% half-width without and with their counts (:class:`Headline`),
which :func:`fedfair.runtime.plan.composition_price.headline_half_widths` computes. Like
:mod:`fedfair.runtime.plan.templates`, which renders the plan around the line, this module only writes text
(no numerical stack), so ``fedfair init --help`` stays light.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Headline:
    """The final worst-group risk's expected 95% half-width over `rows` held-out rows, without and with composition.

    Computed by :func:`fedfair.runtime.plan.composition_price.headline_half_widths` from the plan's privacy; only
    written here, so that this module stays free of the numerical stack.
    """

    rows: int
    without: float
    composed: float


COMPOSITION_COLUMN = 33
"""Where the composition line's note starts: under a two-column example's line, as it always did."""
TEXT_WIDTH = 100
"""The longest line of the composition note."""

_COMPOSITION_NOTE = (
    "with a [schema]: who is in the worst-off group at the final evaluation, by categorical columns "
    "with listed categories or the label; each site's counts by category go through the small-cell "
    "rule ([schema] min_category_count) into the sum. The counts travel in the final answer and share "
    "its noise, so they widen the headline interval: "
)


def composition_line(names: tuple[str, ...], headline: Headline | None, *, placeholder: bool) -> str:
    """The commented ``[evaluation] composition`` line naming `names`, and what counting them costs.

    `placeholder`: `names` stand in for columns nobody named yet (the note prices one such column);
    `headline` None: the note says where the figures are printed instead of giving them.
    """
    # A JSON string is a valid TOML basic string (column names hold no DEL).
    code = "# composition = [" + ", ".join(json.dumps(name) for name in names) + "]"
    cost = (
        "`fedfair data check` prints the worst-group risk's half-width with and without them"
        if headline is None
        else f"over {headline.rows:,} held-out rows in all, the worst-group risk's 95% half-width is "
        f"+/- {headline.without:.2g} without them and +/- {headline.composed:.2g} with "
        f"{'one such column' if placeholder else 'these columns'}"
    )
    lines = textwrap.wrap(_COMPOSITION_NOTE + cost, width=TEXT_WIDTH - COMPOSITION_COLUMN - 2, break_on_hyphens=False)
    notes = [f"{' ' * COMPOSITION_COLUMN}# {line}" for line in lines]
    if len(code) + 2 <= COMPOSITION_COLUMN:  # the note starts on the example's line, as the other keys' do
        notes[0] = code.ljust(COMPOSITION_COLUMN) + notes[0][COMPOSITION_COLUMN:]
    else:
        notes.insert(0, code)
    return "\n".join(notes) + "\n"
