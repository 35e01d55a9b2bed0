"""One input per model, for good: the survivor sets a collaborator signed, kept on disk.

Secure aggregation reveals the sum of the inputs of one survivor set. Were the same
input (the same model trained on, hence with ``batch_fraction = 1`` the same update)
summed with two survivor sets that differ by one site, the aggregator could subtract
the two sums and read that site's update. Within one session the protocol prevents
this; across sessions the aggregator could re-run a round without one site, run the
next round on the same model, or restart a collaborator to make it forget. So a
collaborator keeps, beside its config (``NAME.FEDERATION.bindings.json``, written
atomically before its signature leaves):

- per input kind (``statistics``, ``train``, ``evaluate``) and model digest, the
  survivor set it signed for: it signs no other set for that model, in any round;
- the latest round it signed for: it refuses an older one, so old rounds cannot be
  replayed against it. The same round again, of any kind, is allowed: an aggregator
  killed during a round's evaluation resumes from the checkpoint before that round
  and re-runs its training, whose input is bound to the same survivors as before.

A file that cannot be read is refused with its path, never silently reset: losing it
would reopen the attack.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fedfair.core.errors import ConfigError, FedfairError
from fedfair.core.files import atomic_write

KINDS = ("statistics", "train", "evaluate")
"""The kinds of input: the statistics before round 1 (round 0), a round's training and its evaluation."""

FORMAT = "fedfair-bindings"


class BindingRefused(FedfairError):
    """This input may not be contributed: an older round, or a model already bound to other survivors."""


@dataclass
class SignedView:
    """The survivors (by name) this collaborator signed for one input, whichever session carried it.

    A round the aggregator re-runs (after a crash, or pretending one) carries the same
    input again; the collaborator then signs only the same survivor set, so no two
    unmasked sums differ by one party's input. Honest parties sign one view per input,
    which is what the threshold rule needs across sessions as within one.
    """

    survivors: frozenset[str] | None = None
    keep: Callable[[frozenset[str]], None] = field(default=lambda survivors: None, repr=False)
    """Persists a binding before the signature that commits to it is sent."""

    def bind(self, survivors: frozenset[str]) -> None:
        """Bind this input to `survivors` (kept first, then remembered here)."""
        self.keep(survivors)
        self.survivors = survivors


class Bindings:
    """The bindings of one collaborator in one federation, loaded from and kept in ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._survivors: dict[str, frozenset[str]] = {}
        self._latest: int | None = None
        self._views: dict[str, SignedView] = {}
        if path.exists():
            self._load()

    def _load(self) -> None:
        fix = (
            "restore it from a backup; deleting it would let the aggregator sum this institution's past inputs "
            "with other survivors, so do so only for a new federation id"
        )
        try:
            data = json.loads(self.path.read_text())
            if data.get("format") != FORMAT:
                raise ValueError("not a bindings file")
            latest = data["latest"]
            self._latest = None if latest is None else int(latest)
            self._survivors = {
                str(key): frozenset(str(name) for name in names) for key, names in data["inputs"].items()
            }
        except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
            raise ConfigError(f"{self.path}: unreadable bindings ({error}); {fix}") from None

    def _save(self) -> None:
        document = {
            "format": FORMAT,
            "latest": self._latest,
            "inputs": {key: sorted(names) for key, names in sorted(self._survivors.items())},
        }
        payload = json.dumps(document, indent=1).encode()
        atomic_write(self.path, lambda stream: stream.write(payload))

    @property
    def latest(self) -> int | None:
        """The round of the latest input signed for, or None."""
        return self._latest

    def view(self, round_number: int, kind: str, model: str) -> SignedView:
        """The survivor binding of the input of `kind` on `model` in round `round_number`.

        Raises BindingRefused for a round older than the latest one signed for: an
        aggregator replaying it could difference its sum against the one already revealed.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown input kind {kind!r}; one of {', '.join(KINDS)}")
        if self._latest is not None and round_number < self._latest:
            raise BindingRefused(
                f"round {round_number} ({kind}) is older than round {self._latest}, which this institution "
                f"has already contributed to (kept in {self.path}); a replayed round's sum could be subtracted "
                "from one already revealed"
            )
        key = f"{kind}:{model}"
        view = self._views.get(key)
        if view is None:

            def keep(survivors: frozenset[str]) -> None:
                self._survivors[key] = survivors
                self._latest = max(round_number, self._latest or round_number)
                self._save()

            view = self._views[key] = SignedView(self._survivors.get(key), keep)
        return view
