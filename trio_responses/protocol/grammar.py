"""Custom tools' input grammars: checking a client's ``lark`` or ``regex`` definition.

A custom tool (``{"type": "custom", "format": {"type": "grammar", …}}``) gives the
grammar its input must follow; the vLLM engine constrains the call's body to it
and the scripted engine writes an instance of it (`engine.grammar_instance`).
`check_grammar` refuses a definition that is too large (`MAX_DEFINITION_CHARS`)
or does not compile, naming ``tools[i].format.definition``. Compiling costs
milliseconds, so request parsing, which calls it, runs off the event loop for
any request carrying a grammar (`grammar_cost`).

A lark definition is compiled the way lark does before building a parser
(`_adapters.lark_grammar`), not turned into a ``lark.Lark``: lark's parsers refuse
terminals that may be empty (``/(.*)/`` in Codex's ``apply_patch`` grammar), which
vLLM's grammar engines accept. `matches` uses a lark parser where lark can build one.

Sans-IO: no trio, quart or vLLM here; ``lark`` is imported on first use.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .._adapters import lark_grammar
from .._exceptions import InvalidRequestError

GrammarSyntax = Literal["lark", "regex"]

MAX_DEFINITION_CHARS = 32 * 1024
"""The longest grammar definition accepted (Codex's ``apply_patch`` grammar is
about 1,500 characters): parsing one costs time in its size and rules."""

GRAMMAR_COST_BYTES = 256 * 1024
"""What a request with a grammar counts as for `_offload.offload` (more than its
inline size): compiling a lark grammar takes milliseconds, not microseconds."""


@dataclass(frozen=True)
class Grammar:
    """A checked custom-tool grammar: what an engine constrains a call's input to."""

    syntax: GrammarSyntax
    definition: str


def check_grammar(syntax: GrammarSyntax, definition: str, *, param: str, name: str) -> Grammar:
    """Raise `InvalidRequestError` (naming ``param``) unless ``definition`` is a valid
    grammar of ``syntax`` within `MAX_DEFINITION_CHARS`; else the `Grammar`."""
    if len(definition) > MAX_DEFINITION_CHARS:
        raise InvalidRequestError(
            f"The grammar of custom tool {name!r} is {len(definition)} characters long; "
            f"this server accepts at most {MAX_DEFINITION_CHARS}.",
            param=param,
            code="invalid_value",
        )
    if not definition.strip():
        raise InvalidRequestError(
            f"The grammar of custom tool {name!r} is empty.", param=param, code="invalid_value"
        )
    try:
        if syntax == "lark":
            compiled_lark(definition)
        else:
            compiled_regex(definition)
    except InvalidGrammar as error:
        raise InvalidRequestError(
            f"Invalid {syntax} grammar for custom tool {name!r}: {error}",
            param=param,
            code="invalid_grammar",
        ) from None
    return Grammar(syntax, definition)


class InvalidGrammar(Exception):
    """A definition that does not compile (the message says why, in one line)."""


@functools.lru_cache(maxsize=32)
def compiled_lark(definition: str) -> lark_grammar.CompiledGrammar:
    """A lark definition compiled from its ``start`` rule, with every regex terminal
    checked by Python's ``re``.

    Remembered: a client sends the same grammar (Codex's ``apply_patch``) on every
    request, and the scripted engine walks it for its instances.

    Raises:
        InvalidGrammar: the definition does not compile.
    """
    try:
        compiled = lark_grammar.compile(definition)
    except lark_grammar.GrammarError as error:
        raise InvalidGrammar(_one_line(str(error))) from None
    except (re.error, RecursionError, ValueError, KeyError, AssertionError, TypeError) as error:
        # lark reports some malformed definitions with plain exceptions.
        raise InvalidGrammar(_one_line(f"{type(error).__name__}: {error}")) from None
    if not any(rule.origin == "start" for rule in compiled.rules):
        raise InvalidGrammar("The grammar has no 'start' rule.")
    for terminal in _regex_terminals(compiled.terminals):
        compiled_regex(terminal)
    return compiled


def _regex_terminals(terminals: Mapping[str, lark_grammar.Terminal]) -> list[str]:
    return [t.value for t in terminals.values() if t.regex]


@functools.lru_cache(maxsize=32)
def lark_parser(definition: str) -> Any:
    """lark's own Earley parser of a definition, or None where lark cannot build one
    (a terminal that may be empty, which lark's parsers refuse)."""
    from lark import Lark
    from lark.exceptions import LarkError

    try:
        return Lark(definition, start="start", parser="earley")
    except (LarkError, re.error, RecursionError, ValueError, KeyError, AssertionError):
        return None


@functools.lru_cache(maxsize=32)
def compiled_regex(definition: str) -> re.Pattern[str]:
    """A regex definition compiled by Python's ``re``.

    Raises:
        InvalidGrammar: it does not compile.
    """
    try:
        return re.compile(definition)
    except (re.error, RecursionError, OverflowError) as error:
        raise InvalidGrammar(_one_line(str(error))) from None


