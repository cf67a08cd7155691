"""CPython's regular-expression parser (``re._parser``), as a tree of our own (`parse`).

``re._parser`` is CPython's private module (``sre_parse`` before 3.11). It relies
on, listed in `RELIES_ON` and checked by tests/test_pinned_libraries.py on each
Python the suite runs on (`TESTED_PYTHONS`: pyproject.toml's classifiers):

- ``re._parser.parse`` (a pattern's ``SubPattern``: a list of ``(opcode, argument)``);
- ``re._parser.SubPattern``, ``re._parser.MAXREPEAT`` (a repeat's "no upper bound");
- the names of the opcodes (``re._constants``) and the shapes of their arguments,
  which `parse` turns into the shapes it documents.
"""

from __future__ import annotations

import re._parser as _parser  # type: ignore[import-not-found]
from typing import Any

from . import Internal

TESTED_PYTHONS = ("3.11", "3.12", "3.13")
"""The Python versions pyproject.toml supports, each checked by the suite's run on it."""

RELIES_ON = (
    Internal("re._parser:parse", ("str", "flags", "state")),
    Internal("re._parser:SubPattern"),
    Internal("re._parser:MAXREPEAT"),
)
"""The names above, for tests/test_pinned_libraries.py (which also checks the shapes
of `parse`'s trees)."""

Node = tuple[str, Any]
"""One element of a parsed pattern: its opcode's name and its argument (see `parse`)."""

unbounded: int = int(_parser.MAXREPEAT)
"""A repeat's ``high`` when it has no upper bound."""


_REPEATS = frozenset(("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"))
_GROUPS = frozenset(("SUBPATTERN", "ATOMIC_GROUP", "ASSERT", "ASSERT_NOT"))


def parse(pattern: str) -> list[Node]:
    """``pattern`` parsed as Python's ``re`` does, as ``(name, argument)`` pairs:

    - ``("LITERAL", code point)``, ``("NOT_LITERAL", code point)``, ``("ANY", None)``;
    - ``("IN", items)``: a character class, its items ``("NEGATE", None)`` (first,
      if negated), ``("LITERAL", code point)``, ``("RANGE", (low, high))``,
      ``("CATEGORY", name)``;
    - ``("CATEGORY", name)`` (``"CATEGORY_DIGIT"``...), ``("AT", name)``;
    - ``("MAX_REPEAT" | "MIN_REPEAT" | "POSSESSIVE_REPEAT", (low, high, nodes))``:
      ``high`` is `unbounded` for no upper bound;
    - ``("SUBPATTERN" | "ATOMIC_GROUP" | "ASSERT" | "ASSERT_NOT", nodes)``: a group
      or a look-around, its content;
    - ``("BRANCH", [nodes, ...])``: the alternatives;
    - anything else: its name, and the argument as ``re._parser`` gives it.

    Raises:
        re.error: not a valid pattern (also RecursionError or OverflowError for
            some that nest or repeat too much).
    """
    return _nodes(_parser.parse(pattern))


def _nodes(items: Any) -> list[Node]:
    return [_node(str(op), arg) for op, arg in items]


def _node(name: str, arg: Any) -> Node:
    if name in ("LITERAL", "NOT_LITERAL"):
        return name, arg
    if name in _REPEATS:
        low, high, sub = arg
        return name, (int(low), int(high), _nodes(sub))
    if name in _GROUPS:
        # SUBPATTERN (group, add flags, del flags, p), ASSERT (direction, p),
        # ATOMIC_GROUP p.
        return name, _nodes(arg if name == "ATOMIC_GROUP" else arg[-1])
    if name == "BRANCH":
        return name, [_nodes(branch) for branch in arg[1]]
    if name == "IN":
        return name, [_class_item(str(op), value) for op, value in arg]
    if name in ("CATEGORY", "AT"):
        return name, str(arg)
    return name, arg


def _class_item(name: str, arg: Any) -> Node:
    if name == "RANGE":
        return name, (arg[0], arg[1])
    if name == "CATEGORY":
        return name, str(arg)
    return name, arg


__all__ = ["Node", "parse", "unbounded"]
