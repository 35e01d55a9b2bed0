"""One definition of each concept: a second training schedule in fedfair/ fails here."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fedfair"

SCHEDULE = ("fedfair/core/config.py", "TrainingConfig")
"""The one training schedule: the plan's [training], the flags, the API and the simulation read into it."""

AVERAGING = {"average_from", "average_from_round"}
STEPS = {"lr", "threshold_lr", "local_steps", "batch_size", "batch_fraction"}


def _sources() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE.parent).as_posix(), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _members(node: ast.ClassDef) -> set[str]:
    """The names a class defines in its body: annotated fields, plain attributes, methods and properties."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names.update(target.id for target in item.targets if isinstance(target, ast.Name))
        elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
    return names


def schedule_classes(sources: list[tuple[str, ast.Module]]) -> list[tuple[str, str]]:
    """Every class that says what a training schedule says: where the averaged output starts, or a number
    of rounds beside a step size or a batch."""
    found = []
    for path, tree in sources:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                members = _members(node)
                if members & AVERAGING or ("rounds" in members and members & STEPS):
                    found.append((path, node.name))
    return found


def test_there_is_one_training_schedule() -> None:
    assert schedule_classes(_sources()) == [SCHEDULE], (
        "a second class holds a training schedule; read it into fedfair.core.config.TrainingConfig "
        "(simulation-only choices belong in fedfair.simulation.rounds.SimulationOptions)"
    )


def test_the_schedule_rule_catches_the_two_schedules_it_replaced() -> None:
    """A flat schedule (rounds beside lr) and a nested one (its own averaging) were both defined once before."""
    flat = ast.parse("class TrainingSettings:\n    rounds: int = 100\n    lr: float = 0.1\n")
    nested = ast.parse("class TrainingConfig:\n    rounds: int = 1000\n    def average_from_round(self): ...\n")
    assert schedule_classes([("flat.py", flat), ("nested.py", nested)]) == [
        ("flat.py", "TrainingSettings"),
        ("nested.py", "TrainingConfig"),
    ]


READER = "fedfair/core/tables.py"
"""The one TOML reader: files and tables, unknown keys refused with a suggestion."""


def toml_importers(sources: list[tuple[str, ast.Module]]) -> list[str]:
    """The modules that import tomllib (at the top, inside a function, or under TYPE_CHECKING)."""
    found = []
    for path, tree in sources:
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name == "tomllib" or name.startswith("tomllib.") for name in names):
                found.append(path)
                break
    return found


def test_only_the_reader_imports_tomllib() -> None:
    assert toml_importers(_sources()) == [READER], (
        "read TOML with fedfair.core.tables (read_toml, parse_toml, Table), not tomllib"
    )


def test_the_reader_rule_sees_every_form_of_import() -> None:
    forms = ("import tomllib", "from tomllib import loads", "def f():\n    import tomllib as t")
    assert toml_importers([(f"{n}.py", ast.parse(form)) for n, form in enumerate(forms)]) == ["0.py", "1.py", "2.py"]
