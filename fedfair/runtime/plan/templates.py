"""The one source of the plan and collaborator-config templates: commented TOML rendered from a few parameters.

``aggregator/plan.toml`` and ``collaborator/collaborator.toml`` are :func:`render_plan` (here) and
:func:`fedfair.runtime.plan.config_template.render_collaborator` of
:data:`fedfair.runtime.plan.template_base.DEMO` (a test holds them byte for byte; regenerate with
``python -m fedfair.runtime.plan.templates --write`` from the repository's root), and ``fedfair init``
renders the same text for its own federation (:mod:`fedfair.runtime.new_federation`), so the templates
and the folders ``fedfair init`` writes cannot disagree. The comments are the plan's documentation:
every key, its range and its default; the [evaluation] composition line and what it costs come from
:mod:`fedfair.runtime.plan.composition_note`.

This module only writes text (no TOML parsing, no pandas): ``fedfair init --help`` stays light.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fedfair.runtime.plan.composition_note import composition_line
from fedfair.runtime.plan.config_template import render_collaborator
from fedfair.runtime.plan.template_base import AGGREGATOR_NAME, DEMO, MANIFEST, Federation, maybe, noted, toml_string

COMPOSITION_PLACEHOLDER = ("COLUMN",)
"""The commented composition line's column when init knows no table: a name to replace, not the demo data's."""


def _sizes(federation: Federation) -> str:
    sizes = federation.sizes_example or ("ROWS",) * len(federation.sites)
    return ", ".join(f"{site} = {size}" for site, size in zip(federation.sites, sizes, strict=True))


def _composition(federation: Federation) -> str:
    """The commented ``[evaluation] composition`` line: the federation's example columns, else a placeholder."""
    names = federation.composition_example or COMPOSITION_PLACEHOLDER
    return composition_line(names, federation.headline, placeholder=not federation.composition_example)


_PLAN_HEAD = """\
# fedfair federation plan: the aggregator operator's one file.
#
# Copy this folder, edit the values, then
#     fedfair aggregator start --plan aggregator/plan.toml
# (flags such as --rounds or --address override the values here; --resume continues
# from the last checkpoint in the output folder).
# Every key below is checked when the plan loads: a misspelt key or section is
# refused with a suggestion, a value out of range names its section and the fix.
# Relative paths are relative to this file's folder. Omitted keys take the
# defaults shown.
"""

_OBJECTIVE = """\
[objective]
# RCVaR: (1 - epsilon) * CVaR_rho + epsilon * mean loss.
epsilon = 0.1       # in [0, 1]: 1 is plain ERM / FedAvg, 0 is CVaR, 0.01 is Pareto-fair
rho = 0.3           # in (0, 1]: the smallest group fraction protected
gamma = 0.05        # > 0: smoothing width of the plus function
smooth = "softrelu" # softrelu | quadratic | zang
bound = 10.0        # > 0: the threshold c is kept in [0, bound]
"""

_MODEL_SIZES = """\
features = 107      # input features (107 for the bundled Adult data)
classes = 2
"""
_MODEL_SIZES_FROM_SCHEMA = """\
# features and classes: the [schema] below decides both (the federation's encoder, built after the
# statistics round: numbers, one-hot categories, the label's classes), so they are not set here.
"""
_FACTORY_SIZES = "# features and classes above still say what each collaborator's data must have.\n"
_FACTORY_SIZES_FROM_SCHEMA = (
    "# the factory is handed features and classes from the encoder when its signature takes them.\n"
)

_TRAINING = """\
[training]
rounds = 50         # >= 1
local_steps = 5     # tau: local SGD steps per round, >= 1
batch_fraction = 0.01  # b_k = round(batch_fraction * n_k): each collaborator's mini-batch and weight,
                       # proportional to its size n_k without anyone revealing n_k
lr = 0.1            # eta: step size for the model
threshold_lr = 0.1  # eta_c: step size for the threshold c
server_momentum = 0.9  # in [0, 1): the aggregator's heavy-ball momentum on the summed update, a
                       # function of the sums alone (nothing more travels); 0 is Algorithm 1's step
seed = 0            # initial model and sampling seed
average_from = 0.5  # iterates after this fraction of the rounds form the averaged output theta-bar
drift_correction = "none"  # "none" or "scaffold": SCAFFOLD control variates for theta and c keep many
                           # local steps from drifting toward each institution's own optimum. The
                           # aggregator's sigma goes down with (theta, c) and each institution's own
                           # comes back inside the same masked sum (2 (d + 1) numbers instead of d + 1):
                           # still only sums. Works with [privacy] at no extra privacy cost. A control
                           # coordinate beyond [secure_aggregation] clip is refused, not clipped.
                           # Stable only with a step well below plain local SGD's (README).
"""

