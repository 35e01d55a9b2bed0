"""The house rule, checked on the source. From the bottom up:

1. core imports only itself, numpy, torch and the standard library;
2. the libraries, in the order of `LIBRARIES`: each may use core and the libraries before it;
3. the in-process engine (simulation) may use core and the libraries;
4. the public API (api.py) may use core, the libraries and the simulation;
5. the runtime may use core and the libraries, never the simulation, the API or research;
6. research may use everything but the command line;
7. the Flower integration (flower, an optional extra) may use core, the libraries, the simulation and the API,
   and nothing in fedfair may import it: fedfair runs without Flower installed.

Inside the runtime, what an operator sees (runtime.observe: events, state, metrics, logs) sits below both
parties, and the output folder's layout (runtime.output_folder) below that: a collaborator never reaches the
aggregator, nor the aggregator a collaborator, and observe reaches neither. What every party dialling the
aggregator shares (runtime.peer: the connection, its back-off, watchdog and uplink) sits below the roles and
reaches none of them; the auditor is built from it, never from the collaborator's own modules.

Imports are read from the syntax tree (including imports inside functions) and followed
transitively, so a rule cannot be dodged through a module in between.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "fedfair"
CORE_THIRD_PARTY = frozenset({"numpy", "torch"})
LIBRARIES = (
    "fedfair.pki",
    "fedfair.privacy",
    "fedfair.datasets",
    "fedfair.secagg",
    "fedfair.fairness",
    "fedfair.bundle",
)
"""The libraries in their order: each may import only core and the libraries before it."""
ABOVE_LIBRARIES = ("fedfair.simulation", "fedfair.api", "fedfair.runtime", "fedfair.research", "fedfair.cli")
FLOWER = "fedfair.flower"
"""The optional Flower integration, on top: it imports what it needs below it, and nothing imports it."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {module_name(path): path for path in PACKAGE_ROOT.rglob("*.py")}


def imported_names(source: str, module: str, is_package: bool) -> Iterator[str]:
    """Every module an import statement names, relative imports resolved."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            # `from fedfair.core import server` imports the module fedfair.core.server.
            yield from (f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)


@cache
def direct_imports(module: str) -> frozenset[str]:
    path = MODULES[module]
    return frozenset(imported_names(path.read_text(), module, path.name == "__init__.py"))


def internal(name: str) -> str | None:
    """The fedfair module an import resolves to (the longest known prefix), or None."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


@cache
def reachable(module: str) -> frozenset[str]:
    """Every fedfair module `module` imports, directly or through others (packages' __init__ included)."""
    seen: set[str] = set()
    stack = [module]
    while stack:
        current = stack.pop()
        for name in direct_imports(current):
            target = internal(name)
            if target is None:
                continue
            parents = [".".join(target.split(".")[:end]) for end in range(2, target.count(".") + 1)]
            for found in (target, *parents):
                if found in MODULES and found not in seen:
                    seen.add(found)
                    stack.append(found)
    seen.discard(module)
    return frozenset(seen)


def within(module: str, *packages: str) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def modules_in(*packages: str) -> list[str]:
    return sorted(module for module in MODULES if within(module, *packages))


def violations(modules: list[str], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{module} -> {target}"
        for module in modules
        for target in sorted(reachable(module))
        if within(target, *forbidden)
    ]


def test_the_layers_exist() -> None:
    for package in (
        "fedfair.core",
        "fedfair.simulation",
        "fedfair.api",
        "fedfair.runtime",
        "fedfair.research",
        FLOWER,
        *LIBRARIES,
    ):
        assert package in MODULES, f"{package} is missing"
    assert len(modules_in("fedfair.core")) >= 5


@pytest.mark.parametrize("module", modules_in("fedfair.core"))
def test_core_imports_only_itself_numpy_torch_and_the_standard_library(module: str) -> None:
    outside = sorted(
        name
        for name in direct_imports(module)
        if not within(name, "fedfair.core")
        and name.split(".")[0] not in CORE_THIRD_PARTY
        and name.split(".")[0] not in sys.stdlib_module_names
        and name != "__future__"
    )
    assert not outside, f"{module} imports {outside}; core may import only fedfair.core, numpy, torch and stdlib"


@pytest.mark.parametrize("position", range(len(LIBRARIES)), ids=LIBRARIES)
def test_a_library_reaches_only_core_and_the_libraries_before_it(position: int) -> None:
    later = LIBRARIES[position + 1 :]
    assert violations(modules_in(LIBRARIES[position]), (*later, *ABOVE_LIBRARIES)) == []


def test_the_simulation_reaches_only_core_and_the_libraries() -> None:
    assert violations(modules_in("fedfair.simulation"), ABOVE_LIBRARIES[1:]) == []


def test_the_api_reaches_only_core_the_libraries_and_the_simulation() -> None:
    assert violations(modules_in("fedfair.api"), ABOVE_LIBRARIES[2:]) == []


def test_the_runtime_never_reaches_the_simulation_the_api_or_research() -> None:
    forbidden = ("fedfair.simulation", "fedfair.api", "fedfair.research", "fedfair.cli")
    assert violations(modules_in("fedfair.runtime"), forbidden) == []


def test_research_never_reaches_the_command_line() -> None:
    assert violations(modules_in("fedfair.research"), ("fedfair.cli",)) == []


def test_the_flower_integration_reaches_only_core_the_libraries_the_simulation_and_the_api() -> None:
    assert violations(modules_in(FLOWER), ABOVE_LIBRARIES[2:]) == []


def test_nothing_in_fedfair_reaches_the_flower_integration() -> None:
    others = [module for module in MODULES if not within(module, FLOWER)]
    assert violations(others, (FLOWER,)) == []


