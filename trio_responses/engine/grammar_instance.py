"""A short sentence of a custom tool's grammar: what the scripted model writes.

`grammar_instance` walks a lark grammar's compiled rules (`protocol.grammar.compiled_lark`)
from ``start``, taking at each rule the expansion with the shortest text, and writes a
regex terminal (or a ``regex`` grammar) with `schema_instance.regex_instance`. Pure;
bounded by the grammar's size (`protocol.grammar.MAX_DEFINITION_CHARS`).
"""

from __future__ import annotations

import math

from .._adapters.lark_grammar import CompiledGrammar
from ..protocol.grammar import Grammar, compiled_lark
from .schema_instance import regex_instance

MAX_INSTANCE_CHARS = 16 * 1024
"""The longest instance written (a grammar whose shortest sentence is longer has none)."""


MAX_DEPTH = 200
"""The deepest nesting of rules walked."""


class NoInstance(Exception):
    """The grammar has no sentence this module can write."""


def grammar_instance(grammar: Grammar) -> str:
    """A short text in the language of ``grammar``.

    Raises:
        NoInstance: none could be written (a regex beyond the simple subset, a
            grammar whose shortest sentence is too long).
        protocol.grammar.InvalidGrammar: the definition does not compile.
    """
    if grammar.syntax == "regex":
        text = regex_instance(grammar.definition)
        if text is None:
            raise NoInstance("no short string matches this regular expression")
        return text
    return _Walk(compiled_lark(grammar.definition)).text()


class _Walk:
    def __init__(self, grammar: CompiledGrammar) -> None:
        self._rules = grammar.rules
        self._terminals: dict[str, str | None] = {}
        for name, terminal in grammar.terminals.items():
            if terminal.regex:
                self._terminals[name] = regex_instance(terminal.value, nonempty=True)
            else:
                self._terminals[name] = terminal.value
        self._cost = self._costs()

    def _symbol_cost(self, is_term: bool, name: str, costs: dict[str, float]) -> float:
        if is_term:
            text = self._terminals.get(name)
            return math.inf if text is None else len(text)
        return costs.get(name, math.inf)

    def _costs(self) -> dict[str, float]:
        """Each rule's shortest text length (a fixed point: at most one pass per rule)."""
        costs: dict[str, float] = {}
        for _ in range(len(self._rules) + 1):
            changed = False
            for rule in self._rules:
                cost = sum(self._symbol_cost(t, n, costs) for t, n in rule.expansion)
                if cost < costs.get(rule.origin, math.inf):
                    costs[rule.origin] = cost
                    changed = True
            if not changed:
                break
        return costs

    def text(self) -> str:
        if self._cost.get("start", math.inf) > MAX_INSTANCE_CHARS:
            raise NoInstance("the grammar's shortest sentence is too long to write")
        out: list[str] = []
        self._write("start", out, 0)
        return "".join(out)

    def _write(self, origin: str, out: list[str], depth: int) -> None:
        # The cheapest expansion (the one with fewest rules, among equals) leaves less
        # to write; rules that only rename each other are cut off by depth.
        if depth > MAX_DEPTH:
            raise NoInstance("the grammar nests too deep to write a sentence")
        best = min(
            (rule for rule in self._rules if rule.origin == origin),
            key=lambda rule: (
                sum(self._symbol_cost(t, n, self._cost) for t, n in rule.expansion),
                sum(1 for t, _ in rule.expansion if not t),
            ),
        )
        for is_term, name in best.expansion:
            if is_term:
                out.append(self._terminals[name] or "")
            else:
                self._write(name, out, depth + 1)


__all__ = ["MAX_INSTANCE_CHARS", "NoInstance", "grammar_instance"]
