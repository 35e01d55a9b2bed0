"""The config templates: one institution's ``collaborator.toml``, and the auditor's ``auditor.toml``, commented.

Both are rendered from a :class:`Federation`. ``collaborator/collaborator.toml`` is the rendering of the demo's first
site (:func:`fedfair.runtime.plan.templates.committed_templates`). This module only writes text.
"""

from __future__ import annotations

from fedfair.runtime.plan.template_base import AGGREGATOR_NAME, MANIFEST, Federation, maybe, noted, toml_string

CERTIFICATE_COLUMN = 27
"""Where a [certificates] file's trailing comment starts in a collaborator config."""

_CONFIG_HEAD = """\
# fedfair collaborator configuration: one per institution, kept at the institution.
#
# Copy this folder to the institution's machine, edit the values, then
#     fedfair collaborator start --config {folder}/collaborator.toml
# Every key is checked when the file loads; a misspelt key is refused with a
# suggestion. Relative paths are relative to this file's folder.
# The training settings (objective, model, rounds, secure aggregation) come from the
# aggregator's plan; nothing here can change them.
"""

_CONFIG_TAIL = """\
[privacy]
# DP-SGD on this institution's local steps (Opacus; docs/design.md section 5, "Threat model"), this
# institution's own choice. Its accountant persists in NAME.DATA.privacy.json beside
# this file, one per dataset: every federation that trains on the same records spends
# the same budget. Once the budget (its own, or the plan's [privacy] budget where lower)
# is spent the collaborator stops contributing and tells the aggregator so.
enabled = false
noise_multiplier = 1.0
max_grad_norm = 20.0   # per-sample clip of (theta, c) jointly; a small bound starves c (README)
delta = 1e-5
# target_epsilon = 3.0    # aim for this epsilon over the whole training (calibrates the
                          # noise: noise_multiplier is then not used)
# budget_epsilon = 8.0    # stop contributing once this epsilon is spent
# mode = "distributed"    # take the plan's noise inside the secure sum instead of DP-SGD's:
                          # refuse a plan spending more than target_epsilon (and delta)
share_epsilon = false     # report the epsilon spent so far to the aggregator each round

[model]
# Model factories ("package.module:function") this institution allows the plan to name.
# A factory is code that runs here with this process's rights: a plan naming any other
# one is refused before anything is imported. Built-in models need nothing here.
# factories = ["mymodels.tabular:build"]

"""

_RETRY = """\
[retry]
# A lost aggregator (down, restarting) is retried with jittered back-off, one log line per
# retry, until it has been unreachable this long; then the {party} stops. A permanent
# failure (a certificate, a name or a plan that cannot work) stops it at once instead.
max_wait_seconds = 900.0    # survive an aggregator restart of up to 15 minutes
start_wait_seconds = 45.0   # an aggregator never reached (not started yet, or a wrong address):
                            # tried every second, said every 30 s, then a clear error this long
                            # after the command; raise it when sites start well before the aggregator
first_delay_seconds = 0.5   # the first retry's delay; each next one doubles, up to
max_delay_seconds = 15.0    # the largest delay between two retries
"""


def _certificates(federation: Federation, name: str, certificate: str, whose: str) -> str:
    """The [certificates] section of party `name`: its folder, the CA's, `certificate` and `whose` private key."""
    return f"""\
[certificates]
# The folder holding the files below (the README.md `fedfair init` writes says how to obtain them).
dir = {toml_string(federation.certs)}
{noted('ca = "ca.crt"', "the federation's CA certificate", CERTIFICATE_COLUMN)}
{noted(f"cert = {toml_string(name + '.crt')}", certificate, CERTIFICATE_COLUMN)}
{noted(f"key = {toml_string(name + '.key')}", f"{whose} private key (mode 0600, never leaves)", CERTIFICATE_COLUMN)}
"""


