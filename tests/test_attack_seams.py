"""The attack suite extends fedfair through its public seams only (issue 76).

An attack that overrides or patches a private method breaks silently when that internal is renamed or
reshaped (one row already did, on a renamed ``RoundJob``), and an honest run no longer tests what the attack
attacks. So the modules of ``benchmarks/attacks`` are read here, as syntax, and none may:

- import a ``_``-prefixed name from fedfair;
- reach a ``_``-prefixed name that fedfair defines on any object but its own (``obj._x``, or
  ``getattr``/``setattr``/``delattr`` with such a name), a class's own ``self._x`` aside, nor one that no attack
  module defines (a patch of a private method since renamed would set a new attribute and do nothing);
- define, in a class derived from a fedfair class (directly or through another attack class), a
  ``_``-prefixed method that fedfair defines.

The check is by name: the private names are every ``_x`` that fedfair's source defines (functions, methods,
attributes, class and module names), so an attack's own helper of the same name reached from outside its class
counts too; such a helper is better public anyway.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedfair"
ATTACKS = ROOT / "benchmarks" / "attacks"
REACHING = {"getattr", "setattr", "delattr", "hasattr"}


def private(name: str) -> bool:
    """Whether `name` is private by Python's convention: one leading underscore, not a dunder."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def defined_names(tree: ast.AST) -> Iterator[str]:
    """Every name a module defines: functions, classes, assigned names and attributes (``self._x = ...``)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            yield node.id if isinstance(node, ast.Name) else node.attr


def own_names(tree: ast.AST) -> Iterator[str]:
    """The names a module defines for itself: :func:`defined_names` less attributes it sets on others' objects."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}:
                yield node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id


def fedfair_private_names() -> frozenset[str]:
    """Every private name fedfair's source defines."""
    return frozenset(
        name for path in PACKAGE.rglob("*.py") for name in defined_names(ast.parse(path.read_text())) if private(name)
    )


def fedfair_imports(tree: ast.Module) -> dict[str, str]:
    """The names a module binds by importing them from fedfair, each to what it imported."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "fedfair":
            bound |= {alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            bound |= {
                (alias.asname or alias.name).split(".")[0]: alias.name
                for alias in node.names
                if alias.name.split(".")[0] == "fedfair"
            }
    return bound


def base_names(node: ast.ClassDef) -> Iterator[str]:
    """The names of a class's bases as written: ``Collaborator``, or ``client.Collaborator``'s last part and root."""
    for base in node.bases:
        while isinstance(base, ast.Subscript):
            base = base.value
        if isinstance(base, ast.Name):
            yield base.id
        elif isinstance(base, ast.Attribute):
            yield base.attr
            root = base
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name):
                yield root.id


def derived_classes(trees: dict[Path, ast.Module]) -> set[str]:
    """The attack classes derived from a fedfair class, directly or through other attack classes (by name)."""
    classes = [
        (node, fedfair_imports(tree))
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]
    derived: set[str] = set()
    grew = True
    while grew:
        grew = False
        for node, imported in classes:
            if node.name not in derived and any(name in imported or name in derived for name in base_names(node)):
                derived.add(node.name)
                grew = True
    return derived


def violations(trees: dict[Path, ast.Module], privates: frozenset[str]) -> list[str]:
    """Each place an attack module reaches past fedfair's public seams, as ``file:line: what``."""
    derived = derived_classes(trees)
    own = {name for tree in trees.values() for name in own_names(tree)}
    found: list[str] = []
    for path, tree in trees.items():
        where = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "fedfair":
                found += [
                    f"{where}:{node.lineno}: imports {alias.name} from {node.module}"
                    for alias in node.names
                    if private(alias.name)
                ]
            elif isinstance(node, ast.ClassDef) and node.name in derived:
                found += [
                    f"{where}:{item.lineno}: {node.name} overrides {item.name}"
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in privates
                ]
                # Inside a derived class, its own self._x is fedfair's when fedfair defines _x.
                found += [
                    f"{where}:{inner.lineno}: {node.name} reaches self.{inner.attr}"
                    for inner in ast.walk(node)
                    if isinstance(inner, ast.Attribute)
                    and inner.attr in privates
                    and isinstance(inner.value, ast.Name)
                    and inner.value.id == "self"
                ]
            elif (
                isinstance(node, ast.Attribute)
                and private(node.attr)
                and (node.attr in privates or node.attr not in own)
            ):
                # A name fedfair defines, or one no attack defines: a private name fedfair no longer has (a method
                # renamed under a patch) would otherwise be set on the object and silently do nothing.
                if not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}):
                    found.append(f"{where}:{node.lineno}: reaches {ast.unparse(node)}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in REACHING
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in privates
            ):
                found.append(f"{where}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return sorted(set(found))


def attack_trees() -> dict[Path, ast.Module]:
    """Every attack module's syntax tree."""
    return {path: ast.parse(path.read_text()) for path in sorted(ATTACKS.glob("*.py"))}


def test_the_attacks_use_only_fedfairs_public_seams() -> None:
    found = violations(attack_trees(), fedfair_private_names())
    assert not found, f"{len(found)} reaches past fedfair's public seams:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_reach() -> None:
    """The check above can fail: one module doing each forbidden thing, one doing none of them."""
    privates = frozenset({"_step", "_lock", "_last"})
    hostile = ast.parse(
        "from fedfair.runtime.collaborator.client import Collaborator\n"
        "from fedfair.runtime.collaborator.steps import _step_helper\n"
        "class Liar(Collaborator):\n"
        "    def _step(self, stub, task):\n"
        "        return self._lock\n"
        "class Louder(Liar):\n"
        "    def _step(self, stub, task):\n"
        "        pass\n"
        "def tamper(gate, loop):\n"
        "    gate._last = None\n"
        "    setattr(gate, '_lock', None)\n"
        "    loop._renamed_since = None\n"
    )
    honest = ast.parse(
        "from fedfair.runtime.collaborator.client import Collaborator\n"
        "class Liar(Collaborator):\n"
        "    def submit(self, stub, binding, payload):\n"
        "        return super().submit(stub, binding, payload)\n"
        "class Own:\n"
        "    def _step(self):\n"
        "        return self._lock\n"
    )
    found = violations({ATTACKS / "hostile.py": hostile, ATTACKS / "honest.py": honest}, privates)
    assert sorted(line.split(": ", 1)[1] for line in found) == [
        "Liar overrides _step",
        "Liar reaches self._lock",
        "Louder overrides _step",
        "imports _step_helper from fedfair.runtime.collaborator.steps",
        "reaches gate._last",
        "reaches loop._renamed_since",
        "setattr(..., '_lock')",
    ]
