"""The collaborator's failure classes: what can go wrong, whether waiting helps, and the fix.

The table is the single source of the operator's runbook (``docs/operations.md``
is generated from :func:`failure_table`), so the messages and the documentation
cannot drift apart. The class id starts every message, so an operator can look it up.

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

from fedfair.core.errors import FailureClass, PermanentFailureError

EXIT_INCOMPLETE = 3
"""The exit status of a process whose federation finished with a model from fewer rounds than planned:
the aggregator's when rounds aborted, a collaborator's when rounds applied without its update. A script
must not read it as a plain success; the closing line counts the rounds, the log says why."""

EXIT_REFUSED = 4
"""The exit status of a collaborator that refused the federation on its own settings (`auditor-refused`): it
sent nothing and recorded nothing, so it may join later if its operator changes the setting."""


def finished_exit(missed: int, allowed: int) -> int:
    """A finished process's exit status: 0 when it `missed` at most the `allowed` rounds, else EXIT_INCOMPLETE.

    `missed`: the aggregator's aborted rounds, a collaborator's rounds whose model lacks its update;
    `allowed`: the plan's [quorum] aborted_rounds_allowed.
    """
    return 0 if missed <= allowed else EXIT_INCOMPLETE


# ---------------------------------------------------------------- transient: retried within [retry]

AGGREGATOR_UNREACHABLE = FailureClass(
    "aggregator-unreachable",
    True,
    "the aggregator at {address} does not answer ({reason})",
    "start the aggregator, or correct [collaborator] aggregator; this collaborator keeps retrying "
    "for up to [retry] start_wait_seconds before the aggregator first answers, max_wait_seconds after",
)
AGGREGATOR_BUSY = FailureClass(
    "aggregator-busy",
    True,
    "the aggregator at {address} still holds this collaborator's previous connection",
    "none needed: it lets the old connection go within a minute and this collaborator retries",
)
CONNECTION_LOST = FailureClass(
    "connection-lost",
    True,
    "the connection to the aggregator at {address} was lost ({reason})",
    "none needed: this collaborator waits for the aggregator, and a resumed aggregator re-runs the round; "
    "if it stays away, its operator restarts it with `fedfair aggregator start --resume`",
)

# ---------------------------------------------------------------- permanent: the collaborator stops

NEVER_ANSWERED = FailureClass(
    "aggregator-never-answered",
    False,
    "nothing answered at {address} for {seconds:.0f} s since this {role} started (last failure: {reason})",
    "check that the aggregator is started and that [{role}] aggregator names its host and port, then "
    "start this {role} again; raise [retry] start_wait_seconds to wait longer for an aggregator that "
    "starts late",
)

GAVE_UP = FailureClass(
    "aggregator-unreachable-too-long",
    False,
    "the aggregator at {address} stayed unreachable while {what} for {seconds:.0f} s, past the [retry] bound "
    "(last failure: {reason})",
    "check that the aggregator runs and that [collaborator] aggregator is its address, then start this "
    "collaborator again; raise [retry] max_wait_seconds to wait longer",
)
AGGREGATOR_SILENT = FailureClass(
    "aggregator-silent",
    False,
    "no progress for {seconds:.1f} s: the aggregator at {address} kept this collaborator waiting for {what} "
    "past [collaborator] idle_timeout_seconds = {limit:g}",
    "check the aggregator's log (a round stuck, or too few collaborators connected), then start this "
    "collaborator again; raise [collaborator] idle_timeout_seconds if the federation's rounds are this slow",
)
AGGREGATOR_NOT_TRUSTED = FailureClass(
    "aggregator-not-trusted",
    False,
    "the aggregator at {address} presented a certificate that this federation's CA ({ca}) did not issue "
    "or that is no longer valid ({reason})",
    "check that [collaborator] aggregator is this federation's aggregator and that [certificates] ca is the "
    "federation's ca.crt (compare `fedfair pki show` fingerprints with the operator's)",
)
AGGREGATOR_NAME_MISMATCH = FailureClass(
    "aggregator-name-mismatch",
    False,
    "the aggregator at {address} presented a certificate that is not for the name {name!r}",
    "set [collaborator] aggregator_name to the name in the aggregator's certificate (its operator sees it "
    "with `fedfair pki show`), or remove it to check the address's host name",
)
CERTIFICATE_REFUSED = FailureClass(
    "certificate-refused",
    False,
    "the aggregator at {address} refused this collaborator's certificate during the TLS handshake "
    "({reason}): its CA did not issue it, or it expired",
    "ask the aggregator's operator for a certificate from the federation's CA (`fedfair pki request`, then "
    "put the signed certificate and their ca.crt into [certificates] dir)",
)
WRONG_CA_FILE = FailureClass(
    "wrong-ca-file",
    False,
    "[certificates] ca ({ca}) is not this federation's CA: the aggregator at {address} and this collaborator's "
    "certificate were both issued by {issuer!r}, which it cannot verify",
    "put the federation's ca.crt at {ca} (its operator has it; compare `fedfair pki show` fingerprints)",
)
CERTIFICATE_NOT_FEDERATIONS = FailureClass(
    "certificate-not-federations",
    False,
    "this collaborator's certificate {cert} was not issued by this federation's CA ({ca}, which issued the "
    "aggregator's at {address}): the aggregator would refuse it",
    "ask the aggregator's operator for a certificate from the federation's CA (`fedfair pki request`, then "
    "put the signed certificate into [certificates] dir)",
)
NAME_NOT_ALLOWED = FailureClass(
    "name-not-allowed",
    False,
    "the aggregator accepted the certificate of {name!r} but refused it: the name is not on the plan's allow-list, "
    "or the federation's manifest pins another certificate for it (this one was revoked)",
    "ask the operator to add {name!r} to [federation] collaborators in the plan, or use the certificate "
    "of an institution the plan lists (its current one, if the manifest was renewed with `fedfair pki revoke`)",
)
CERTIFICATE_EXPIRED = FailureClass(
    "certificate-expired",
    False,
    "this collaborator's certificate {cert} expired on {expired} UTC, so the aggregator refuses it: the federation "
    "goes on without this institution",
    "have a new certificate signed for the same key (`fedfair pki sign`) or issued (`fedfair pki issue`), pin it "
    "in the manifest if the federation pins certificates, and start this collaborator again",
)
CERTIFICATE_REVOKED = FailureClass(
    "certificate-revoked",
    False,
    "the aggregator refused the certificate of {name!r}: the federation's manifest revoked it",
    "use the institution's new certificate (`fedfair pki request`, signed by the CA holder) and the manifest "
    "that pins it; if this key was not revoked on purpose, ask the operator why (`fedfair pki show`)",
)
IDENTITY_IN_USE = FailureClass(
    "identity-in-use",
    False,
    "the aggregator refused this process: {details}",
    "run one process per institution (a site's collaborator, or the auditor): stop the other one (its host is named above), or leave "
    "it running and do not start this one",
)
TLS_FAILED = FailureClass(
    "tls-failed",
    False,
    "no TLS session with {address} ({reason}): it is not a fedfair aggregator",
    "correct [collaborator] aggregator to the aggregator's host:port",
)
FEDERATION_MISMATCH = FailureClass(
    "federation-mismatch",
    False,
    "the aggregator at {address} runs federation {theirs!r}, not {ours!r}",
    "correct [collaborator] aggregator to the address of federation {ours!r}, or federation to {theirs!r} "
    "if this institution means to join that one",
)
PLAN_MISMATCH = FailureClass(
    "plan-mismatch",
    False,
    "the aggregator's plan does not fit this {role}: {reason}",
    "ask the operator which fedfair version and manifest the federation uses, and use the same",
)


def plan_mismatch(role: str, reason: object) -> PermanentFailureError:
    """The ``plan-mismatch`` failure of a process of `role` ("collaborator", "auditor") refusing the plan for `reason`."""
    return PermanentFailureError(PLAN_MISMATCH, role=role, reason=reason)


PLAN_CHANGED = FailureClass(
    "plan-changed",
    False,
    "the plan changed: the aggregator now serves the plan with settings sha256 {served}, not the one this "
    "{role} holds ({changes})",
    "to accept it, the operator pins the new plan (`fedfair plan pin`) and this institution reviews it with "
    "`fedfair plan diff OLD NEW`, compares the new manifest's digest out of band, points [{role}] manifest "
    "at it and starts this {role} again (without a pinned plan, starting it again is enough); until then "
    "it waits up to [retry] max_wait_seconds in case the aggregator goes back to its plan",
    waits=True,
)


def plan_changed(role: str, served: str, changes: str) -> PermanentFailureError:
    """The ``plan-changed`` failure of a process of `role` ("collaborator", "auditor") now served another plan.

    `served` is the served plan's settings digest; `changes` says how it differs from the plan the process joined
    under.
    """
    return PermanentFailureError(PLAN_CHANGED, role=role, served=served, changes=changes)


WIRE_VERSION_MISMATCH = FailureClass(
    "wire-version-mismatch",
    False,
    "the aggregator at {address} speaks fedfair wire {theirs} and this {role} wire {ours}: another fedfair release, "
    "whose messages (the stages of a round) do not mean the same; it joined no round and recorded nothing",
    "run the same fedfair version at every party: install the federation's release here or on the aggregator "
    "(`fedfair --version` prints a party's), then start this {role} again",
)


def wire_version_mismatch(role: str, address: str, theirs: str, ours: str) -> PermanentFailureError:
    """The ``wire-version-mismatch`` failure of a process of `role` whose aggregator at `address` speaks `theirs`."""
    return PermanentFailureError(WIRE_VERSION_MISMATCH, role=role, address=address, theirs=theirs, ours=ours)


AUDITOR_REFUSED = FailureClass(
    "auditor-refused",
    False,
    "the aggregator's plan names {auditor!r} as the auditor of its input bound (the second verifier, which "
    "holds a share of every input), and this institution refuses it: [collaborator] refuse_auditors in {config} "
    "lists it; nothing was sent or recorded, and the process exits with status 4",
    "none if the refusal stands: this institution stays out of this federation; to take part, remove {auditor!r} "
    "from refuse_auditors, or ask the institutions for a plan with another auditor or none",
)
DATA_MISMATCH = FailureClass(
    "data-mismatch",
    False,
    "this institution's data does not fit the aggregator's plan: {reason}",
    "align [data] with the plan (the label, the feature columns and their encoding) or ask the operator "
    "to change the plan's [schema] (`fedfair data check` names the edit; [model] features for a plan without one)",
)
AGGREGATOR_ERROR = FailureClass(
    "aggregator-error",
    False,
    "the aggregator answered {code} while {what}",
    "tell the aggregator's operator: its log names the cause; a version mismatch is the usual one",
)
LOCAL_CERTIFICATES = FailureClass(
    "local-certificates",
    False,
    "this collaborator's own TLS files are unusable: {reason}",
    "correct [certificates] in {config} (steps 2 and 3 of the README.md `fedfair init` wrote say how each "
    "party obtains its files)",
)
LOCAL_DATA = FailureClass(
    "local-data",
    False,
    "this institution's data cannot be loaded: {reason}",
    "correct [data] in {config}",
)
LOCAL_MANIFEST = FailureClass(
    "local-manifest",
    False,
    "this collaborator does not agree with its federation manifest: {reason}",
    "use the manifest of the federation this institution joins, and its own certificate",
)
LOCAL_PRIVACY = FailureClass(
    "local-privacy",
    False,
    "this collaborator's differential privacy cannot be set up: {reason}",
    "correct [privacy] in {config}; restore an unreadable state file from a backup (deleting it would "
    "forget the privacy already spent)",
)
LOCAL_BINDINGS = FailureClass(
    "local-bindings",
    False,
    "this collaborator's record of the inputs it contributed cannot be read: {reason}",
    "restore NAME.FEDERATION.bindings.json beside {config} from a backup (deleting it would let the aggregator "
    "sum past inputs with other survivors; only a new federation id starts afresh)",
)
LOCAL_LEDGER = FailureClass(
    "local-ledger",
    False,
    "this site's privacy ledger does not go with its table or with what its folder charged: {reason}",
    "the one the reason names; `fedfair collaborator ledger --config {config}` makes the same check and shows the "
    "ledger (deleting a ledger, or its folder's note of it, would forget the privacy its people spent)",
)
LOCAL_STATE_LOST = FailureClass(
    "local-state-lost",
    False,
    "this collaborator has no record of its inputs ({path}) but {evidence}: the record was deleted or lost, "
    "so the inputs it sent and the privacy it spent would be forgotten",
    "restore NAME.FEDERATION.bindings.json, the .kept.npz files and the privacy state beside it from a "
    "backup; or, if this institution never took part before, or accepts that its record and privacy budget "
    "start again, run `fedfair collaborator start` with --reset-state",
)
TABLE_CHANGED = FailureClass(
    "table-changed",
    False,
    "{data} changed since this site joined federation {federation} (its fingerprint was {bound}, it is {now} "
    "now): the inputs this site already sent were of other records",
    "restore the table it joined with (moved or exported again with the same rows is the same table), or take "
    "part with this table in a new federation (`fedfair plan renew`)",
)
FEDERATION_PAST = FailureClass(
    "federation-past",
    False,
    "this institution already contributed to round {latest} of federation {federation} ({path}), and the "
    "aggregator now serves round {served}: that federation finished, or the aggregator went back",
    "nothing to do for a finished federation; to train again, the operator runs `fedfair plan renew` for a new "
    'federation id from the same sites and certificates (docs/operations.md, "Running a finished federation '
    'again")',
)
BUNDLE_REFUSED = FailureClass(
    "bundle-refused",
    False,
    "the federation's model bundle that the aggregator sent at the end is not this federation's output model "
    "({reason}); nothing was kept at {path}",
    "ask the aggregator's operator why its model_bundle.pt is not the model the reason names (the federation, "
    "plan and output model this collaborator joined, trained on and evaluated), and use no bundle of this "
    "federation that this collaborator did not keep itself",
)
AGGREGATE_REFUSED = FailureClass(
    "aggregate-refused",
    False,
    "round {round}: the aggregator's sum of the round, or the model it sent, could not be verified as the sum of the "
    "survivors' inputs or the plan's model made of the sums this collaborator verified ({reason}: {detail}); this "
    "collaborator applies no model made from it and keeps no bundle of this federation",
    "tell the institutions: the aggregator (or a site colluding with it) tried to apply another model than the "
    "federation trained; the outcome record ({path}) names the round and the reason; do not use this "
    'federation\'s model (docs/security.md, "Verified aggregation")',
)
MODEL_UNCHECKED = FailureClass(
    "model-unchecked",
    False,
    "from round {round} on, this collaborator could not check the models the aggregator sent against the sums it "
    "verified ({why}); it sat those rounds out ({rounds} in all), trained on and evaluated none of those models, "
    "and keeps no bundle of this federation",
    "read the aggregator's rounds.jsonl at round {round} and the round before it (the cause above names which): "
    "a round that ran without this site (it restarted mid-round, or lost the aggregator) that it could not catch up "
    'on (more than 8 rounds ago: "When a collaborator restarts") explains it, and the '
    "federation's model then holds fewer of its rounds; "
    "a round skipped or a model changed with no such cause is the aggregator's doing: tell the institutions, and "
    "use no model of this federation that this collaborator did not check (the outcome record {path} lists the "
    'rounds sat out; docs/security.md, "Verified aggregation")',
)

FAILURES: tuple[FailureClass, ...] = (
    AGGREGATOR_UNREACHABLE,
    AGGREGATOR_BUSY,
    CONNECTION_LOST,
    NEVER_ANSWERED,
    GAVE_UP,
    AGGREGATOR_SILENT,
    AGGREGATOR_NOT_TRUSTED,
    AGGREGATOR_NAME_MISMATCH,
    CERTIFICATE_REFUSED,
    WRONG_CA_FILE,
    CERTIFICATE_NOT_FEDERATIONS,
    NAME_NOT_ALLOWED,
    CERTIFICATE_REVOKED,
    CERTIFICATE_EXPIRED,
    IDENTITY_IN_USE,
    TLS_FAILED,
    FEDERATION_MISMATCH,
    PLAN_MISMATCH,
    PLAN_CHANGED,
    WIRE_VERSION_MISMATCH,
    AUDITOR_REFUSED,
    DATA_MISMATCH,
    AGGREGATOR_ERROR,
    LOCAL_CERTIFICATES,
    LOCAL_DATA,
    LOCAL_MANIFEST,
    LOCAL_PRIVACY,
    LOCAL_BINDINGS,
    LOCAL_LEDGER,
    LOCAL_STATE_LOST,
    TABLE_CHANGED,
    FEDERATION_PAST,
    BUNDLE_REFUSED,
    AGGREGATE_REFUSED,
    MODEL_UNCHECKED,
)
"""Every class a collaborator can report, in the order the runbook lists them."""


def failure_table() -> list[dict[str, str]]:
    """The table of :data:`FAILURES` for the runbook: id, kind, meaning and fix, as templates."""
    return [
        {
            "id": failure.id,
            "kind": "transient (retried)"
            if failure.transient
            else "permanent (waits out [retry], then stops)"
            if failure.waits
            else "permanent (stops)",
            "meaning": failure.meaning,
            "fix": failure.fix,
        }
        for failure in FAILURES
    ]


def runbook_table() -> str:
    """The failure table as the Markdown that ``docs/operations.md`` carries between its markers.

    ``python -m fedfair.runtime.failures`` prints it; a test fails when the document's copy differs.
    """
    rows = ["| id | kind | what happened | fix |", "|---|---|---|---|"]
    for row in failure_table():
        cells = (f"`{row['id']}`", row["kind"], row["meaning"], row["fix"])
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(runbook_table(), end="")