def render_collaborator(federation: Federation, site: str, folder: str | None = None) -> str:
    """The ``collaborator.toml`` of ``site`` (one of ``federation.sites``), kept in ``folder`` (default: the site's name).

    ``collaborator/collaborator.toml`` is DEMO's first site's. Without a schema its data is its part of the
    bundled Adult data.
    """
    named = federation.schema is None
    index = federation.sites.index(site)
    return "".join(
        (
            _CONFIG_HEAD.format(folder=folder or site),
            f"""
[collaborator]
# This institution's name. It must equal the name in its certificate: the
# aggregator identifies it by the certificate alone, this value only picks files.
name = {toml_string(site)}
# The aggregator's host:port.
aggregator = {toml_string(federation.aggregator)}
# The name in the aggregator's certificate, checked during the TLS handshake
# (needed when the address is not a name the certificate lists, e.g. an IP).
aggregator_name = {toml_string(AGGREGATOR_NAME)}
# The federation this institution joins (its id in the aggregator's plan); optional,
# but with it set the collaborator refuses an aggregator that runs another federation.
federation = {toml_string(federation.federation_id)}
# The federation manifest the institutions agreed on (roster and plan pinned); with it this
# collaborator refuses any plan but the pinned one (`fedfair plan pin` / `fedfair plan diff`).
# manifest = {toml_string("../" + MANIFEST)}
# Where to train: cpu | cuda | cuda:N | mps | auto (auto: CUDA when present, else cpu)
device = "auto"
# How long to wait on an aggregator that answers but sends nothing (no task, a stalled download)
# before giving up with aggregator-silent (exit status 2); a line every minute says it waits.
idle_timeout_seconds = 3600.0
# Auditor institutions this institution refuses as the second verifier of a plan's input bound
# ([secure_aggregation] auditor: it holds a share of every input); a plan naming one is refused
# with auditor-refused (exit status 4) before anything is sent.
# refuse_auditors = ["audit-co"]

{_certificates(federation, site, "this institution's certificate (from the CA operator)", "this institution's")}
[data]
# Either a named dataset, split by a partitioner, taking part number `index` ...
{maybe(named, 'dataset = "adult"')}
{maybe(named, 'partition = "race"   # a column (race, site, ...), "class", "dirichlet" or "iid"')}
{maybe(named, noted(f"index = {index}", "this institution's part, counting from 0 (also picks its sampling seed)", 21))}
# parts = 3          # number of parts (default: the plan's number of collaborators)
# alpha = 0.5        # Dirichlet concentration (dirichlet)
# ... or the institution's own CSV file:
{maybe(not named, f"csv = {toml_string(federation.table)}")}
# label = "outcome"                 # the label column
# features = ["age", "bmi"]         # feature columns (default: every other column)
# group = "site"                    # optional group column, for reporting only
# test_fraction = 0.25              # share of the rows held out from training for the federated
                                    # evaluation (drawn per group, seeded by the plan)

""",
            _CONFIG_TAIL,
            _RETRY.format(party="collaborator"),
        )
    )


def render_auditor(federation: Federation) -> str:
    """The ``auditor.toml`` of ``federation.auditor`` (set), kept in its folder: every key with what it does."""
    auditor = federation.auditor
    assert auditor is not None, "an auditor's config is rendered for a federation that names one"
    return f"""\
# fedfair auditor configuration: the auditor institution, the second verifier of every site's input
# bound ([secure_aggregation] input_bound = "two_verifiers" in the aggregator's plan). Kept at the
# auditor, on its own machine; started with
#     fedfair auditor start --config {auditor}/auditor.toml
# It neither trains nor aggregates: each training round it checks every site's proof that its
# update lies within update_norm x its weight, together with the aggregator, and signs the bounded
# total. It and the aggregator must not collude: together they hold both shares of every input.
# Every key is checked when the file loads. Relative paths are relative to this file's folder.

[auditor]
# The auditor's name. It must equal the name in its certificate (role "auditor") and the plan's
# [secure_aggregation] auditor; the aggregator admits it by the certificate alone.
name = {toml_string(auditor)}
# The aggregator's host:port. Its certificate must carry the manifest's aggregator name.
aggregator = {toml_string(federation.aggregator)}
# The federation manifest the institutions agreed on: it lists this auditor (role "auditor") and
# pins its certificate, the aggregator's, every site's and the plan. Required; `fedfair plan pin
# --config {auditor}/auditor.toml` writes this line.
# manifest = {toml_string("../" + MANIFEST)}
# Where the auditor keeps its log ({auditor}.log), the sites each set of inputs was first totalled
# over (totals.json: the same inputs are totalled over the same sites or not at all, or two totals
# could be subtracted) and the secret every round's noise key derives from (noise.secret: the same
# inputs carry the same noise, or two draws could be averaged). Back up both with the folder: an
# auditor restarted without them cannot keep those promises.
folder = "."
# How long to wait on an aggregator that answers but sends nothing before giving up with
# aggregator-silent (exit status 2); a line every minute says it waits.
idle_timeout_seconds = 3600.0

{_certificates(federation, auditor, "the auditor's certificate, role auditor (from the CA holder)", "the auditor's")}
""" + _RETRY.format(party="auditor")
