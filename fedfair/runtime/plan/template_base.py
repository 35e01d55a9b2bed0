"""What every template is rendered from (:class:`Federation`, :data:`DEMO`) and the comment layout they share.

The plan's template is :mod:`fedfair.runtime.plan.templates`, the collaborator config's
:mod:`fedfair.runtime.plan.config_template`. This module only writes text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fedfair.runtime.plan.composition_note import Headline

AGGREGATOR_NAME = "aggregator"
"""The aggregator's certificate name, in the plan's [aggregator] and each config's aggregator_name."""
MANIFEST = "manifest.toml"
"""The federation manifest's file name, one folder above each party's own folder."""
NOTE_COLUMN = 20
"""Where a plan key's trailing comment starts, so continuation lines line up under it."""


@dataclass(frozen=True)
class Federation:
    """What the templates are rendered from.

    ``sites`` are the collaborators' names, in order (a site's position is its ``[data] index``).
    ``aggregator`` is the host:port collaborators dial; the plan listens on every interface at
    its port. ``certs`` is each party's certificates folder relative to its own folder.
    ``max_colluding`` None leaves the key commented (its default, 0, applies). ``schema`` is a
    ``[schema]`` section (with any comment lines before it), or None for the commented example;
    with one, each site's ``[data] csv`` is ``table`` and [model] leaves features and classes to the
    schema. ``sizes_example`` fills the commented ``[influence] sizes`` line (None: placeholders).
    ``composition_example`` names the commented ``[evaluation] composition`` line's columns (None:
    placeholders), and ``headline`` what turning it on costs the worst-group risk's interval (None:
    said without figures). ``auditor`` names the auditor institution of the two-verifier input bound, which the
    plan then declares (None: the lines stay commented examples).
    """

    federation_id: str
    sites: tuple[str, ...]
    aggregator: str = "localhost:50051"
    certs: str = "../certs"
    max_colluding: int | None = None
    schema: str | None = None
    table: str = "data/patients.csv"
    sizes_example: tuple[int, ...] | None = None
    composition_example: tuple[str, ...] | None = None
    headline: Headline | None = None
    auditor: str | None = None

    @property
    def listen(self) -> str:
        """The plan's [aggregator] address: every interface, at the port collaborators dial."""
        return "0.0.0.0:" + self.aggregator.rpartition(":")[2]


DEMO = Federation(
    federation_id="fedfair-demo",
    sites=("hospital-a", "hospital-b", "hospital-c"),
    sizes_example=(30000, 3000, 1600),
)
"""The committed templates' federation: the demo's three hospitals on one machine, sharing ../certs."""


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string."""
    # A JSON string is a valid TOML basic string (names and paths here hold no DEL).
    return json.dumps(value)


def noted(code: str, note: str, column: int = NOTE_COLUMN) -> str:
    """``code`` with ``note`` as a trailing comment starting at ``column`` (or one space after a longer line)."""
    return f"{code.ljust(column - 1)} # {note}"


def maybe(active: bool, line: str) -> str:
    """``line`` as a setting, or commented out as an example."""
    return line if active else f"# {line}"