def test_a_collaborator_never_reaches_aggregator_modules() -> None:
    assert violations(modules_in("fedfair.runtime.collaborator"), ("fedfair.runtime.aggregator",)) == []


ROLES = (
    "fedfair.runtime.aggregator",
    "fedfair.runtime.collaborator",
    "fedfair.runtime.auditor",
    "fedfair.runtime.local",
)
"""The runtime's role packages: one per kind of process, and the launcher that starts them on one machine."""


@pytest.mark.parametrize("role", ["fedfair.runtime.auditor", "fedfair.runtime.aggregator"])
def test_neither_the_auditor_nor_the_aggregator_reaches_collaborator_modules(role: str) -> None:
    assert violations(modules_in(role), ("fedfair.runtime.collaborator",)) == []


def test_the_shared_peer_reaches_no_role() -> None:
    assert modules_in("fedfair.runtime.peer"), "fedfair.runtime.peer is missing"
    assert violations(modules_in("fedfair.runtime.peer"), ROLES) == []


def test_what_an_operator_sees_reaches_no_role() -> None:
    assert violations(modules_in("fedfair.runtime.observe"), ROLES) == []


def test_the_output_folder_layout_reaches_nothing_of_fedfair() -> None:
    assert reachable("fedfair.runtime.output_folder") == frozenset()


def test_the_checker_sees_a_violation() -> None:
    """The walker itself: a forbidden import, even inside a function, is found."""
    source = "def late():\n    from fedfair.simulation.rounds import run_rounds\n"
    names = set(imported_names(source, "fedfair.core.local", is_package=False))
    assert "fedfair.simulation.rounds" in names
    relative = set(imported_names("from ..simulation import rounds\n", "fedfair.core.local", is_package=False))
    assert "fedfair.simulation" in relative and "fedfair.simulation.rounds" in relative


def module_edges(module: str) -> frozenset[str]:
    """The modules (not packages) `module` imports directly, inside functions and TYPE_CHECKING included."""
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    targets = (internal(name) for name in direct_imports(module))
    return frozenset(target for target in targets if target is not None and target not in packages | {module})


def circles() -> list[str]:
    """Each module that reaches itself through the modules it imports, with the way back."""
    found = []
    for start in sorted(MODULES):
        if MODULES[start].name == "__init__.py":
            continue
        paths = {target: [start, target] for target in module_edges(start)}
        frontier = list(paths)
        while frontier:
            current = frontier.pop()
            for target in module_edges(current):
                if target not in paths:
                    paths[target] = [*paths[current], target]
                    frontier.append(target)
        if start in paths:
            found.append(" -> ".join(paths[start]))
    return found


def test_no_module_imports_itself_through_others() -> None:
    """No import circles, not even through a lazy import or one made for type checking only: a module's
    dependencies can then be read, tested and moved without it."""
    assert circles() == []


KIND_DECLARATIONS = ("fedfair.secagg.bounded", "fedfair.secagg.masked_round", "fedfair.secagg.wire")
"""The library's modules that declare one kind of round (its stages, its messages, its peers): a runner takes a
kind from the registry (fedfair.secagg.round, fedfair.secagg.kinds), never from these."""
KIND_CONSTANTS = frozenset(
    {"SECURE_ROUND", "BOUNDED_ROUND", "BOUNDED_TRAINING", "BoundedStage", "BoundedSite", "BoundedServer", "Auditor"}
)
"""The names of one kind's declaration, its stages or its parties."""
KIND_PLUG_INS = (
    "fedfair.runtime.collaborator.kinds",
    "fedfair.runtime.auditor.kinds",
    "fedfair.runtime.plan.input_bound",
    "fedfair.runtime.plan.bounded_check",
)
"""The runtime's side of each built-in kind: its collaborator steps, its auditor's, the plan's input bound that
names the bounded sum, and the bounded sum's check of a plan at the model's size. Everything else in the runtime looks a kind up by name (issue 92)."""


def kind_names(source: str, module: str, is_package: bool) -> list[str]:
    """The kind declarations `source` imports and the kind constants it names, sorted."""
    imported = (name for name in imported_names(source, module, is_package) if within(name, *KIND_DECLARATIONS))
    named = {
        node.id if isinstance(node, ast.Name) else node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Name, ast.Attribute))
    }
    aliased = {
        alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    return sorted({*imported, *((named | aliased) & KIND_CONSTANTS)})


@pytest.mark.parametrize(
    "module", [module for module in modules_in("fedfair.runtime") if not within(module, *KIND_PLUG_INS)]
)
def test_no_runtime_module_outside_the_kinds_plug_ins_names_a_round_kind(module: str) -> None:
    """A generic runtime module takes its round kind from the plan through the registry, never a kind's own."""
    path = MODULES[module]
    named = kind_names(path.read_text(), module, path.name == "__init__.py")
    assert not named, (
        f"{module} names a kind of round ({', '.join(named)}): look the plan's kind up "
        "(fedfair.runtime.contract.training_stages, fedfair.secagg.round.round_kind) or move the code into "
        f"the kind's plug-in ({', '.join(KIND_PLUG_INS)})"
    )


def test_the_kind_checker_sees_a_kind_named() -> None:
    """The checker itself: an import of a kind's declaration, inside a function too, and a constant used are found."""
    source = "def late():\n    from fedfair.secagg.bounded.stages import record_bytes\n    return BOUNDED_TRAINING\n"
    assert kind_names(source, "fedfair.runtime.x", is_package=False) == [
        "BOUNDED_TRAINING",
        "fedfair.secagg.bounded.stages",
    ]
    assert kind_names("from fedfair.secagg.round import round_kind\n", "fedfair.runtime.x", False) == []
