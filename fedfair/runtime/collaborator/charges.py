"""What each noised input costs this institution: charged to its ledger before the input leaves.

The ledger belongs to the institution's data, not to a federation or a path (:mod:`fedfair.privacy.ledger`):
:func:`open_ledger` opens the one of this site's [data] (its table's rows, :mod:`.table_fingerprint`) from the
institution's ledger folder (:mod:`fedfair.privacy.ledger_home`), whichever federation it joins and wherever its
folder is, checks it against what this folder last charged, and takes over what older ledgers and
per-federation records kept. Each federation's one-input record
(:class:`~fedfair.runtime.collaborator.input_record.InputRecord`) charges through it and counts its
charges, so a ledger cannot restart while the record of what was answered survives. The plan's
``[privacy]`` (:mod:`fedfair.runtime.plan.privacy`) says what is noised; the budget is the plan's, or
this institution's own (``budget_epsilon``, else ``target_epsilon``) where lower, over every federation, table of the same people and mechanism.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedfair.core.errors import ConfigError, PermanentFailureError
from fedfair.core.files import read_json
from fedfair.privacy.distributed import Release, gaussian_release
from fedfair.privacy.ledger import RESET, Charge, Ledger, data_digest, ledger_path
from fedfair.privacy.ledger_home import (
    check_link,
    former_ledgers,
    ledger_folder,
    link_path,
    read_link,
    take_over_former,
    write_link,
)
from fedfair.privacy.ledger_people import TABLE_KEY, keep_rows, know_people, state_path
from fedfair.runtime.collaborator.config import CollaboratorConfig, DataSettings
from fedfair.runtime.collaborator.input_record import BoundData, InputRecord, fold_records
from fedfair.runtime.collaborator.receipt import federation_file
from fedfair.runtime.collaborator.table_fingerprint import table_fingerprint, table_rows, was_same_data
from fedfair.runtime.composition_counts import CompositionColumn
from fedfair.runtime.failures import LOCAL_BINDINGS, LOCAL_LEDGER
from fedfair.runtime.observe.logs import per_round
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.plan.privacy import (
    ROUNDING_BETA,
    answer_release,
    composition_release,
    party_mu,
    statistics_release,
)
from fedfair.secagg import prg
from fedfair.secagg.noise import skellam

if TYPE_CHECKING:
    from fedfair.privacy.accounting import PrivacyAccountant

logger = logging.getLogger("fedfair.collaborator")


class Charges:
    """Charges this institution's noised inputs to its ledger, and noises its evaluation answers."""

    def __init__(self, config: CollaboratorConfig, shared: SharedSettings, record: InputRecord) -> None:
        self.config = config
        self.shared = shared
        self.record = record

    @property
    def budget(self) -> float:
        """The most epsilon this institution's releases may spend in all.

        The plan's [privacy] budget, or its own where that is lower: its [privacy] budget_epsilon, else its
        target_epsilon (:attr:`~fedfair.privacy.config.PrivacyConfig.budget`).
        """
        own = self.config.privacy.budget
        return self.shared.privacy.budget if own is None else min(self.shared.privacy.budget, own)

    def training(self, round_number: int, model: str, dimension: int) -> None:
        """Charge one distributed DP-SGD round on `model` to the ledger, before its noised words are kept and sent.

        Args:
            round_number: the round being charged.
            model: the model the round trains.
            dimension: how many values the update holds.

        Raises:
            PrivacyBudgetError: reason :attr:`BudgetReason.ANSWER_REFUSED` when the round would pass the
                budget (:meth:`InputRecord.charge`); nothing is charged.
        """
        privacy = self.shared.privacy
        noise, _ = self.shared.training_noise(self.shared.collaborator_count, dimension)
        # The add-on of rounding and wraps was counted for the plan's steps; each round carries its part.
        one_step = dataclasses.replace(noise.release, steps=1)
        addon = noise.addon / noise.release.steps
        spent = self.record.charge(Charge("train", round_number, model, one_step, privacy.delta, addon), self.budget)
        logger.info(
            "%s: round %d: update noised inside the secure sum (Skellam, sensitivity %.4g units, q %.4g); "
            "epsilon %.3g of budget %g spent",
            self.config.name,
            round_number,
            noise.release.l2,
            noise.release.sampling_rate,
            spent,
            self.budget,
            extra=per_round(round_number, self.shared.training.rounds),
        )

    def evaluation(
        self,
        encoded: np.ndarray,
        round_number: int,
        model: str,
        columns: tuple[CompositionColumn, ...],
        *,
        counts_alone: bool = False,
    ) -> None:
        """Under the plan's [privacy] report_epsilon (interim_report_epsilon before the final round).

        Charge this fresh answer to the ledger (PrivacyBudgetError past the budget), then add this party's share of the
        Skellam noise to its encoded words, from the OS's CSPRNG, before masking. A no-op for exact reports.
        `counts_alone`: `encoded` holds the composition counts only, sent beside a kept answer on the same model
        (:func:`~fedfair.runtime.plan.privacy.composition_release`).
        """
        privacy = self.shared.privacy
        if not privacy.noised:
            return
        final = round_number == self.shared.training.rounds
        if counts_alone:
            release = composition_release(privacy, columns)
        else:
            release = answer_release(privacy, columns, final=final)
        mu, spent = self._noise(encoded, "evaluate", round_number, model, release)
        logger.info(
            "%s: round %d evaluation: Skellam noise (mu %.4g per coordinate%s) added; epsilon %.3g of budget %g spent",
            self.config.name,
            round_number,
            mu,
            ", the composition counts alone" if counts_alone else "",
            spent,
            self.budget,
            extra=per_round(round_number, self.shared.training.rounds),
        )

    def statistics(self, encoded: np.ndarray, round_number: int, model: str) -> None:
        """Under the plan's [privacy] report_epsilon: charge and noise the table statistics sent before round 1.

        As :meth:`evaluation` does for an answer, with the statistics' own release
        (:func:`~fedfair.runtime.plan.privacy.statistics_release`). A no-op for exact reports.
        """
        privacy, schema = self.shared.privacy, self.shared.schema
        if not privacy.noised or schema is None:
            return
        release = statistics_release(privacy, schema)
        mu, spent = self._noise(encoded, "statistics", round_number, model, release)
        logger.info(
            "%s: table statistics: Skellam noise (mu %.4g per coordinate; one record moves them by %.4g in L2, "
            "encoded units) added; epsilon %.3g of budget %g spent",
            self.config.name,
            mu,
            release.l2,
            spent,
            self.budget,
        )

    def _noise(
        self, encoded: np.ndarray, kind: str, round_number: int, model: str, release: Release
    ) -> tuple[float, float]:
        """Charge `release` to the ledger, then add this party's share of its noise to `encoded` in place.

        Every coordinate but the last, the weight (1 per answer: the count of answers, public anyway), gets
        Skellam noise from the OS's CSPRNG. Returns the share's mu and the epsilon spent so far.
        """
        privacy = self.shared.privacy
        spent = self.record.charge(
            Charge(kind, round_number, model, release, privacy.delta, ROUNDING_BETA), self.budget
        )
        floor = self.shared.survivor_floor(self.shared.collaborator_count)
        mu = party_mu(release, floor, self.shared.secure_aggregation.max_colluding)
        noise = skellam(mu, encoded.size - 1, os.urandom(prg.KEY_BYTES))
        encoded[:-1] += noise.view(encoded.dtype)  # wraps modulo 2^k, as the masks do
        return mu, spent


