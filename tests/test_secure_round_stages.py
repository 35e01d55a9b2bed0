"""The secure round is declared once: few modules may write out its stages.

A module "names" a stage when its code (not its docstrings or comments) uses one of that stage's identifiers:
its member of the header's stage enum, its transport stages, its messages, or the client's and the server's
methods for it. A module naming five or more stages spells out the round, which
:data:`fedfair.secagg.masked_round.SECURE_ROUND` declares: the declaration, the messages and their header's enum may,
and the two state machines, a step per stage in no order of their own (their runners' orders keep it).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fedfair"

STAGE_IDENTIFIERS: dict[str, frozenset[str]] = {
    "advertise": frozenset(
        {
            "ADVERTISE",
            "STAGE_ADVERTISE_KEYS",
            "STAGE_EVAL_ADVERTISE_KEYS",
            "AdvertiseKeys",
            "KeyDirectory",
            "advertise",
            "receive_advertisement",
            "key_directory",
        }
    ),
    "share": frozenset(
        {
            "SHARE",
            "STAGE_SHARE_KEYS",
            "STAGE_EVAL_SHARE_KEYS",
            "ShareKeys",
            "ShareBundle",
            "share_keys",
            "receive_shares",
            "share_bundles",
        }
    ),
    "check": frozenset(
        {
            "CHECK",
            "STAGE_CHECK_SHARES",
            "STAGE_EVAL_CHECK_SHARES",
            "ShareCheck",
            "MaskingSet",
            "check_shares",
            "receive_share_check",
            "masking_set",
        }
    ),
    "mask": frozenset(
        {
            "MASK",
            "STAGE_MASKED_INPUT",
            "STAGE_EVAL_MASKED_INPUT",
            "MaskedInput",
            "SurvivorSet",
            "masked",
            "masked_input",
            "receive_masked_input",
            "survivor_set",
        }
    ),
    "consistency": frozenset(
        {
            "CONSISTENCY",
            "STAGE_CONSISTENCY",
            "STAGE_EVAL_CONSISTENCY",
            "ConsistencySignature",
            "UnmaskRequest",
            "consistency",
            "receive_consistency",
            "unmask_request",
        }
    ),
    "unmask": frozenset(
        {"UNMASK", "STAGE_UNMASK", "STAGE_EVAL_UNMASK", "UnmaskResponse", "unmask", "receive_unmask_response"}
    ),
    "claim": frozenset(
        {"VERIFY", "STAGE_VERIFY_CLAIM", "STAGE_EVAL_VERIFY_CLAIM", "AggregateClaim", "AggregateTag", "receive_tag"}
    ),
    "tags": frozenset({"STAGE_VERIFY_TAGS", "STAGE_EVAL_VERIFY_TAGS", "TagSet", "tag_set", "tags_add_up"}),
}
"""Each stage of the secure round -> the identifiers that name it in code."""

MAY_NAME_EVERY_STAGE = frozenset(
    {
        "fedfair/secagg/masked_round.py",
        "fedfair/secagg/messages.py",
        "fedfair/secagg/wire.py",
        "fedfair/secagg/client.py",
        "fedfair/secagg/server.py",
        "fedfair/secagg/bystander.py",
    }
)
"""The modules that may name five or more stages: the declaration, the messages, the header's stage enum, the
party's and the server's state machines, and the bystander's check of a past round (a site that missed it checks
each stage's kept input as a survivor would)."""


def stages_named(source: str) -> set[str]:
    """The stages a module's code names (identifiers and attributes, never strings or comments)."""
    words: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.add(node.name)
        elif isinstance(node, ast.alias):
            words.add(node.asname or node.name.rsplit(".", 1)[-1])
    return {stage for stage, names in STAGE_IDENTIFIERS.items() if names & words}


def modules_naming_most_stages() -> dict[str, set[str]]:
    """Every fedfair module that names five or more of the secure round's stages, with those stages."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        named = stages_named(path.read_text())
        if len(named) >= 5:
            found[path.relative_to(PACKAGE.parent).as_posix()] = named
    return found


def test_few_modules_write_out_the_secure_round() -> None:
    found = modules_naming_most_stages().keys() - MAY_NAME_EVERY_STAGE
    assert not found, (
        f"{len(found)} more modules name five or more of the secure round's stages ({', '.join(sorted(found))}); "
        "loop over fedfair.secagg.masked_round.SECURE_ROUND instead of writing the stages out"
    )


def test_the_count_sees_a_module_that_writes_the_stages_out() -> None:
    """The old in-process round wrote each stage's loop out; the count must see such a module."""
    written_out = (
        "server.receive_advertisement(a)\nserver.receive_shares(s)\nserver.receive_share_check(c)\n"
        "server.receive_masked_input(m)\n# server.receive_consistency(x) in a comment names nothing\n"
        "text = 'receive_unmask_response'\n"
    )
    assert stages_named(written_out) == {"advertise", "share", "check", "mask"}
    assert len(stages_named(written_out + "server.receive_consistency(x)\n")) == 5
