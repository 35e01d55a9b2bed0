"""`fedfair init --auditor NAME`: the two-verifier input bound set up in one pass, with no hand edit (issue 94).

The first walk of the mode took 3 hand edits and 5 failed commands: no auditor.toml anywhere, `plan pin` refusing
the plan because it named no manifest yet, `plan pin --config audit-co/auditor.toml` refused. Here init's README
runs as written through the pin, in a fresh shell that stops at the first failed command, and what it leaves is
what the aggregator, the auditor and each site load at start. (Started as written, the same folder of 3 sites ran
its 50 bounded rounds, every one applied, at the commit that added this test.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedfair import cli
from fedfair.runtime.auditor.config import check_auditor_identity, load_auditor_config
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.new_federation import README
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.plan.input_bound import TWO_VERIFIERS
from tests.runtime.test_new_federation_shell import fresh_shell, readme_lines

SITES = ("site-1", "site-2", "site-3")
AUDITOR = "audit-co"


def test_init_with_an_auditor_is_pinned_and_loads_with_no_hand_edit(tmp_path: Path) -> None:
    folder = tmp_path / "fed"
    assert cli.main(["init", str(folder), "--sites", ",".join(SITES), "--auditor", AUDITOR]) == 0
    lines = readme_lines(folder / README)
    starts = [line for line in lines if re.match(r"fedfair \w+ start ", line)]
    assert starts == [
        "fedfair aggregator start --plan aggregator/plan.toml",
        f"fedfair auditor start --config {AUDITOR}/auditor.toml",
        *(f"fedfair collaborator start --config {site}/collaborator.toml" for site in SITES),
    ]
    setup = lines[: lines.index(starts[0])]
    # In a deployment the pin's --config reaches no other party's file: the auditor is told its own edit too.
    prose = " ".join((folder / README).read_text().split())
    assert "adds that line to its own `collaborator.toml` (the auditor to its `auditor.toml`," in prose
    assert f"fedfair pki request --name {AUDITOR} --role auditor --out {AUDITOR}/certs" in setup
    ran = fresh_shell("\n".join(setup), folder)  # bash -e: the first failed command stops it
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"{AUDITOR}/auditor.toml: names it as its manifest" in ran.stdout, ran.stdout
    # What each process loads at start, the manifest included: every check it runs before dialling.
    plan = load_aggregator_plan(folder / "aggregator" / "plan.toml")
    assert plan.manifest is not None
    assert (plan.secure_aggregation.input_bound, plan.secure_aggregation.auditor) == (TWO_VERIFIERS, AUDITOR)
    auditor = load_auditor_config(folder / AUDITOR / "auditor.toml")
    check_auditor_identity(auditor)
    assert auditor.name == AUDITOR and auditor.folder == folder / AUDITOR
    for site in SITES:
        assert load_collaborator_config(folder / site / "collaborator.toml").manifest is not None


def test_an_auditor_requested_as_a_collaborator_is_named_at_the_pin_not_added_to_the_sites(tmp_path: Path) -> None:
    """The operator's slip: the auditor's request made with --role collaborator. The manifest then lists it among the
    collaborators; the pin named the roster ("list exactly the manifest's collaborators"), a fix that makes it train."""
    folder = tmp_path / "fed"
    assert cli.main(["init", str(folder), "--sites", ",".join(SITES), "--auditor", AUDITOR]) == 0
    lines = readme_lines(folder / README)
    setup = lines[: lines.index("fedfair aggregator start --plan aggregator/plan.toml")]
    slip = [line.replace(f"--name {AUDITOR} --role auditor", f"--name {AUDITOR} --role collaborator") for line in setup]
    assert slip != setup
    ran = fresh_shell("\n".join(slip), folder)
    said = ran.stdout + ran.stderr
    assert ran.returncode != 0, said  # bash -e: the pin, the first command that fails, is the last run
    assert f"auditor = '{AUDITOR}' is the manifest's collaborator, but the second verifier must be" in said, said
    assert f"request one with `fedfair pki request --name {AUDITOR} --role auditor`" in said, said
    assert "list exactly the manifest's collaborators" not in said, said


def test_every_key_of_auditor_toml_is_explained(tmp_path: Path) -> None:
    """Each setting, commented example or not, has a comment on its line or on the lines just above it."""
    folder = tmp_path / "fed"
    assert cli.main(["init", str(folder), "--sites", ",".join(SITES), "--auditor", AUDITOR]) == 0
    lines = (folder / AUDITOR / "auditor.toml").read_text().splitlines()
    keys = [index for index, line in enumerate(lines) if re.match(r"^(# )?[a-z_]+ = ", line)]
    assert len(keys) >= 13, keys  # [auditor] 5, [certificates] 4, [retry] 4
    for index in keys:
        explained = "#" in lines[index].split(" = ", 1)[1] or lines[index - 1].startswith("# ")
        assert explained, lines[index]


@pytest.mark.parametrize(
    ("auditor", "said"),
    [
        ("site-2", "--auditor 'site-2' is one of --sites; the auditor .* must not train"),
        ("aggregator", "--auditor: 'aggregator' is taken by the federation folder itself"),
        ("Audit_Co", "--auditor: invalid participant name 'Audit_Co'"),
    ],
)
def test_init_refuses_an_auditor_it_cannot_keep_apart_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], auditor: str, said: str
) -> None:
    folder = tmp_path / "fed"
    assert cli.main(["init", str(folder), "--sites", ",".join(SITES), "--auditor", auditor]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and re.search(said, error), error
    assert not folder.exists()