def data_identity(data: DataSettings) -> dict[str, object]:
    """What names this institution's records, for its ledger: its table's rows, or the named partition.

    A table by its rows' fingerprint (:func:`~.table_fingerprint.table_fingerprint`), not its path: moved, copied
    or re-exported, it is the same data with the same ledger. Which columns are read, how they are recoded and how
    many rows are held out do not count: they are the same people's records.

    Raises:
        ConfigError: the table cannot be read, naming the file.
    """
    if data.csv is not None:
        return {TABLE_KEY: table_fingerprint(data.csv)}
    return {
        "dataset": data.dataset,
        "partition": data.partition,
        "index": data.index,
        "parts": data.parts,
        "alpha": data.alpha,
    }


def open_record(config: CollaboratorConfig, federation_id: str, ledger: Ledger, *, reset: bool = False) -> InputRecord:
    """This site's record in federation `federation_id` (NAME.FEDERATION.bindings.json), charging `ledger`.

    The one way a collaborator opens it: checked against the data its [data] opens now, in every privacy mode, so
    that a table changed since this site joined (rows removed or added, a new export) is refused before it
    contributes again. `reset` is the operator's ``--reset-state``.

    Raises:
        PermanentFailureError: ``table-changed``, naming the table and both fingerprints; ``local-bindings``: the
            record is unreadable or does not go with the ledger; ``local-state-lost``.
    """
    data = config.data
    name = (
        f"the table at {data.csv}"
        if data.csv is not None
        else f"the dataset {data.dataset}'s part {data.index} of {data.parts} ({data.partition})"
    )
    try:
        return InputRecord(
            federation_file(config, federation_id, "bindings.json"),
            federation_id,
            ledger=ledger,
            reset=reset,
            data=BoundData(data_identity(data), name),
        )
    except PermanentFailureError:
        raise  # table-changed: named as it is, not as an unreadable record
    except ConfigError as error:
        raise PermanentFailureError(LOCAL_BINDINGS, reason=error, config=config.source) from None


