"""A built-in dataset rehearsed by ``fedfair launch``: its split into institutions, and launch's plan for them.

Why: docs/design.md, "The local federation".
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedfair.core.errors import ConfigError

if TYPE_CHECKING:
    from fedfair.runtime.local.workspace import Workspace

DEFAULT_ROUNDS = 300
"""About 30 s on two slow cores (a round is a few milliseconds of training and some dozen
loopback round trips, about 0.06 s), enough for FedSRCVaR to pull the worst group's risk well
below FedAvg's on Adult."""

EVALUATIONS = 10
"""Federated evaluations a launch runs by default, the last after the final round: what `fedfair init`'s
plan runs (50 rounds, every 5), so the risk chart has as many points and the answers spend the same."""

AUDITOR = "audit-co"
"""The auditor institution of a rehearsal under ``--input-bound``: a process of its own beside the sites."""

COMPOSITION = ("race", "sex")
"""The columns Adult's worst-off group is described by (the composition `fedfair init`'s plan suggests)."""


@dataclass(frozen=True)
class LaunchSplit:
    """How `fedfair launch` splits a dataset into institutions: the partition scheme and how many sites it makes."""

    partition: str
    most: int
    reason: str
    """Why `most` is the limit, for the refusal of more."""


SPLITS: dict[str, LaunchSplit] = {
    "adult": LaunchSplit("race", 5, "Adult's race column makes at most 5 groups"),
    # Census-Income has no state of residence (its "previous_state" is "Not in universe" for the 92%
    # who did not move), so its sites are a uniformly random, near-equal split: 2,490 training rows
    # each at 80 sites. A site is a process of about 250 MB (PSS, benchmarks/federation_bench.py),
    # so 80 of them need about 20 GB.
    "census-income": LaunchSplit("iid", 80, "each is a process on this machine, about 250 MB each"),
}
"""The datasets `fedfair launch` runs, and how each is split into institutions."""


def check_sites(dataset: str, collaborators: int) -> LaunchSplit:
    """The split of `dataset` into `collaborators` institutions; a ConfigError naming the fix if it has none."""
    if dataset not in SPLITS:
        raise ConfigError(f"--dataset {dataset}: launch runs {' or '.join(SPLITS)}; pick one of them")
    split = SPLITS[dataset]
    if not 2 <= collaborators <= split.most:
        larger = [name for name, other in SPLITS.items() if other.most > split.most]
        raise ConfigError(
            f"--collaborators {collaborators}: {dataset} runs 2 to {split.most} institutions ({split.reason}); "
            f"pass --collaborators 2 to {split.most}"
            + (f", or --dataset {larger[0]} for more" if collaborators > split.most and larger else "")
        )
    return split


def site_data(dataset: str, collaborators: int) -> dict[str, dict[str, Any]]:
    """Each institution's [data]: part i of `dataset` split as SPLITS says, by site name."""
    from fedfair.runtime.local.workspace import site_names

    split = check_sites(dataset, collaborators)
    return {
        name: {"dataset": dataset, "partition": split.partition, "index": index}
        for index, name in enumerate(site_names(collaborators))
    }


def declared_influence(training_rows: Mapping[str, int]) -> dict[str, Any]:
    """[influence] weighting each site by its declared training rows: Algorithm 1's weights w_k = b_k.

    So the averaged update is the mean over every sample of the federation, and FedSRCVaR minimises the
    RCVaR of the pooled rows. Under init's "equal" weights each site's rows would count as much as any
    other site's, and a small site's worst rows would stand for far more people than they are.
    """
    return {"weights": "declared", "sizes": dict(training_rows)}


def training_rows(table_rows: int, seed: int) -> int:
    """The rows a site of `table_rows` trains on once its collaborator holds out its default test fraction."""
    import numpy as np

    from fedfair.datasets.tabular import split_rows
    from fedfair.runtime.collaborator.config import DEFAULT_TEST_FRACTION

    train, _ = split_rows(np.zeros(table_rows, dtype=str), DEFAULT_TEST_FRACTION, seed)
    return len(train)


