"""Lark grammars compiled without a parser (lark==1.2.2), as a tree of our own (`compile`).

Custom tools' grammars (Codex's ``apply_patch``) use terminals that may match
the empty string (``/(.*)/``), which vLLM's grammar engines accept and lark's own
parsers refuse ("zero-width terminals"); so a definition is checked by loading
and compiling it, not by building a ``lark.Lark``. That needs lark's private
grammar loader, listed in `RELIES_ON` and checked by tests/test_pinned_libraries.py:

- ``lark.load_grammar.load_grammar`` (grammar, source, import paths, keep all
  tokens) -> (grammar, used files);
- ``Grammar.compile`` (start rules, terminals to keep) -> (terminals, rules,
  ignored terminal names);
- what they hold: ``Rule.origin`` and ``Rule.expansion`` (symbols with ``name`` and
  ``is_term``), ``TerminalDef.name`` and ``TerminalDef.pattern`` (a ``PatternStr``
  or ``PatternRE`` with ``value`` and ``flags``).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import Internal

PINNED = ("lark==1.2.2",)
"""What pyproject.toml pins, and these internals were checked with."""

RELIES_ON = (
    Internal(
        "lark.load_grammar:load_grammar",
        ("grammar", "source", "import_paths", "global_keep_all_tokens"),
    ),
    Internal("lark.load_grammar:Grammar.compile", ("self", "start", "terminals_to_keep")),
    Internal("lark.grammar:Rule.origin"),
    Internal("lark.grammar:Rule.expansion"),
    Internal("lark.lexer:TerminalDef.name", on_instances=True),
    Internal("lark.lexer:TerminalDef.pattern", on_instances=True),
)
"""The names above, for tests/test_pinned_libraries.py."""


@dataclass(frozen=True)
class Terminal:
    name: str
    regex: bool
    """True: ``value`` is a regular expression; False: a literal string."""
    value: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class Rule:
    origin: str
    expansion: tuple[tuple[bool, str], ...]
    """Its symbols in order: (is a terminal, name)."""


@dataclass(frozen=True)
class CompiledGrammar:
    terminals: dict[str, Terminal]
    rules: tuple[Rule, ...]
    ignored: tuple[str, ...]


class GrammarError(Exception):
    """The definition is not a valid lark grammar with a ``start`` rule."""


def compile(definition: str) -> CompiledGrammar:
    """``definition`` loaded and compiled from its ``start`` rule, as lark does before
    building a parser (imports: lark's bundled ``common`` grammar only).

    Raises:
        GrammarError: it does not load or compile (the message says why).
    """
    from lark.exceptions import LarkError
    from lark.load_grammar import load_grammar

    try:
        grammar, _ = load_grammar(definition, "<custom tool>", None, False)  # type: ignore[no-untyped-call]
        terminals, rules, ignored = grammar.compile(["start"], set())
    except LarkError as error:
        raise GrammarError(str(error)) from None
    return CompiledGrammar(
        terminals={
            t.name: Terminal(
                t.name,
                type(t.pattern).__name__ == "PatternRE",
                str(t.pattern.value),
                tuple(str(flag) for flag in t.pattern.flags),
            )
            for t in terminals
        },
        rules=tuple(
            Rule(
                str(rule.origin.name),
                tuple((bool(s.is_term), str(s.name)) for s in rule.expansion),
            )
            for rule in rules
        ),
        ignored=tuple(str(name) for name in ignored),
    )


__all__ = ["CompiledGrammar", "GrammarError", "Rule", "Terminal", "compile"]