def open_ledger(config: CollaboratorConfig, *, starting_over: bool = False) -> Ledger:
    """Check this institution's table against its ledgers; the one way to open a site's ledger.

    Returns the ledger of its [data], which counts every other ledger of the same people, checked against what this
    folder charged.

    The ledger is the table's own (its rows' fingerprint) in the institution's ledger folder; it counts the spend
    of every ledger there whose table shares rows with it (:mod:`fedfair.privacy.ledger_people`), whichever site
    name charged it. Ledgers of before beside the config (keyed by the table's path) and older per-federation
    records are taken over first. `starting_over` (the operator's reset, which the caller then records in the
    ledger) skips the check against this folder's link (:func:`~fedfair.privacy.ledger_home.check_link`).

    Raises:
        ConfigError: the table cannot be read.
        PermanentFailureError: ``local-ledger``, one refusal wherever the ledger is opened (before a collaborator
            dials, at its join, `fedfair collaborator ledger`): the ledger, a ledger of the same people or a
            record is damaged or edited, a copy of a ledger still at its home, or not the one this folder charged;
            or the table shares no row with the one this folder charged (naming the file and the fix).
    """
    identity = data_identity(config.data)
    try:
        return _checked_ledger(config, identity, starting_over)
    except ConfigError as error:
        raise PermanentFailureError(LOCAL_LEDGER, reason=error, config=config.source) from None


def _checked_ledger(config: CollaboratorConfig, identity: dict[str, object], starting_over: bool) -> Ledger:
    """:func:`open_ledger`'s work once the table is read (a ConfigError: the ledger does not go with it)."""
    folder = config.source.parent
    ledger = Ledger(ledger_path(ledger_folder(), config.name, identity), config.name, identity)
    if config.data.csv is not None:
        know_people(ledger, table_rows(config.data.csv), dp_sgd_steps)
    else:
        # A named dataset's partition has no rows to match other tables' people by, but its own DP-SGD steps are
        # its people's all the same: the ledger is one figure for every mechanism whatever the data's kind.
        ledger.others = functools.partial(dp_sgd_steps, state_path(ledger.path))
    for former in former_ledgers(folder, config.name):
        if former.resolve() == ledger.path.resolve():
            continue  # the ledger folder is this config's folder
        taken = take_over_former(ledger, former, functools.partial(was_same_data, identity=identity))
        if taken is not None:
            logger.warning(
                "%s: the privacy ledger %s was kept by the table's path; its %d releases now continue in %s, "
                "kept by the table's rows, so that moving or copying this folder keeps them",
                config.name,
                former,
                taken,
                ledger.path,
            )
    link = link_path(folder, config.name)
    known = read_link(link, config.name)
    if known is not None and not starting_over:
        check_link(known, ledger, link)
    ledger.on_write = functools.partial(write_link, link)
    for federation in fold_records(ledger, folder, config.name):
        logger.warning(
            "%s: the privacy releases of federation %s were kept in its record only; folded into %s, which "
            "now counts them with every other federation's",
            config.name,
            federation,
            ledger.path,
        )
    # This folder now knows the ledger as it found it (another copy may have charged); a folder whose table changed
    # keeps its link to the ledger it charged until the new table's charges.
    same_table = known is not None and known.data == data_digest(identity)
    if not starting_over and (known is None or (same_table and known.count != ledger.count_all)):
        write_link(link, ledger)
    return ledger