def matches(grammar: Grammar, text: str) -> bool | None:
    """Whether ``text`` is in the language of ``grammar`` (the whole text); None when
    it cannot tell.

    A lark grammar lark cannot build a parser for (terminals that may be empty) is
    read by `recognizes`, a small Earley recognizer whose regex terminals match
    greedily (one length at each position): enough for line-based grammars such as
    Codex's ``apply_patch``.
    """
    if grammar.syntax == "regex":
        return compiled_regex(grammar.definition).fullmatch(text) is not None
    from lark.exceptions import LarkError

    parser = lark_parser(grammar.definition)
    if parser is None:
        return recognizes(compiled_lark(grammar.definition), text)
    try:
        parser.parse(text)
    except LarkError:
        return False
    return True


MAX_RECOGNIZED_CHARS = 64 * 1024
"""The longest text `recognizes` reads."""

MAX_EARLEY_ITEMS = 200_000
"""The most chart items `recognizes` builds before it gives up (None)."""


def recognizes(grammar: lark_grammar.CompiledGrammar, text: str) -> bool | None:
    """Whether ``text`` derives from ``start`` (an Earley recognizer with the empty
    rules handled as Aycock and Horspool do); None when it cannot tell: ignored
    terminals, or more text or work than its bounds."""
    if grammar.ignored or len(text) > MAX_RECOGNIZED_CHARS:
        return None
    expansions: dict[str, list[tuple[tuple[bool, str], ...]]] = {}
    for rule in grammar.rules:
        expansions.setdefault(rule.origin, []).append(rule.expansion)
    nullable: set[str] = set()
    changed = True
    while changed:
        changed = False
        for origin, options in expansions.items():
            if origin not in nullable and any(
                all(not term and name in nullable for term, name in option) for option in options
            ):
                nullable.add(origin)
                changed = True
    patterns = {
        name: compiled_regex(t.value) if t.regex else None for name, t in grammar.terminals.items()
    }
    literals = {name: t.value for name, t in grammar.terminals.items()}
    Item = tuple[str, int, int, int]  # origin, expansion, dot, start
    charts: list[set[Item]] = [set() for _ in range(len(text) + 1)]
    pending: list[list[Item]] = [[] for _ in range(len(text) + 1)]
    built = 0

    def add(position: int, item: Item) -> None:
        nonlocal built
        if item not in charts[position]:
            charts[position].add(item)
            pending[position].append(item)
            built += 1

    for index in range(len(expansions.get("start", []))):
        add(0, ("start", index, 0, 0))
    for position in range(len(text) + 1):
        agenda = pending[position]
        while agenda:
            if built > MAX_EARLEY_ITEMS:
                return None
            origin, index, dot, start = agenda.pop()
            option = expansions[origin][index]
            if dot == len(option):
                for waiting in list(charts[start]):
                    w_origin, w_index, w_dot, w_start = waiting
                    w_option = expansions[w_origin][w_index]
                    if w_dot < len(w_option) and w_option[w_dot] == (False, origin):
                        add(position, (w_origin, w_index, w_dot + 1, w_start))
                continue
            is_term, name = option[dot]
            if not is_term:
                for next_index in range(len(expansions.get(name, []))):
                    add(position, (name, next_index, 0, position))
                if name in nullable:
                    add(position, (origin, index, dot + 1, start))
                continue
            pattern = patterns.get(name)
            if pattern is None:
                literal = literals.get(name, "")
                end = position + len(literal) if text.startswith(literal, position) else -1
            else:
                found = pattern.match(text, position)
                end = found.end() if found is not None else -1
            if end >= position:
                add(end, (origin, index, dot + 1, start))
    return any(
        origin == "start" and start == 0 and dot == len(expansions[origin][index])
        for origin, index, dot, start in charts[len(text)]
    )


def grammar_cost(body: Any) -> int:
    """`GRAMMAR_COST_BYTES` when a raw request body offers a custom tool with a grammar
    (so validating it runs off the loop), else 0."""
    tools = body.get("tools") if isinstance(body, Mapping) else None
    if not isinstance(tools, list):
        return 0
    for tool in tools:
        fmt = tool.get("format") if isinstance(tool, Mapping) else None
        if isinstance(fmt, Mapping) and fmt.get("type") == "grammar":
            return GRAMMAR_COST_BYTES
    return 0


def _one_line(message: str) -> str:
    text = " ".join(message.split())
    return (text if len(text) <= 300 else text[:299] + "…").rstrip(".") + "."


__all__ = [
    "GRAMMAR_COST_BYTES",
    "MAX_DEFINITION_CHARS",
    "Grammar",
    "InvalidGrammar",
    "check_grammar",
    "compiled_lark",
    "grammar_cost",
    "lark_parser",
    "matches",
    "recognizes",
]
