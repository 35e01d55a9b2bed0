"""docs/operations.md, "What the aggregator says": every line it quotes is the aggregator's own text.

The runbook quotes the aggregator's log lines and fatal messages with placeholders in
``<angle brackets>``, and most with their level in parentheses after the quote. The
test reads every string the aggregator's modules can log or raise (their syntax trees:
f-strings and ``%`` formats with their fields as placeholders) and fails when a quoted
line no longer occurs there, or no longer at the level the runbook gives it. A fatal
message may be built apart from its ``raise`` (the quorum failure's advice is), so
"fatal" accepts any string of the modules; a log level must be the logging call's own.
The figures the section states (how often the wait is reported, the report rate) are
read from the code too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from fedfair.runtime.aggregator import quorum
from fedfair.runtime.aggregator.limits import RefusalLog
from fedfair.runtime.rate_limits import RateLimit

ROOT = Path(__file__).resolve().parents[1]
RUNBOOK = ROOT / "docs" / "operations.md"
SECTION = "## What the aggregator says"
MODULES = tuple(
    sorted(
        str(path.relative_to(ROOT / "fedfair")) for path in (ROOT / "fedfair" / "runtime" / "aggregator").glob("*.py")
    )
) + ("cli/aggregator.py", "core/sum_bounds.py")
"""Where the aggregator's operator-facing text lives (under fedfair/): every module of its runtime package, so that
a module split out keeps its lines checked; its command; the bounds of a decoded sum it shares with every site's
model chain."""

FIELD = "\x00"
"""A formatted field of a message in the code (a placeholder of the runbook matches it)."""
PERCENT_FIELD = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[sdfgr]")
PLACEHOLDER = re.compile(r"<(?:[^<>]|<[^<>]*>)*>")
"""A runbook placeholder, one level of nesting allowed: ``<no deadline|<s> s left>``."""
QUOTE_WITH_LEVEL = re.compile(r"`([^`]+)` \(([^)]*)\)")
LEVELS = ("INFO", "WARNING", "ERROR", "fatal")
NOT_MESSAGES = {"<angle brackets>", "fedfair: error: <message>", "ss -ltnp"}
"""Code spans of the section that are not the aggregator's text (the CLI's prefix, a shell command)."""


def section() -> str:
    text = RUNBOOK.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end >= 0 else None]


def template(node: ast.AST) -> str | None:
    """A string constant or f-string of the code as text, each formatted field replaced by FIELD."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return PERCENT_FIELD.sub(FIELD, node.value)
    if isinstance(node, ast.JoinedStr):
        pieces = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                pieces.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                # {x!r} shows its quotes, and the runbook quotes the placeholder: '<name>'.
                pieces.append(f"'{FIELD}'" if value.conversion == ord("r") else FIELD)
        return "".join(pieces)
    return None


def strings_under(node: ast.AST) -> Iterator[str]:
    for inner in ast.walk(node):
        text = template(inner)
        if text is not None:
            yield text


def code_messages() -> list[tuple[frozenset[str], str]]:
    """Every string of the aggregator's modules, with the levels it can appear at.

    A logging call's message has its call's level (``logger.log`` takes INFO, WARNING or ERROR
    from the refusal path); a raised one is fatal; any other string is "text".
    """
    found: list[tuple[frozenset[str], str]] = []
    for module in MODULES:
        tree = ast.parse((ROOT / "fedfair" / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                found += [(frozenset({"fatal"}), text) for text in strings_under(node.exc)]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "logger"
            ):
                method = node.func.attr
                levels = {"INFO", "WARNING", "ERROR"} if method == "log" else {method.upper()}
                found += [(frozenset(levels), text) for text in strings_under(node)]
            text = template(node)
            if text is not None:
                found.append((frozenset({"text"}), text))
    return found


def occurs(quote: str, message: str) -> bool:
    """Whether the runbook's `quote` occurs in the code's `message`: its literal pieces in order, each
    placeholder standing for at least one character (a field, or words the runbook leaves out)."""
    first, *rest = PLACEHOLDER.split(quote)
    found = message.find(first)
    if found < 0:
        return False
    position = found + len(first)
    for piece in rest:
        found = message.find(piece, position + 1)
        if found < 0:
            return False
        position = found + len(piece)
    return True


def test_every_line_the_runbook_quotes_is_the_aggregators_own_at_its_level() -> None:
    text = section()
    messages = code_messages()
    spans = {" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)}
    quotes = {span for span in spans if " " in span and not span.startswith("[")} - NOT_MESSAGES
    levels = {
        " ".join(quote.split()): set(re.findall("|".join(LEVELS), stated))
        for quote, stated in QUOTE_WITH_LEVEL.findall(text)
    }
    assert len(quotes) >= 40 and len(levels) >= 30  # the section is still a list of the aggregator's lines
    problems = []
    for quote in sorted(quotes):
        where = [kinds for kinds, message in messages if occurs(quote, message)]
        if not where:
            problems.append(f"not in the code: {quote!r}")
            continue
        stated = levels.get(quote, set())
        accepted = [kinds | ({"fatal"} if "text" in kinds else set()) for kinds in where]
        if stated and not any(stated <= kinds for kinds in accepted):
            problems.append(f"{quote!r} is said to be {sorted(stated)}, but the code has it at {where}")
    assert not problems, "\n".join(problems)


def test_the_figures_the_runbook_states_are_the_codes() -> None:
    text = " ".join(section().split())
    rate, refusals = RateLimit(), RefusalLog().rate
    assert f"repeated every {quorum.WAIT_REPORT_SECONDS:g} s while it waits" in text
    assert f"burst of {rate.burst} at once, then {rate.per_second:g} a second, per name" in text
    assert f"a burst of {refusals.burst} at once, then {refusals.per_second:g} a second, per name" in text


def test_the_checker_catches_a_line_the_code_does_not_have() -> None:
    messages = code_messages()
    for quote, present in (
        ("round <n> applied: <k> of <m> participants contributed", True),
        ("round <n> applied at once", False),
        ("certificate '<name>' (not admitted)", True),
    ):
        assert any(occurs(quote, message) for _, message in messages) is present, quote