def init_settings(names: list[str]) -> dict[str, dict[str, Any]]:
    """What `fedfair init` writes for these sites that a launch takes as it is: [privacy] and the collusion bound.

    Read from the plan init renders, so the rehearsal follows init's defaults wherever they change.
    """
    from fedfair.core.tables import parse_toml
    from fedfair.runtime.new_federation import default_max_colluding
    from fedfair.runtime.plan.template_base import Federation
    from fedfair.runtime.plan.templates import render_plan

    federation = Federation("fedfair-launch", tuple(names), max_colluding=default_max_colluding(len(names)))
    plan = parse_toml(render_plan(federation), "fedfair init's plan")
    return {
        "privacy": dict(plan["privacy"]),
        "secure_aggregation": {"max_colluding": plan["secure_aggregation"]["max_colluding"]},
    }


def evaluation_every(rounds: int, every: int | None) -> int:
    """``--evaluate-every``, else :data:`EVALUATIONS` evaluations spread over `rounds`."""
    return every if every is not None else max(1, rounds // EVALUATIONS)


def adult_tables(folder: Path, names: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, int]]:
    """Each institution's own table of Adult (adult.data's rows of its race group, raw text), their [schema], sizes.

    The tables go to `folder`/<site>.csv; a site's [data] names its file. The schema is the one `fedfair data
    schema` drafts from all of them together (a rehearsal's operator sees every table; a real one drafts from
    a sample and widens the ranges): listed categories, public ranges, gaps imputed. The sizes are each table's
    rows, by site.
    """
    from fedfair.datasets import load_dataset, partition
    from fedfair.datasets.builtin import adult_table
    from fedfair.datasets.registry import dataset_info
    from fedfair.datasets.schema import draft_schema

    raw = adult_table(dataset_info("adult")).drop(columns=["fnlwgt"])
    # The built-in Adult's training rows are adult.data's, in order: its race split picks each site's rows.
    splits = partition(load_dataset("adult"), SPLITS["adult"].partition, len(names))
    folder.mkdir(parents=True, exist_ok=True)
    data, sizes = {}, {}
    for name, split in zip(names, splits, strict=True):
        path = folder / f"{name}.csv"
        raw.iloc[split.train_index].to_csv(path, index=False)
        data[name] = {"csv": str(path)}
        sizes[name] = len(split.train_index)
    schema = draft_schema(raw, "income", [column for column in raw.columns if column != "income"])
    return data, schema.to_mapping(), sizes


def round_timeout(collaborators: int) -> float:
    """How long a stage waits for every institution.

    2 minutes, plus 2 s per site past 5, since on a two-core machine every stage's work (training, masking, key
    agreement) queues behind every site's.
    """
    return 120.0 + 2.0 * max(collaborators - 5, 0)


