"""The scripted model's sentences of custom tools' grammars, and the grammar checks."""

from __future__ import annotations

import re

import pytest
from lark import Lark

from tests.api.test_custom_tools import APPLY_PATCH_GRAMMAR, PATCH
from trio_responses._exceptions import InvalidRequestError
from trio_responses.engine.grammar_instance import NoInstance, grammar_instance
from trio_responses.protocol.grammar import (
    MAX_DEFINITION_CHARS,
    Grammar,
    check_grammar,
    matches,
)

LARK_GRAMMARS = [
    'start: "hello" WS NAME\n%import common.WS\n%import common.CNAME -> NAME',
    'start: expr\nexpr: NUMBER | expr "+" expr | "(" expr ")"\n%import common.NUMBER',
    'start: item+\nitem: "a" | "b" item\n',
    'start: pair ("," pair)*\npair: KEY "=" VALUE\nKEY: /[a-z]+/\nVALUE: /[0-9]{2}/',
    'start: /(.+)/ "\\n"',
]

REGEXES = [r"[A-Z]{3}-\d{2,4}", r"(yes|no)", r"\w+@\w+\.com", r"a*b+c?", r"[^a-z]\s\S"]


@pytest.mark.parametrize("definition", LARK_GRAMMARS)
def test_a_lark_sentence_parses(definition: str) -> None:
    grammar = check_grammar("lark", definition, param="p", name="t")
    text = grammar_instance(grammar)
    Lark(definition, start="start").parse(text)
    assert matches(grammar, text) is True


@pytest.mark.parametrize("pattern", REGEXES)
def test_a_regex_sentence_matches_whole(pattern: str) -> None:
    grammar = check_grammar("regex", pattern, param="p", name="t")
    assert re.fullmatch(pattern, grammar_instance(grammar))


def test_a_grammar_lark_cannot_parse_is_accepted_written_and_read() -> None:
    # lark's parsers refuse the empty terminal; our recognizer reads it.
    grammar = check_grammar("lark", 'start: "<" /([^>]*)/ ">"', param="p", name="t")
    assert re.fullmatch(r"<[^>]+>", grammar_instance(grammar))
    assert matches(grammar, "<x>") is True
    assert matches(grammar, "<>") is True
    assert matches(grammar, "<x") is False


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PATCH, True),
        (PATCH.removesuffix("\n"), True),
        ("*** Begin Patch\n*** Add File: a\n+\n*** End Patch\n", True),
        ("*** Begin Patch\n*** Update File: a.py\n@@ def f\n-x\n+y\n \n*** End Patch", True),
        ("*** Begin Patch\n*** Delete File: a\n*** Move to: b\n*** End Patch", False),
        ("*** Begin Patch\n*** End Patch\n", False),
        ("not a patch", False),
    ],
)
def test_codex_apply_patch_grammar_is_read(text: str, expected: bool) -> None:
    grammar = check_grammar("lark", APPLY_PATCH_GRAMMAR, param="p", name="apply_patch")
    assert matches(grammar, text) is expected
    assert matches(grammar, grammar_instance(grammar)) is True


@pytest.mark.parametrize(
    ("syntax", "definition", "message"),
    [
        ("lark", "start: undefined_rule", "Rule 'undefined_rule' used but not defined"),
        ("lark", 'other: "a"', "start"),
        ("lark", "start: /[/", "Invalid lark grammar"),
        ("lark", "   ", "is empty"),
        ("regex", "(a", "missing )"),
        ("lark", "start: " + '"a" ' * MAX_DEFINITION_CHARS, "at most 32768"),
    ],
)
def test_a_bad_grammar_is_refused(syntax: str, definition: str, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape(message)) as caught:
        check_grammar(syntax, definition, param="tools[0].format.definition", name="t")  # type: ignore[arg-type]
    assert caught.value.param == "tools[0].format.definition"


def test_a_regex_beyond_the_simple_subset_has_no_sentence() -> None:
    with pytest.raises(NoInstance):
        grammar_instance(Grammar("regex", r"(?=x)y"))