def dp_sgd_steps(path: Path) -> list[Release]:
    """The DP-SGD steps the accountant at `path` holds, as releases the ledger composes; none when there is none.

    Raises:
        ConfigError: the accountant is damaged or edited, or holds a step without noise (no finite epsilon).
    """
    if not path.is_file():
        return []
    from fedfair.privacy.accounting import PrivacyAccountant  # Opacus: only where DP-SGD was used

    return [gaussian_release(*run) for run in PrivacyAccountant.read(path).history]


def describe_ledger(ledger: Ledger, delta: float | None = None) -> str:
    """`ledger` for a person: the total since the last reset, then what each federation's releases cost.

    Epsilon is at `delta`, by default the largest delta its releases were charged at.
    """
    releases = ledger.releases()
    resets = [entry for entry in ledger.entries() if entry["kind"] == RESET]
    lines = [f"{ledger.path}: privacy ledger of {ledger.site} for the data {ledger.identity}"]
    lines.append(f"  lineage {ledger.lineage[:12]}..., {ledger.count_all} entries (checked by this site's folder)")
    lines += [f"  continues {former['file']} (taken over at {former['at']})" for former in ledger.formerly]
    if resets:
        last = resets[-1]
        lines.append(f"  reset {len(resets)} time(s) by its operator, last at {last['at']}: {last['reason']}")
    peers = ledger.peers()
    lines += [
        f"  {peer.rows} of its rows are in {peer.file}: what that ledger charged counts here (the same people)"
        if peer.matched
        else f"  {peer.file} has no rows file, so it is counted as holding all of its people: open that table again "
        "(`fedfair collaborator ledger`) or restore its rows file from a backup to count only the shared rows, or "
        "`reset-ledger --reason` if they are other people"
        for peer in peers
    ]
    shared = [entry for group in ledger.shared_releases() for entry in group]
    dp_sgd = bool(ledger.own_others()) or any(peer.others for peer in peers)
    if not releases and not shared and not dp_sgd:
        return "\n".join([*lines, "  no noised input charged (epsilon 0)"])
    charged = releases or shared
    default = max((float(entry["delta"]) for entry in charged), default=1e-5)  # type: ignore[arg-type]
    at = delta if delta is not None else default
    also = " and the DP-SGD steps on them" if dp_sgd else ""
    lines.append(
        f"  epsilon {ledger.spent(at):.4g} spent at delta {at:g} over every federation and every ledger of these "
        f"people{also} (its most charged row), composed by RDP"
    )
    for federation in sorted({str(entry["federation"]) for entry in releases}):
        own = [entry for entry in releases if entry["federation"] == federation]
        lines.append(f"  federation {federation}: epsilon {ledger.spent(at, federation):.4g} alone")
        for kind, n in sorted(Counter(str(entry["kind"]) for entry in own).items()):
            rounds = sorted(int(entry["round"]) for entry in own if entry["kind"] == kind)  # type: ignore[call-overload]
            rates = sorted({float(entry["sampling_rate"]) for entry in own if entry["kind"] == kind})  # type: ignore[arg-type]
            sampled = ", Poisson sampling q = " + "/".join(f"{rate:g}" for rate in rates) if rates != [1.0] else ""
            lines.append(
                f"    {kind:<10} {n:>5} releases, rounds {rounds[0]}-{rounds[-1]} (Skellam inside the secure sum"
                f"{sampled})"
            )
    return "\n".join(lines)