_QUORUM_AND_EVALUATION = """\
[quorum]
# min_collaborators = 2       # fewest connected collaborators a round starts with; default: the
                              # threshold above, or a majority of the collaborators
round_timeout_seconds = 300   # each stage waits at most this long for uploads (and a round at
                              # most this long for the quorum to connect)
# grace_factor = 3.0          # a stage waits at most 3 x its median answer time (at least 2 s) for
                              # a late site: dropped from the round and named (dropouts = "none":
                              # the round aborts, naming it); default: only the timeout bounds it
# aborted_rounds_allowed = 1  # rounds that may abort with exit 0 and a warning (default 0: exit 3)

[evaluation]
every = 5           # federated worst-group evaluation every N rounds (0: after the last only)
# loss_range = [0.0, 3.0]  # noised answers clip each loss at the top (3: the true class predicted at
                           # 5%); the interval widens in proportion to it (6.9, the loss at 0.1%, is
                           # 2.3x as wide); the report says how much of the worst group may lie above it
"""

_SCHEMA_INTRO = """\
# [schema]: each institution's own table instead of encoded data (docs/usage.md). Draft it from a
# table with `fedfair data schema --csv T --label Y`, then edit; the model's input size then comes
# from the federation's encoder, so [model] features and classes are not needed.
"""
_SCHEMA_EXAMPLE = """\
# [schema]
# label = "outcome"
# classes = ["no", "yes"]
# missing = "refuse"        # "refuse": a missing feature cell stops that site; "impute": the global
#                           # mean for numbers, a <missing> level for categories
# min_category_count = 10   # no categorical count below this leaves a site
# [[schema.columns]]
# name = "age"
# type = "numeric"
# range = [0, 120]          # public bound, needed under [privacy] report_epsilon: values are clipped
#                           # into it for the noised statistics before round 1
# [[schema.columns]]
# name = "sector"
# type = "categorical"
# categories = ["private", "public"]   # or "learn": hashed buckets learnt from the secure sum
"""