def builtin_workspace(args: argparse.Namespace, root: Path) -> Workspace:
    """The workspace of a built-in dataset split into ``args.collaborators`` institutions, with launch's plan."""
    # Imported here, as workspace.declared_sizes does: the datasets (and pandas) are needed once a run starts.
    from fedfair.datasets import load_dataset
    from fedfair.runtime.local.workspace import make_workspace, site_names

    names = site_names(args.collaborators)
    secure = not args.no_secure_aggregation
    rounds = DEFAULT_ROUNDS if args.rounds is None else args.rounds
    training = {
        "rounds": rounds,
        "local_steps": args.local_steps,
        "batch_fraction": args.batch_fraction,
        "lr": args.lr,
        "threshold_lr": args.lr,
        "seed": args.seed,
        "average_from": 0.5,
    }
    if args.drift_correction != "none":  # a plan without the key is today's plan, digest included
        training["drift_correction"] = args.drift_correction
    # What `fedfair init` sets: noised evaluations (privacy needs secure sums, so a plain-sum rehearsal runs
    # without it) and its collusion bound.
    defaults = init_settings(names)
    evaluation: dict[str, Any] = {"every": evaluation_every(rounds, args.evaluate_every)}
    plan: dict[str, Any] = {
        "objective": {"epsilon": args.epsilon, "rho": args.rho},
        "training": training,
        "secure_aggregation": {"enabled": secure, **(defaults["secure_aggregation"] if secure else {})},
        # A rehearsal waits for every institution and gives up quickly if one hangs.
        "quorum": {"min_collaborators": len(names), "round_timeout_seconds": round_timeout(len(names))},
        "evaluation": evaluation,
    }
    if secure:
        plan["privacy"] = defaults["privacy"]
    if args.dataset == "adult":
        # Institutions' own tables under a [schema], as `fedfair init --csv` plans them: the encoder comes
        # from the (noised) statistics before round 1, and the report says who is in the worst-off group.
        data, plan["schema"], table_rows = adult_tables(root / "tables", names)
        evaluation["composition"] = list(COMPOSITION)
        sizes = {name: training_rows(rows, args.seed) for name, rows in table_rows.items()}
    else:
        from fedfair.datasets import partition

        data = site_data(args.dataset, len(names))
        dataset = load_dataset(args.dataset)
        plan["model"] = {"features": dataset.num_features}
        parts = partition(dataset, SPLITS[args.dataset].partition, len(names), seed=args.seed)
        sizes = {name: len(part.train_index) for name, part in zip(names, parts, strict=True)}
    # A rehearsal's operator knows every site's size, so the plan can weight as Algorithm 1 does.
    plan["influence"] = declared_influence(sizes)
    auditor = None
    if args.input_bound:  # with secure aggregation (run_launch refuses it without)
        auditor = AUDITOR
        plan["secure_aggregation"]["fractional_bits"] = bounded_bits(plan, names)
    # Careful institutions pin the roster and the plan; a manifest promises secure aggregation. Each site trains
    # on a GPU where it has one, as a deployed collaborator's default config does.
    return make_workspace(root, names, plan=plan, data=data, manifest=secure, device="auto", auditor=auditor)


def bounded_bits(plan: Mapping[str, Any], names: list[str]) -> int:
    """The plan's fractional bits, lowered until the largest site's bound fits the bounded round's field.

    A site's bound is update_norm x its weight in the encoded scale: at the default 20 bits a site of a few hundred
    rows a batch is past what the proof's field holds (its squared bound below 2^43).

    Raises:
        ConfigError: no number of bits holds it (naming the fix).
    """
    from fedfair.runtime.plan.input_bound import largest_bound, largest_fractional_bits
    from fedfair.runtime.plan.learning_settings import read_learning

    learning = read_learning("fedfair launch's plan", plan, len(names))
    weight = max(learning.influence.weight_of(name, learning.batch_fraction) for name in names)
    norm = learning.influence.update_norm
    bits = largest_fractional_bits(norm, weight, learning.secure_aggregation.fractional_bits)
    if bits is not None:
        return bits
    local = learning.training.local
    most = largest_bound()
    # launch's update_norm is 2 lr tau; a site's weight, its rows a batch, is at least 1 however small the batch.
    fixes = f"lower --lr or --local-steps until 2 lr tau x {weight:g} <= {most:,}"
    if norm <= most:
        fixes += f", or --batch-fraction until the largest site's weight is at most {most / norm:.4g}"
    raise ConfigError(
        f"--input-bound: a site's bound does not fit the proof's field even at 0 fractional bits: its update_norm "
        f"2 lr tau = 2 x {local.lr:g} x {local.local_steps} = {norm:g} times its weight {weight:g} (the largest "
        f"site's rows a batch) is {norm * weight:.4g}, above the {most:,} the field holds; {fixes}"
    )


def rehearsal_ledgers(root: Path) -> None:
    """Charge a built-in dataset's rehearsal to ledgers in its own workspace, unless FEDFAIR_LEDGER_DIR names some.

    The sites of a built-in split are no institution's: their names and rows are the same in every launch, so in
    the user's ledger folder each `make demo` would add to the last one's spend until init's budget refused a
    demo. A rehearsal on the user's own tables (``--csv``) charges the user's ledgers, as those tables' sites
    would.
    """
    from fedfair.privacy.ledger_home import LEDGER_DIR_VARIABLE

    os.environ.setdefault(LEDGER_DIR_VARIABLE, str(root / "ledgers"))
