"""`StreamParser` answers as openai_harmony's `StreamableParser`, token for token."""

from __future__ import annotations

import random

import pytest
from openai_harmony import HarmonyError, Role, StreamableParser

from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.stream_parser import StreamParser

Trace = list[tuple[str | None, str | None, str | None] | tuple[str, int]]


def _tokens(text: str) -> list[int]:
    tokens: list[int] = get_encoding().encode(text, allowed_special="all")
    return tokens


def _trace(parser: StreamableParser | StreamParser, tokens: list[int]) -> Trace:
    """What the parser answers after each token, up to the error it raises if any."""
    trace: Trace = []
    for index, token in enumerate(tokens):
        try:
            parser.process(token)
        except HarmonyError:
            trace.append(("error", index))
            break
        trace.append((parser.last_content_delta, parser.current_channel, parser.current_recipient))
    return trace


def _trace_rust(tokens: list[int]) -> Trace:
    return _trace(StreamableParser(get_encoding(), Role.ASSISTANT), tokens)


def _trace_ours(tokens: list[int]) -> tuple[Trace, bool]:
    parser = StreamParser()
    return _trace(parser, tokens), parser.handed_over


# What gpt-oss writes: the parser must read these itself, never handing over.
COMMON = [
    "<|channel|>final<|message|>Hello there.<|return|>",
    "<|channel|>analysis<|message|>We think.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Answer: 42<|return|>",
    "<|channel|>analysis<|message|>Need weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>',
    '<|channel|>commentary to=functions.lookup<|constrain|>json<|message|>{"q": 1}<|call|>',
    ' to=functions.get_weather<|channel|>commentary json<|message|>{"a":1}<|call|>',
    "<|channel|>analysis<|message|>a<|end|>"
    "<|start|>assistant to=python<|channel|>commentary<|message|>print(1)<|call|>",
    "<|channel|>analysis<|message|>look<|end|>"
    "<|start|>assistant<|channel|>analysis to=browser.search code"
    '<|message|>{"query": "trio"}<|call|>',
    "<|channel|>commentary to=docs.search_docs <|constrain|>json<|message|>{}<|call|>",
    "<|channel|>commentary<|message|>Calling a tool next.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>done<|return|>",
    "<|channel|>final<|message|><|end|><|start|>assistant<|channel|>final<|message|>x<|return|>",
    "<|channel|>final<|message|>日本語のテキスト, héllo wörld 😀<|return|>",
    "<|channel|>final<|message|>" + "long text " * 50 + "<|return|>",
    "<|channel|>final<|message|>x<|return|><|start|>assistant<|channel|>final<|message|>y",
    # Special tokens inside content are text, as in harmony.
    "<|channel|>final<|message|>text <|channel|> inside<|return|>",
    "<|channel|>final<|message|>x<|endoftext|>y<|return|>",
]

# Forms it hands over to the Rust parser: the answers must still be the same.
UNUSUAL = [
    "<|start|>assistant<|channel|>final<|message|>hi<|return|>",
    "hello<|end|>",
    "<|channel|>final<|message|>hi<|end|>stray<|start|>assistant<|channel|>final<|message|>x<|return|>",
    "<|channel|>analysis<|message|>a<|end|><|start|>user<|message|>x<|end|>",
    "<|channel|>final<|message|>rare 𠜎𠜱 ሰላም 🧑‍🚀 split characters<|return|>",
    "<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>final<|message|>𠜎<|return|>",
    "<|channel|><|message|>x<|end|>",
    "<|channel|>final <|channel|>analysis<|message|>x<|end|>",
    "<|channel|>commentary to=to=functions.x<|message|>{}<|call|>",
    "<|channel|>commentary a b c<|message|>{}<|call|>",
    "<|channel|>commentary\tto=functions.x<|message|>{}<|call|>",
    "<|channel|>final<|constrain|>a<|constrain|>b<|message|>x<|end|>",
    "<|channel|>fïnal<|message|>x<|end|>",
    "<|start|><|start|>",
]


@pytest.mark.parametrize("text", COMMON)
def test_common_turns_are_read_without_the_rust_parser(text: str) -> None:
    tokens = _tokens(text)
    ours, handed_over = _trace_ours(tokens)
    assert ours == _trace_rust(tokens)
    assert not handed_over


@pytest.mark.parametrize("text", UNUSUAL)
def test_unusual_turns_are_read_by_the_rust_parser(text: str) -> None:
    tokens = _tokens(text)
    ours, handed_over = _trace_ours(tokens)
    assert ours == _trace_rust(tokens)
    assert handed_over


def test_a_hand_over_replays_the_current_header_only() -> None:
    # A long message, then a header the fast path leaves to the Rust parser (a tab):
    # the replay is that header, not the turn.
    head = _tokens("<|channel|>analysis<|message|>" + " word" * 5000 + "<|end|>")
    header = _tokens("<|start|>assistant<|channel|>final\t<|message|>")
    tokens = head + header + _tokens("done<|return|>")
    ours, handed_over = _trace_ours(tokens)
    assert ours == _trace_rust(tokens)
    assert handed_over
    parser = StreamParser()
    for token in head + header:
        parser.process(token)
    assert parser._rust is not None and len(parser._rust.tokens) == len(header)


def test_a_split_character_replays_the_message_header_only() -> None:
    # Long content of whole tokens, then a character split across tokens: the Rust
    # parser gets the header and the split token, not the content before it.
    header = _tokens("<|channel|>final<|message|>")
    content = _tokens(" word" * 5000)
    split = _tokens("𠜎")
    tokens = header + content + split + _tokens(" and more<|return|>")
    ours, handed_over = _trace_ours(tokens)
    assert ours == _trace_rust(tokens)
    assert handed_over
    parser = StreamParser()
    for token in header + content + split[:1]:
        parser.process(token)
    assert parser._rust is not None and len(parser._rust.tokens) == len(header) + 1


def test_channel_and_recipient_of_a_message() -> None:
    parser = StreamParser()
    for token in _tokens("<|channel|>commentary to=functions.f <|constrain|>json<|message|>"):
        parser.process(token)
    assert (parser.current_channel, parser.current_recipient) == ("commentary", "functions.f")
    for token in _tokens("{}<|call|>"):
        parser.process(token)
    assert (parser.current_channel, parser.current_recipient) == (None, None)


def test_random_token_soups_agree_with_the_rust_parser() -> None:
    pieces = [
        "<|start|>",
        "<|channel|>",
        "<|constrain|>",
        "<|message|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
        "<|endoftext|>",
        "assistant",
        "user",
        "tool",
        " ",
        "  ",
        "\t",
        "analysis",
        "commentary",
        "final",
        " to=",
        "to=",
        "functions.get_weather",
        "python",
        "json",
        " json",
        "x",
        "Hello, world.",
        "😀",
        "𠜎",
        "=",
        "<",
        "|",
        ".",
    ]
    chance = random.Random(12)
    handed = kept = 0
    for _ in range(3000):
        text = "".join(chance.choice(pieces) for _ in range(chance.randint(1, 14)))
        if chance.random() < 0.5:  # half of them start like a real turn
            text = chance.choice(COMMON[:3]).split("<|end|>")[0] + "<|end|>" + text
        tokens = _tokens(text)
        ours, handed_over = _trace_ours(tokens)
        assert ours == _trace_rust(tokens), text
        handed += handed_over
        kept += not handed_over
    # Both paths were exercised.
    assert handed > 300 and kept > 300
