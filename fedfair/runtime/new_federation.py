"""A new federation folder (`fedfair init`): the plan, one config per site and next steps that agree.

It writes ``DIR/aggregator/plan.toml``, ``DIR/<site>/collaborator.toml`` for each site (both rendered
by :mod:`fedfair.runtime.plan.templates`, the source of the committed templates too), with ``--auditor NAME``
``DIR/NAME/auditor.toml`` and the plan's two-verifier input bound naming it, and ``DIR/README.md``:
the commands that follow, in order, with this federation's names, folders and collusion bound. Each
party keeps its own folder (``ca/``, held offline by the CA holder; ``aggregator/``; one per site,
each with its own ``certs/``) and the agreed ``manifest.toml`` one level above it.

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from fedfair.core.errors import ConfigError
from fedfair.pki.names import validate_federation_id, validate_name
from fedfair.runtime.plan.composition_note import Headline
from fedfair.runtime.plan.config_template import render_auditor, render_collaborator
from fedfair.runtime.plan.template_base import AGGREGATOR_NAME, MANIFEST, Federation
from fedfair.runtime.plan.templates import render_plan
from fedfair.core.tables import parse_toml

if TYPE_CHECKING:  # the plan module reads schemas (pandas): imported where a command runs
    from fedfair.runtime.plan.aggregator_plan import AggregatorPlan

CA_FOLDER = "ca"
"""The CA holder's folder: ca.key lives there, offline, never in a federation process's certs."""
ROSTER = "roster.toml"
"""The manifest before a plan is pinned in it (`fedfair pki manifest`)."""
README = "README.md"
CERTS = "certs"
DATA_FOLDER = "data"
MIN_SITES = 2
"""Secure aggregation sums at least two inputs: a federation of one is that one's own model."""
RESERVED = frozenset({AGGREGATOR_NAME, CA_FOLDER, ROSTER, MANIFEST, README.lower()})
"""Names a site cannot have: the folder's other entries (a site's folder is its name)."""


def parse_sites(text: str) -> tuple[str, ...]:
    """The institutions named by ``--sites`` (comma-separated).

    Raises:
        ConfigError: one line naming the fix, unless each is a valid participant name, there are at least
            two, none twice and none a name the folder uses.
    """
    sites = tuple(site.strip() for site in text.split(",") if site.strip())
    for site in sites:
        try:
            validate_name(site)
        except ConfigError as error:
            raise ConfigError(f"--sites: {error}") from None
        if site in RESERVED:
            raise ConfigError(f"--sites: {site!r} is taken by the federation folder itself; name the site otherwise")
        if sites.count(site) > 1:
            raise ConfigError(f"--sites lists {site!r} twice; name each institution once")
    if len(sites) < MIN_SITES:
        raise ConfigError(
            f"--sites names {len(sites)} institution(s); a federation needs at least {MIN_SITES}, "
            "e.g. --sites hospital-a,hospital-b"
        )
    return sites


def default_max_colluding(sites: int) -> int:
    """One colluder by default, where the roster allows it: a round then needs c + 2 <= sites parties."""
    return 1 if sites >= 3 else 0


def drafted_schema(
    sample: Path, label: str, features: list[str] | None = None, *, learn_categories: bool = False
) -> tuple[str, int]:
    """The ``[schema]`` section drafted from ``sample``, with a note of what to check before pinning it.

    Also the sample's row count. ID-like columns are left out unless `features` names them.
    """
    # pandas (and the schema module) only when a sample is given: `fedfair init --help` stays light.
    from fedfair.datasets.schema import draft_schema, drafted_features, left_out_note, spellings_note
    from fedfair.datasets.tabular import read_table

    table = read_table(sample)
    chosen, left_out = drafted_features(table, label, features)
    schema = draft_schema(table, label, chosen, learn_categories=learn_categories)
    return (
        f"# Drafted by `fedfair init` from {sample.name} ({len(table):,} rows). Other sites may hold categories\n"
        '# this table lacks: add them to each list (or write categories = "learn") before pinning the plan.\n'
        + left_out_note(left_out)
        + spellings_note(table, schema)
        + schema.to_toml(commented=True)
    ), len(table)


EXAMPLE_HELD_OUT_ROWS = 2000
"""The held-out rows in all the plan's comments size the evaluation for when init has no sample."""