def render_plan(federation: Federation) -> str:
    """The aggregator's ``plan.toml`` for ``federation``, every key commented (``aggregator/plan.toml`` is DEMO's)."""
    sites = "[" + ", ".join(toml_string(site) for site in federation.sites) + "]"
    colluding = 1 if federation.max_colluding is None else federation.max_colluding
    bounded = federation.auditor is not None
    with_schema = federation.schema is not None
    return "".join(
        (
            _PLAN_HEAD,
            f"""
[federation]
# Ties every message to this federation; collaborators see it in each task.
id = {toml_string(federation.federation_id)}
# The institutions allowed to take part: the names in their certificates (CN/SAN).
# Identity comes from the TLS certificate alone; anyone else is refused generically.
collaborators = {sites}

[aggregator]
# Where this aggregator listens (host:port). 0.0.0.0 listens on every interface.
address = {toml_string(federation.listen)}
# Its own certificate name: <certs>/{AGGREGATOR_NAME}.crt and <certs>/{AGGREGATOR_NAME}.key.
name = {toml_string(AGGREGATOR_NAME)}
# The certificates folder written by `fedfair pki` (holds ca.crt).
certs = {toml_string(federation.certs)}
# Checkpoints, the round log and the final model go here.
output = "output"
# Draw report.html there when the run ends (`fedfair report <output>` draws it at any time).
# report = true
# The federation manifest every institution agreed on (`fedfair plan pin`): the pinned roster and plan.
# With it this aggregator refuses to start under any other plan; without it the roster is the CA's.
# manifest = {toml_string("../" + MANIFEST)}

""",
            _OBJECTIVE,
            """
[model]
name = "logreg"     # logreg | mlp (one hidden layer of 512) | cnn
""",
            _MODEL_SIZES_FROM_SCHEMA if with_schema else _MODEL_SIZES,
            """\
# image_shape = [1, 28, 28]   # cnn only: channels, height, width (product = features)
# Your own architecture instead of a built-in one (then drop `name`): a function returning a torch.nn.Module,
# called with `arguments` under the training seed, so every party starts from the same model.
# The aggregator and every collaborator must have its package installed (pip install ...);
""",
            _FACTORY_SIZES_FROM_SCHEMA if with_schema else _FACTORY_SIZES,
            """\
# factory = "mymodels.tabular:build"
# arguments = { features = 107, hidden = 64 }

""",
            _TRAINING,
            f"""
[influence]
# How far one institution can move the model in a round. Weights are agreed here, pinned by the
# manifest, never reported by a collaborator: the aggregator divides each round's sum by the agreed
# total of the round's contributors and voids a round whose decoded total differs.
weights = "equal"   # "equal": every institution counts the same, whatever its size.
                    # "declared": institution k weighs round(batch_fraction * n_k) with n_k from sizes
                    # below: Algorithm 1's pooled objective (every sample counts the same).
# sizes = {{ {_sizes(federation)} }}
                    # training rows each institution declares (public for most hospitals and banks);
                    # they also fix each batch, which DP needs: [privacy] refuses a plan without them
# update_norm = 1.0 # C: the L2 bound on each institution's round update (delta theta, delta c);
                    # longer honest updates are scaled into it, longer plain uploads refused.
                    # Default 2 * lr * local_steps (1.0 here); docs/design.md weighs tighter ones

[secure_aggregation]
# Bonawitz et al. double masking: the aggregator learns only the sum of updates.
enabled = true
# threshold = 2     # t: survivors needed to finish a round; default floor(p/2) + 1 of the
                    # round's p participants
modulus_bits = 64   # arithmetic mod 2^modulus_bits (16, 32 or 64)
fractional_bits = 20  # fixed-point precision: values are scaled by 2^fractional_bits
clip = 10.0         # each coordinate of an update is clipped to [-clip, clip]
neighbours = "auto" # masking graph: "auto" is complete below ~20 collaborators, else SecAgg+ with
                    # k = 2 ceil(log2 n) + 2 max_colluding; 0: complete; k: a random k-regular graph
max_weight = 1e6    # largest agreed weight (bounds the fixed-point range)
{noted(maybe(federation.max_colluding is not None, f"max_colluding = {colluding}"), "c: collaborators that may collude with the aggregator; the threshold then obeys")}
                    # c + 2 <= t and 2t > m + c (docs/design.md section 5); 0 assumes none
# dropouts = "none" # every collaborator in every round, else the round fails: no two sums over
                    # survivor sets that differ by one site (default "allowed": see docs/design.md)
{maybe(bounded, 'input_bound = "two_verifiers"')}  # every site proves its update within update_norm x its weight to
                    # two verifiers, the aggregator and `auditor`: a manifest institution (role
                    # "auditor") that neither aggregates nor trains, which a site may refuse
                    # (docs/security.md, "Bounded inputs"). Default "none". Under [privacy] mode =
                    # "distributed" each verifier adds training noise to its total; evaluations stay masked
{maybe(bounded, f"auditor = {toml_string(federation.auditor or 'audit-co')}")}

[privacy]
# Distributed differential privacy: the collaborators add noise inside the secure sum, so the aggregator
# decodes only noised totals (docs/security.md). Each institution charges every noised input to its own
# ledger before sending it (`fedfair collaborator ledger`) and refuses one past `budget`.
# With exact answers, two evaluations over survivor sets one site apart would difference to its held-out
# losses. Noise costs precision, and the report states it: each figure with its 95% interval.
report_epsilon = 1.0  # epsilon of the final evaluation's answer, the report's figures. Its worst-group
                      # risk is known to about +/- 0.05 over 2,000 held-out rows in all (rho 0.3), +/- 0.2
                      # over 500: the half-width falls as 1 / (rows x epsilon), and `fedfair data check`
                      # prints it for a site's rows. Raise it for a small federation, at a privacy cost
interim_report_epsilon = 0.2  # epsilon of each earlier evaluation (every N rounds): a trend, about
                              # +/- 0.2 over 2,000 rows; unset, they spend report_epsilon each
budget = 10.0         # the most epsilon one institution spends here, training and answers together
                      # (9 evaluations at 0.2 and the final one at 1.0 spend 1.23 of it)
delta = 1e-5
mode = "off"          # training DP: "distributed" is DP-SGD inside the secure sum (needs epsilon below,
                      # local_steps = 1, declared sizes); "local" leaves it to each institution's config.
                      # Either needs report_epsilon above: a plan that noises training and decodes its
                      # answers and statistics exact is refused when it loads
# epsilon = 3.0       # what all the training rounds spend under mode = "distributed"
# max_grad_norm = 20.0  # theta's per-record clip bound under mode = "distributed"

""",
            _QUORUM_AND_EVALUATION,
            _composition(federation),
            "\n",
            _SCHEMA_INTRO,
            federation.schema if federation.schema is not None else _SCHEMA_EXAMPLE,
        )
    )


# ---------------------------------------------------------------- the committed templates


def committed_templates(root: Path) -> dict[Path, str]:
    """The repository's template files under ``root`` and the text each must hold."""
    return {
        root / "aggregator" / "plan.toml": render_plan(DEMO),
        root / "collaborator" / "collaborator.toml": render_collaborator(DEMO, DEMO.sites[0], "collaborator"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedfair.runtime.plan.templates [--write] [--root DIR]``.

    List the templates that differ from their rendering (exit 1 if any), or with --write rewrite them.
    """
    parser = argparse.ArgumentParser(prog="python -m fedfair.runtime.plan.templates", description=main.__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the templates from this module")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository's root (default: here)")
    args = parser.parse_args(argv)
    stale = [path for path, text in committed_templates(args.root).items() if path.read_text() != text]
    for path in stale:
        if args.write:
            path.write_text(committed_templates(args.root)[path])
        print(f"{'rewrote' if args.write else 'differs from its rendering:'} {path}")
    return 1 if stale and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