def describe_accountant(config: CollaboratorConfig, delta: float | None = None) -> str | None:
    """This institution's own DP-SGD spend on its [data]'s people for a person (local DP), or None if none.

    Files of before (beside the config) are taken over and folded in first, as a collaborator would. Epsilon is
    at `delta`, by default its [privacy] delta.
    """
    beside = any(config.source.parent.glob(f"{config.name}.*privacy.json"))
    if not beside and not any(ledger_folder().glob("*.privacy.json")):
        return None  # no DP-SGD anywhere at this institution: Opacus is not loaded
    accountant, _ = open_site_accountant(config, "")
    shared = accountant.shared() if accountant.shared is not None else [[]]
    elsewhere = max(sum(steps for _, _, steps in group) for group in shared)
    if not accountant.history and not elsewhere:
        return None
    at = config.privacy.delta if delta is None else delta
    also = f" and {elsewhere} steps on other tables of the same people" if elsewhere else ""
    lines = [
        f"{accountant.path}: DP-SGD on this data (local), epsilon {accountant.epsilon(at):.4g} at delta {at:g} over "
        f"{accountant.steps} steps{also}, composed by PRV"
    ]
    lines += [
        f"  federation {federation}: {rounds} rounds" for federation, rounds in accountant.rounds_by_federation.items()
    ]
    return "\n".join(lines)


def open_site_accountant(config: CollaboratorConfig, federation: str) -> tuple[PrivacyAccountant, list[str]]:
    """This institution's DP-SGD accountant of its [data]'s people, charging for `federation`.

    Kept beside the data's ledger in the institution's ledger folder (``NAME.DATA.privacy.json``), so that any
    folder of the same rows continues it, and counting the other accountants there of the same people
    (:func:`~fedfair.privacy.accounting.shared_histories`). An accountant beside the config, keyed by the rows
    or by the table's path, is taken over first (set aside as ``FILE.taken-over``); per-federation files of before
    are folded in (:func:`~fedfair.privacy.accounting.open_accountant`). Returns the accountant and the federations
    folded in now.
    """
    # Opacus (and scipy) come in only for an institution that uses DP-SGD.
    from fedfair.privacy.accounting import (
        STATE_VERSION,
        PrivacyAccountant,
        open_accountant,
        privacy_state_path,
        shared_histories,
    )

    folder, identity, kept_in = config.source.parent, data_identity(config.data), ledger_folder()
    target = privacy_state_path(kept_in, config.name, identity)
    for path in [] if target.exists() else sorted(folder.glob(f"{config.name}.*.privacy.json")):
        try:
            document = read_json(path, "")
        except ConfigError:
            continue  # open_accountant names what is wrong with it (a 100,000-deep file too, never a RecursionError)
        former = (
            document.get("data") if isinstance(document, dict) and document.get("version") == STATE_VERSION else None
        )
        if isinstance(former, dict) and (former == identity or ("csv" in former and was_same_data(former, identity))):
            kept = PrivacyAccountant(path, data=former)  # its digest checked
            kept.data, kept.path = identity, target
            kept_in.mkdir(parents=True, exist_ok=True)
            kept._save(target)  # the one place a history changes its place or key
            path.rename(path.with_name(f"{path.name}.taken-over"))
            logger.warning(
                "%s: DP-SGD history %s now continues in %s, beside the ledger of this data's people",
                config.name,
                path,
                target,
            )
            break
    accountant, folded = open_accountant(folder, config.name, identity, federation, kept_in=kept_in)
    if config.data.csv is not None:
        ledger = ledger_path(kept_in, config.name, identity)
        digests, key = keep_rows(ledger, table_rows(config.data.csv))
        accountant.shared = functools.partial(shared_histories, ledger, digests, key)
    return accountant, folded