def priced_composition(federation: Federation, plan: AggregatorPlan, sample_rows: int | None) -> Federation:
    """`federation` with its plan's commented composition line filled in: columns of `plan`'s [schema], their cost.

    Without a [schema] a placeholder column, priced as one categorical column of two categories. The rows are
    every site's held-out share of a table like the sample (or :data:`EXAMPLE_HELD_OUT_ROWS`); the noise is
    what the plan's survivors carry (:func:`fedfair.privacy.distributed.noise_excess`).
    """
    from fedfair.privacy.distributed import noise_excess
    from fedfair.runtime.collaborator.config import DEFAULT_TEST_FRACTION
    from fedfair.runtime.composition_counts import CompositionColumn, composition_columns, suggested_composition
    from fedfair.runtime.plan.composition_price import plan_half_widths

    sites = len(plan.collaborators)
    names: tuple[str, ...] | None = None
    columns: tuple[CompositionColumn, ...] = (CompositionColumn("COLUMN", ("a", "b")),)
    if plan.schema is not None:
        names = suggested_composition(plan.schema)
        columns = composition_columns(plan.schema, names)
    rows = EXAMPLE_HELD_OUT_ROWS if sample_rows is None else sites * max(round(sample_rows * DEFAULT_TEST_FRACTION), 1)
    excess = noise_excess(sites, plan.survivor_floor(sites), plan.secure_aggregation.max_colluding)
    widths = plan_half_widths(plan, rows, columns, excess)
    # Exact answers (no report_epsilon): the counts cost no interval, and the comment says so without figures.
    headline = None if widths is None else Headline(rows, *widths)
    return dataclasses.replace(federation, composition_example=names, headline=headline)


def draft_federation_files(
    folder: Path,
    sites: tuple[str, ...],
    *,
    federation_id: str,
    max_colluding: int,
    aggregator: str,
    sample: Path | None = None,
    label: str | None = None,
    features: list[str] | None = None,
    learn_categories: bool = False,
    auditor: str | None = None,
) -> dict[str, str]:
    """Every file of the federation folder (relative path: text), once the plan is known to load; writes nothing.

    ``sample`` and ``label`` come together (a drafted [schema], shaped by ``features`` and
    ``learn_categories`` as ``fedfair data schema`` does) or not at all. ``auditor`` names the auditor institution
    of the two-verifier input bound: the plan declares the mode, and its folder gets an ``auditor.toml``.
    """
    check_auditor_name(auditor, sites)
    try:
        validate_federation_id(federation_id)
    except ConfigError as error:
        raise ConfigError(f"--federation: {error}") from None
    if (sample is None) != (label is None):
        raise ConfigError("--csv and --label go together: --csv SAMPLE --label COLUMN drafts the plan's [schema]")
    if sample is None and (features is not None or learn_categories):
        raise ConfigError(
            "--features and --learn-categories shape the [schema] drafted from --csv; add --csv and --label"
        )
    if max_colluding + 2 > len(sites):
        raise ConfigError(
            f"--max-colluding {max_colluding} needs rounds of max_colluding + 2 = {max_colluding + 2} sites but "
            f"there are {len(sites)}; lower --max-colluding or add sites"
        )
    schema, sample_rows = (
        (None, None)
        if sample is None or label is None
        else drafted_schema(sample, label, features, learn_categories=learn_categories)
    )
    federation = Federation(
        federation_id=federation_id,
        sites=sites,
        aggregator=aggregator,
        certs=CERTS,
        max_colluding=max_colluding,
        schema=schema,
        table=f"{DATA_FOLDER}/table.csv",  # each site's own table, whatever the sample was called
        auditor=auditor,
    )
    # The plan module reads schemas (pandas): loaded to run the command, not for its --help.
    from fedfair.runtime.plan.aggregator_plan import parse_aggregator_plan

    plan_path = folder / AGGREGATOR_NAME / "plan.toml"
    # Not yet pinned: the manifest the plan will name (and the auditor it lists) comes later, from the README's steps.
    plan = parse_aggregator_plan(parse_toml(render_plan(federation), plan_path), plan_path, check_manifest=False)
    # The composition example's columns and cost come from the loaded plan; they change comments only.
    federation = priced_composition(federation, plan, sample_rows)
    plan_text = render_plan(federation)
    # The roster's smallest round is the plan's quorum: the manifest then admits every round the plan starts.
    min_round_size = plan.quorum.min_collaborators
    files = {f"{AGGREGATOR_NAME}/plan.toml": plan_text}
    files.update({f"{site}/collaborator.toml": render_collaborator(federation, site) for site in sites})
    if auditor is not None:
        files[f"{auditor}/auditor.toml"] = render_auditor(federation)
    files[README] = render_readme(federation, min_round_size)
    return files


def check_auditor_name(auditor: str | None, sites: tuple[str, ...]) -> None:
    """Refuse an ``--auditor`` that is not a valid name, or one the folder or a site already uses.

    Raises:
        ConfigError: one line naming the fix.
    """
    if auditor is None:
        return
    try:
        validate_name(auditor)
    except ConfigError as error:
        raise ConfigError(f"--auditor: {error}") from None
    if auditor in RESERVED:
        raise ConfigError(
            f"--auditor: {auditor!r} is taken by the federation folder itself; name the auditor otherwise"
        )
    if auditor in sites:
        raise ConfigError(
            f"--auditor {auditor!r} is one of --sites; the auditor verifies every site's input with the aggregator "
            "and must not train: name an institution that is not a site"
        )


