"""Docstrings are contracts: short module docstrings, and docs/layout.md generated from them."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_DOCSTRING_LINES = 12
"""A summary line and a short paragraph; the reasoning lives once in docs/design.md."""
MODULE_LINES = 700
"""A module holds one idea, as large as that idea: past this many lines its docstring must say why it is one."""
ONE_IDEA = "One idea:"
"""How a module docstring starts the line that says why a module over :data:`MODULE_LINES` is one idea."""


def load_layout_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_layout", ROOT / "docs" / "layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_module_docstring_is_a_summary_and_a_short_paragraph() -> None:
    too_long = {}
    for path in sorted((ROOT / "fedfair").rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        assert docstring, f"{path.relative_to(ROOT)} has no module docstring"
        lines = len(docstring.splitlines())
        if lines > MAX_MODULE_DOCSTRING_LINES:
            too_long[str(path.relative_to(ROOT))] = lines
    assert not too_long, (
        f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines (move the reasoning to docs/design.md): {too_long}"
    )


def oversized(source: str) -> bool:
    """Whether a module's source is over :data:`MODULE_LINES` lines without its docstring saying why it is one idea."""
    if len(source.splitlines()) <= MODULE_LINES:
        return False
    docstring = ast.get_docstring(ast.parse(source), clean=True) or ""
    return not any(line.startswith(ONE_IDEA) for line in docstring.splitlines())


def test_no_module_is_over_the_size_rule_without_saying_why_it_is_one_idea() -> None:
    oversize = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "fedfair").rglob("*.py")
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")) and oversized(path.read_text(encoding="utf-8"))
    )
    assert not oversize, (
        f"modules over {MODULE_LINES} lines whose docstring does not say why they are one idea "
        f"(a line starting {ONE_IDEA!r}), or split them by idea, never compacted to fit: {oversize}"
    )


def test_the_size_rule_sees_a_long_module_and_its_reason() -> None:
    body = "x = 1\n" * MODULE_LINES
    assert not oversized('"""Short."""\n' + "x = 1\n" * (MODULE_LINES - 1))
    assert oversized('"""Short."""\n' + body)
    assert not oversized(f'"""Short.\n\n{ONE_IDEA} the round\'s stages share one state."""\n' + body)


def test_the_layout_page_is_generated_from_the_module_summaries() -> None:
    expected = load_layout_script().layout()
    committed = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    assert committed == expected, (
        "docs/layout.md is out of date: run `.venv/bin/python docs/layout.py > docs/layout.md`"
    )
