"""A class's public methods rewritten for the span of an attack, and put back however it ends.

The forging rows rewrite fedfair's secure-aggregation :class:`~fedfair.secagg.server.Server` in this process
(the aggregator runs in a thread of it): :func:`rewritten` is the one way they do so. It takes public names only,
each one the class has: a private or a renamed method would be set as a new attribute that does nothing, and the
row would test an honest run (tests/test_attack_seams.py holds the attacks to fedfair's public seams).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_ABSENT = object()
"""Stands for a method the class inherits rather than defines: put back by deleting the rewrite."""


@contextmanager
def rewritten(owner: type, **methods: Callable[..., Any]) -> Iterator[None]:
    """While open, each method of `owner` named in `methods` is the function given; the originals on exit.

    Raises:
        ValueError: a name is private (``_x``) or not an attribute of `owner`.
    """
    for name in methods:
        if name.startswith("_"):
            raise ValueError(f"{owner.__name__}.{name} is private: an attack rewrites public methods only")
        if not hasattr(owner, name):
            raise ValueError(f"{owner.__name__} has no {name}: renamed? the rewrite would do nothing")
    originals = {name: vars(owner).get(name, _ABSENT) for name in methods}
    try:
        for name, method in methods.items():
            setattr(owner, name, method)
        yield
    finally:
        for name, original in originals.items():
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