def check_folder(folder: Path) -> None:
    """Refuse a ``folder`` that exists and is not an empty folder: init never writes over anything."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"{folder} exists and is not an empty folder; choose a new folder for the federation")


def write_federation_folder(folder: Path, files: dict[str, str]) -> None:
    """Write ``files`` (relative path: text) under ``folder``, which must be absent or empty (nothing is overwritten)."""
    check_folder(folder)
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# ---------------------------------------------------------------- the README of next steps


def shell_setup() -> str:
    """The line that makes this installation's ``fedfair`` the one a fresh shell runs (bash, zsh, sh).

    The script's folder put first on PATH: the installation's scripts folder (a virtual environment's
    ``bin``) or, failing that, the folder of the ``fedfair`` on this process's PATH. Without a script
    (a source tree run as ``python -m fedfair.cli``), a shell function that runs this interpreter.
    A fresh shell has neither a checkout's ``.venv/bin`` on PATH nor its activation.
    """
    scripts = Path(sysconfig.get_path("scripts"))
    found = shutil.which("fedfair")
    folder = scripts if (scripts / "fedfair").is_file() else (Path(found).resolve().parent if found else None)
    if folder is not None:
        return f'export PATH={shlex.quote(str(folder))}:"$PATH"'
    return f'fedfair() {{ {shlex.quote(sys.executable)} -m fedfair.cli "$@"; }}'


def render_readme(federation: Federation, min_round_size: int) -> str:
    """The federation folder's README.

    Who does what, in order, as commands run from the folder (``min_round_size``: the roster's, at most the
    plan's quorum).
    """
    sites, auditor = federation.sites, federation.auditor
    auditors = () if auditor is None else (auditor,)
    parties = (AGGREGATOR_NAME, *sites, *auditors)
    requests = [f"fedfair pki request --name {AGGREGATOR_NAME} --role aggregator --out {AGGREGATOR_NAME}/{CERTS}"]
    requests += [f"fedfair pki request --name {site} --role collaborator --out {site}/{CERTS}" for site in sites]
    requests += [f"fedfair pki request --name {name} --role auditor --out {name}/{CERTS}" for name in auditors]
    signatures = [
        f"fedfair pki sign --ca {CA_FOLDER} --csr {party}/{CERTS}/{party}.csr --out {party}/{CERTS}/{party}.crt"
        for party in parties
    ]
    copies = [f"cp {CA_FOLDER}/ca.crt {party}/{CERTS}/" for party in parties]
    folders = " ".join(f"{party}/{CERTS}" for party in parties)
    configs = [
        f"{AGGREGATOR_NAME}/plan.toml",
        *(f"{site}/collaborator.toml" for site in sites),
        *(f"{name}/auditor.toml" for name in auditors),
    ]
    manifest = (
        f"fedfair pki manifest --federation {federation.federation_id} --certs {folders} "
        f"--max-colluding {federation.max_colluding} --min-round-size {min_round_size} --out {ROSTER}",
        f"fedfair plan pin --plan {AGGREGATOR_NAME}/plan.toml --manifest {ROSTER} --out {MANIFEST} "
        + " ".join(f"--config {config}" for config in configs),
    )
    starts = [f"fedfair aggregator start --plan {AGGREGATOR_NAME}/plan.toml"]
    starts += [f"fedfair auditor start --config {name}/auditor.toml" for name in auditors]
    starts += [f"fedfair collaborator start --config {site}/collaborator.toml" for site in sites]
    auditor_folder = "" if auditor is None else f" and `{auditor}/` for the auditor"
    intro = f"""# Federation {federation.federation_id}: what to run next

Written by `fedfair init`. One folder per party: `{CA_FOLDER}/` for the CA holder, `{AGGREGATOR_NAME}/` for the
aggregator's operator, and {", ".join(f"`{site}/`" for site in sites)} for the institutions{auditor_folder}; each keeps
its own folder on its own machine, its keys in its `{CERTS}/`, and the agreed `{MANIFEST}` one level
above it. The commands below run from this folder, as if every folder sat on one machine (a
rehearsal); in a deployment each party runs its own lines and only requests, certificates and the
manifest travel.

Each shell that runs them starts with this line, which puts the `fedfair` that wrote this folder on
its PATH (on another machine, name that machine's installation instead):

    {shell_setup()}
"""
    if auditor is not None:
        intro += (
            "\n"
            + textwrap.fill(
                f"The auditor `{auditor}` is the second verifier of every site's input bound (the plan's "
                '`input_bound = "two_verifiers"`): each training round it checks, with the aggregator, that every '
                "site's update lies within its bound, and signs the total. It neither trains nor aggregates, and it "
                f"must not collude with the aggregator. `{auditor}/auditor.toml` explains each of its keys; its folder "
                "keeps `totals.json` and `noise.secret`, which its operator backs up.",
                width=100,
                break_long_words=False,
                break_on_hyphens=False,
            )
            + "\n"
        )
    steps: list[tuple[str, str, list[str]]] = []
    if federation.schema is not None:
        # Before the plan is pinned: a [schema] edit the check suggests then costs no new pin.
        steps.append(
            (
                "Each institution checks its table",
                f"Put the table at `SITE/{federation.table}` (its `[data] csv`); the check lists every problem "
                "and the `[schema]` edit that would accept the table, with nothing running. Make the edits in "
                f"`{AGGREGATOR_NAME}/plan.toml` now, before the plan is pinned:",
                [
                    f"fedfair data check --plan {AGGREGATOR_NAME}/plan.toml --csv {site}/{federation.table}"
                    for site in sites
                ],
            )
        )
    steps += [
        (
            "The CA, held offline",
            f"The CA holder, best a party other than the aggregator's operator, keeps `{CA_FOLDER}/ca.key` on a "
            f"machine that runs no federation process, never in `{AGGREGATOR_NAME}/{CERTS}`:",
            [f"fedfair pki init --dir {CA_FOLDER}"],
        ),
        (
            "A key and a request at each party",
            "Each key stays where it is made; each `.csr` travels to the CA holder:",
            requests,
        ),
        (
            "The CA holder signs every request",
            "It checks each request's name and role, signs it, and sends back the certificate with `ca.crt`; "
            f"every party compares the CA fingerprint (`fedfair pki show --dir {sites[0]}/{CERTS}`) with the "
            "CA holder's, out of band:",
            [*signatures, *copies],
        ),
        (
            "The manifest: roster and plan",
            f"Review `{AGGREGATOR_NAME}/plan.toml` first (its `max_colluding = {federation.max_colluding}` must be "
            "the roster's). Every institution reviews the manifest, compares the digest `plan pin` prints out of "
            f"band and keeps `{MANIFEST}` here. `--config` names it in each file given "
            f'(`manifest = "../{MANIFEST}"`); in a deployment each institution adds that line to its own '
            "`collaborator.toml`"
            + ("" if auditor is None else " (the auditor to its `auditor.toml`, which starts only with it)")
            + ", its one edit:",
            list(manifest),
        ),
        (
            "Start",
            "The aggregator waits for its quorum"
            + ("" if auditor is None else " and its auditor (a bounded round runs only with it)")
            + "; each institution starts its own collaborator:",
            starts,
        ),
    ]
    sections = [intro]
    sections += [_step(f"{number}. {title}", text, commands) for number, (title, text, commands) in enumerate(steps, 1)]
    sections.append(
        _step(
            "Changing the plan later",
            f"Edit `{AGGREGATOR_NAME}/plan.toml`, pin it to a new manifest (`plan pin` never overwrites one), let "
            f"every institution review what changed, then put the new manifest in place of `{MANIFEST}` everywhere "
            "and start again:",
            [
                f"fedfair plan pin --plan {AGGREGATOR_NAME}/plan.toml --manifest {MANIFEST} --out manifest-2.toml",
                f"fedfair plan diff {MANIFEST} manifest-2.toml",
            ],
        )
    )
    renewed = f"{federation.federation_id}-2"
    sections.append(
        _step(
            "Running it again",
            "A finished federation runs again as a new one, from the same sites and certificates: a new id, "
            f"a fresh output folder and a new manifest (every institution compares its digest and puts it in place "
            f"of `{MANIFEST}`); the bindings start afresh under the new id, and each site's privacy ledger "
            "continues from what its data has spent:",
            [
                f"fedfair plan renew --plan {AGGREGATOR_NAME}/plan.toml --manifest {MANIFEST} --federation {renewed} "
                f"--out manifest-{renewed}.toml " + " ".join(f"--config {site}/collaborator.toml" for site in sites),
                f"mv manifest-{renewed}.toml {MANIFEST}",
            ],
        )
    )
    return "\n".join(sections)


def _step(title: str, text: str, commands: list[str]) -> str:
    """A README section: its text wrapped (never inside a word), then its commands as a code block."""
    prose = textwrap.fill(text, width=100, break_long_words=False, break_on_hyphens=False)
    body = "\n".join(f"    {command}" for command in commands)
    return f"## {title}\n\n{prose}\n\n{body}\n"
