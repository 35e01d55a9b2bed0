"""The error hierarchy, all in fedfair.core.errors: every error is a FedfairError, a bad setting a ValueError too."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from fedfair.core.config import LocalConfig
from fedfair.core.errors import ConfigError, FedfairError

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "fedfair"
BUILTIN_ERRORS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, Exception) and not issubclass(value, Warning)
}
"""The builtin exception classes an error class can derive from. Warnings are not errors and stay out, and so are
the stops that derive from BaseException alone (a signal's KeyboardInterrupt, SystemExit): no error handler may
catch them."""


def test_a_refused_setting_reaches_a_handler_of_fedfair_errors_with_its_one_line_message() -> None:
    """The CLI catches FedfairError and prints the message: a ConfigError must arrive there whole."""
    with pytest.raises(FedfairError) as caught:
        LocalConfig(local_steps=0)
    assert type(caught.value) is ConfigError
    assert "\n" not in str(caught.value) and "--local-steps" in str(caught.value)


def test_a_refused_setting_is_also_a_value_error() -> None:
    """Code that guards a conversion with `except ValueError` sees a bad setting too."""
    with pytest.raises(ValueError, match="lr must be a positive number"):
        LocalConfig(lr=-1.0)


def test_fedfair_error_is_not_a_value_error() -> None:
    """Only bad input is a ValueError; a protocol or wire failure must not be swallowed by `except ValueError`."""
    assert not issubclass(FedfairError, ValueError)


def base_name(base: ast.expr) -> str:
    """`Error` for a base written `Error` or `module.Error`."""
    return base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")


def defined_exception_classes() -> dict[str, set[str]]:
    """Every error class (an exception, not a warning) defined in the package's source, with its bases' names."""
    bases: dict[str, set[str]] = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(base_name(base) for base in node.bases)
    exceptions: dict[str, set[str]] = {}
    changed = True
    while changed:  # a class is an error when one of its bases is (a builtin error or one already found)
        changed = False
        for name, parents in bases.items():
            if name not in exceptions and parents & (BUILTIN_ERRORS | exceptions.keys()):
                exceptions[name] = parents
                changed = True
    return exceptions


def test_every_error_class_fedfair_defines_is_a_fedfair_error() -> None:
    """FedfairError is the base of every error fedfair raises on purpose, so one handler catches them all."""
    exceptions = defined_exception_classes()
    assert {"ConfigError", "ProtocolError"} <= exceptions.keys(), "the scan must find the package's errors"

    def ancestors(name: str) -> set[str]:
        found, frontier = set(), [name]
        while frontier:
            for parent in exceptions.get(frontier.pop(), set()) - found:
                found.add(parent)
                frontier.append(parent)
        return found

    strays = sorted(name for name in exceptions if name != "FedfairError" and "FedfairError" not in ancestors(name))
    assert strays == [], f"derive these from FedfairError (fedfair.core.errors): {strays}"


ERRORS_MODULE = PACKAGE_ROOT / "core" / "errors.py"


def test_every_exception_class_is_defined_in_the_errors_module_and_named_error() -> None:
    """One module holds what users catch, so no two classes can name one concept unseen; warnings
    (`PrivacyWarning`) are filtered, not caught, and keep their `Warning` suffix."""
    exceptions = defined_exception_classes()
    assert {"ConfigError", "RefusedError", "QuorumError"} <= exceptions.keys(), "the scan must find the errors"
    elsewhere = sorted(
        f"{path.relative_to(PACKAGE_ROOT.parent)}:{node.name}"
        for path in PACKAGE_ROOT.rglob("*.py")
        if path != ERRORS_MODULE
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name in exceptions
    )
    assert elsewhere == [], f"define these in fedfair/core/errors.py (one class, a reason for each cause): {elsewhere}"
    misnamed = sorted(name for name in exceptions if not name.endswith("Error"))
    assert misnamed == [], f"end these exception names in Error: {misnamed}"
