"""The evaluation figures a site verified, and the only ones its kept bundle may carry.

Verified aggregation proves each evaluation's sums; the figures in the bundle's metrics are the aggregator's word.
So a site makes each evaluation sum it verified into its figures with the aggregator's own functions
(:mod:`fedfair.runtime.evaluation_figures`) and, at FINISHED, holds the bundle's evaluation records to them
(:meth:`EvaluationFigures.check`): one it verified is kept as the site computed it; one it did not verify is left
out of the kept copy (a warning names the round); one that differs is forged and refuses the bundle
(``bundle-refused``, exit 2). Under a noised plan the stated noise depends on whether the model was answered
before: the site computes each case an honest aggregator may be in, and calls a record forged only when it knows
every earlier evaluation. Kept as NAME.FEDERATION.figures.json beside the config (docs/security.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write
from fedfair.runtime.evaluation_figures import Earlier, answer_epsilon, evaluation_figures, noise_stds
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.secagg import Encoder

logger = logging.getLogger("fedfair.collaborator")

FIGURES_SUFFIX = "figures.json"
"""The figures a site verified are kept as NAME.FEDERATION.figures.json beside the config."""

NOTES = ("status", "excluded")
"""The keys of an evaluation record that are no figure: its status and whom the aggregator excluded."""

UNDONE = (*NOTES, "reason")
"""All an evaluation record that is not done holds (skipped or aborted): its status, why, and whom it excluded."""


@dataclass(frozen=True)
class Checked:
    """What a bundle's metrics hold against the figures this site verified.

    forged: why the first record that differs from what the site verified is forged (None: none differs).
    metrics: the metrics the kept bundle carries: each evaluation record as the site verified it, or left out.
    left_out: each evaluation round whose figures are left out of the kept bundle, and why.
    """

    forged: str | None
    metrics: list[dict[str, Any]]
    left_out: dict[int, str] = field(default_factory=dict)


class EvaluationFigures:
    """Each evaluation this site was asked and the figures of each one whose sums it verified.

    Kept in `folder`, the site's own (None: nothing kept across restarts). `classes` is the model's K (the noised
    report's class-prior baseline), None before the model is built.
    """

    def __init__(self, name: str, shared: SharedSettings, folder: Path | None, classes: int | None) -> None:
        self._name, self._shared, self._classes = name, shared, classes
        self.path = None if folder is None else folder / f"{name}.{shared.federation_id}.{FIGURES_SUFFIX}"
        self._asked: dict[int, dict[str, Any]] = {}
        """Round -> the model asked ("model": digest, "c") and, once verified, "contributors" and "records"
        (every record an honest aggregator may state) or "unverified" (why the verified sum gave none)."""
        self._loaded = self.path is None
        self._forged: dict[str, Any] | None = None
        """The first forged figure of a bundle this site refused: its round and why."""

    def asked(self, round_number: int, model: str, c: float) -> None:
        """Round `round_number`'s evaluation asks this site to answer the model of digest `model` and threshold `c`."""
        entry = self._entries().get(round_number)
        if entry is None or entry["model"] != model:
            self._asked[round_number] = {"model": model, "c": c}
            self._save()

    def verified(
        self, round_number: int, model: str, words: np.ndarray, survivors: Collection[str], encoder: Encoder
    ) -> None:
        """Turn round `round_number`'s verified evaluation sum (`words`, encoded) into the figures it makes.

        Only for the model this site was asked (:meth:`asked`): round 0's table statistics are no evaluation.
        """
        entry = self._entries().get(round_number)
        if entry is None or entry["model"] != model or not survivors:
            return
        contributors = sorted(survivors)
        decoded = encoder.decode(words, len(contributors))
        entry["contributors"] = contributors
        try:
            entry["records"] = [
                _normal(record)
                for record in self._records(round_number, entry, decoded.weighted_sum, decoded.error_bound)
            ]
            entry.pop("unverified", None)
        except ConfigError as error:
            entry["unverified"] = f"the sums this site verified give no report ({error})"
        self._save()

    def check(self, metrics: Sequence[Mapping[str, Any]]) -> Checked:
        """Hold each evaluation record of a bundle's `metrics` to what this site verified (the module's rules)."""
        kept: list[dict[str, Any]] = []
        left_out: dict[int, str] = {}
        for entry in metrics:
            record = entry.get("evaluation")
            number = entry.get("round")
            if record is None or (
                isinstance(record, Mapping) and record.get("status") != "done" and set(record) <= set(UNDONE)
            ):
                kept.append(dict(entry))  # no figure: skipped, aborted, or no evaluation that round
                continue
            if not isinstance(number, int):
                return Checked(f"evaluation: a record of the bundle's metrics names no round ({number!r})", [])
            if not isinstance(record, Mapping) or record.get("status") != "done":
                # Figures in a record not marked done (or no record at all): no honest aggregator writes them, and
                # kept, they would ride in the bundle unverified (issue 79's property test found it).
                held = sorted(set(record) - set(UNDONE)) if isinstance(record, Mapping) else [type(record).__name__]
                status = _shown(record, "status") if isinstance(record, Mapping) else "no record"
                return self._refused(
                    number, f"evaluation: round {number}'s record is {status}, not done, yet carries {', '.join(held)}"
                )
            ours = self._entries().get(number)
            why = self._unverified(number, ours)
            if why is None:
                assert ours is not None  # only a verified round has no reason to be left out
                # In an exact plan the round whose answers were sent again changes no figure: it is no figure.
                notes = NOTES if self._shared.privacy.noised else (*NOTES, "answers_of_round")
                stated = _normal({key: value for key, value in record.items() if key not in notes})
                match = next((candidate for candidate in ours["records"] if candidate == stated), None)
                if match is not None:
                    kept.append({**entry, "evaluation": {"status": "done", **match}})
                    continue
                if self._knows_every_ask(number):
                    return self._refused(number, _forgery(number, stated, ours["records"][0]))
                why = (
                    "its figures are not those of the sums this site verified, whose noise depends on an earlier "
                    "evaluation this site did not take part in"
                )
            left_out[number] = why
            kept.append({**entry, "evaluation": {"status": "unverified", "reason": why}})
        return Checked(None, kept, left_out)

    def _refused(self, round_number: int, why: str) -> Checked:
        """The bundle refused for a forged figure of round `round_number`: said in this site's file too."""
        self._forged = {"round": round_number, "why": why}
        self._save()
        return Checked(why, [])

    # ------------------------------------------------------------ what an honest aggregator may state

    def _records(self, round_number: int, entry: Mapping[str, Any], summed: np.ndarray, error: float) -> list[Any]:
        """Every record an honest aggregator may state of this sum: the model answered afresh, or answered before."""
        shared, contributors = self._shared, entry["contributors"]
        columns = shared.counted_columns(round_number)
        cases: list[Earlier | None] = [None]
        first = self._first_ask(round_number, entry["model"])
        if first is not None and shared.privacy.noised:
            known = self._entries()[first].get("contributors")
            cases += [Earlier(entry["model"], first, None)]
            if known is not None:
                cases += [Earlier(entry["model"], first, frozenset(known))]
        records = []
        for repeated in cases:
            stds = noise_stds(shared, shared.collaborator_count, round_number, columns, contributors, repeated)
            figures = evaluation_figures(shared, round_number, summed, entry["c"], error, stds, self._classes)
            composition = figures.pop("composition", None)
            record: dict[str, Any] = {
                "round": round_number,
                "model": entry["model"],
                "collaborators": len(contributors),
                **figures,
            }
            if shared.privacy.noised:
                record["report_epsilon"] = answer_epsilon(shared, round_number if repeated is None else repeated.round)
            if repeated is not None:
                record["answers_of_round"] = repeated.round
            if composition is not None:
                record["composition"] = composition
            records.append(record)
        return records

    def _first_ask(self, round_number: int, model: str) -> int | None:
        """The first round of the latest run of asks of `model` before `round_number` (the aggregator's Earlier)."""
        first = None
        for number in sorted(number for number in self._entries() if number < round_number):
            if self._entries()[number]["model"] == model:
                first = number if first is None else first
            else:
                first = None
        return first

    def _knows_every_ask(self, round_number: int) -> bool:
        """Whether this site can tell every record an honest aggregator may state of round `round_number`.

        Exact figures are a function of the verified sum alone. Noised ones depend on whether the model was
        asked before, which the site knows only if it was asked every evaluation the plan held before.
        """
        shared = self._shared
        if not shared.privacy.noised:
            return True
        due = (number for number in range(1, round_number) if shared.evaluation.due(number, shared.training.rounds))
        return all(number in self._entries() for number in due)

    def _unverified(self, round_number: int, entry: Mapping[str, Any] | None) -> str | None:
        """Why this site holds no figure of the evaluation of `round_number`; None when it verified some."""
        if entry is None or "contributors" not in entry:
            return f"this site did not verify the evaluation sums of round {round_number}"
        if "unverified" in entry:
            return str(entry["unverified"])
        return None

    # ------------------------------------------------------------ the file

    def _entries(self) -> dict[int, dict[str, Any]]:
        """The rounds asked: in memory, or (the first time, after a restart) as kept on disk."""
        if not self._loaded:
            self._loaded = True
            path = self.path
            if path is not None and path.exists():
                try:
                    document = json.loads(path.read_text())
                    self._asked = {int(number): dict(entry) for number, entry in document["evaluations"].items()}
                except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
                    logger.warning(
                        "%s: the evaluation figures this site verified (%s) are unreadable (%s); the kept bundle "
                        "will carry none of the evaluations verified before",
                        self._name,
                        path,
                        error,
                    )
        return self._asked

    def _save(self) -> None:
        if self.path is None:
            return
        document: dict[str, Any] = {"evaluations": {str(n): entry for n, entry in sorted(self._asked.items())}}
        if self._forged is not None:
            document["forged"] = self._forged
        payload = json.dumps(document, indent=1, default=_scalar).encode()
        atomic_write(self.path, lambda stream: stream.write(payload))


def _forgery(round_number: int, stated: Mapping[str, Any], verified: Mapping[str, Any]) -> str:
    """Which figure of round `round_number`'s evaluation differs from the one this site verified, and how."""
    differing = sorted(
        key
        for key in stated.keys() | verified.keys()
        if key not in stated or key not in verified or stated[key] != verified[key]
    )
    key = differing[0]
    return (
        f"evaluation: round {round_number}'s {key} is {_shown(stated, key)} in the bundle, but "
        f"{_shown(verified, key)} from the evaluation sums this site verified"
        + (f" ({len(differing)} figures differ: {', '.join(differing)})" if len(differing) > 1 else "")
    )


def _shown(record: Mapping[str, Any], key: str) -> str:
    """`record`'s `key` as the refusal shows it: its JSON, cut short, or "absent" where the record has none."""
    text = json.dumps(record[key]) if key in record else "absent"
    return text if len(text) <= 80 else text[:77] + "..."


def _normal(record: Mapping[str, Any]) -> Any:
    """`record` as JSON reads it back (numpy scalars as numbers, tuples as lists), so records compare exactly."""
    return json.loads(json.dumps(record, default=_scalar))


def _scalar(value: object) -> object:
    """A numpy scalar as the Python number it holds (what json.dumps cannot write itself)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
