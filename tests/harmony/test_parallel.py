"""`NextCallGate`: a continuation's output is shown only when it is another client call."""

from __future__ import annotations

import pytest

from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.parallel import Declined, NextCallGate, continuation


def _tokens(text: str) -> list[int]:
    return get_encoding().encode(text, allowed_special="all")


CALL = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}<|call|>"


def _gate(max_held: int = 128) -> tuple[NextCallGate, list[int]]:
    shown: list[int] = []
    return NextCallGate(
        shown.extend, lambda r: r.startswith("functions."), max_held=max_held
    ), shown


def test_a_call_is_shown_whole() -> None:
    gate, shown = _gate()
    for token in _tokens(CALL):
        gate.feed([token])
    assert gate.accepted
    assert shown == _tokens(CALL)


def test_a_short_analysis_before_the_call_is_shown_with_it() -> None:
    gate, shown = _gate()
    text = "<|channel|>analysis<|message|>Also Oslo.<|end|><|start|>assistant" + CALL
    gate.feed(_tokens(text))
    assert gate.accepted
    assert shown == _tokens(text)


@pytest.mark.parametrize(
    "text",
    [
        "<|channel|>final<|message|>Done.<|return|>",
        "<|channel|>commentary<|message|>Let me check.<|end|>",
        "<|channel|>analysis to=python code<|message|>print(1)<|call|>",
        "<|channel|>analysis<|message|>Nothing more.<|return|>",
        "<|return|>",
    ],
)
def test_anything_else_is_declined_and_not_shown(text: str) -> None:
    gate, shown = _gate()
    with pytest.raises(Declined) as declined:
        for token in _tokens(text):
            gate.feed([token])
    assert shown == []
    assert declined.value.held > 0
    assert not gate.accepted


def test_a_long_analysis_is_declined() -> None:
    gate, shown = _gate(max_held=16)
    with pytest.raises(Declined):
        gate.feed(_tokens("<|channel|>analysis<|message|>" + "word " * 40))
    assert shown == []


def test_the_continuation_prompt_opens_an_assistant_message() -> None:
    prompt = continuation([1, 2], [3])
    assert prompt[:3] == [1, 2, 3]
    assert get_encoding().decode(prompt[3:]) == "<|start|>assistant"
