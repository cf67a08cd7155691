"""Output tokens -> Responses events, incrementally."""

from __future__ import annotations

from typing import Any

import pytest
from openai_harmony import StreamableParser

from tests.support import check_stream
from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.translator import MalformedOutput, TurnTranslator
from trio_responses.protocol.builder import ResponseBuilder, request_echo
from trio_responses.protocol.codec import decode_event
from trio_responses.protocol.request import parse_create_request


def _tokens(text: str) -> list[int]:
    tokens: list[int] = get_encoding().encode(text, allowed_special="all")
    return tokens


def _translator() -> tuple[TurnTranslator, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    builder = ResponseBuilder(
        response_id="resp_t",
        model="m",
        created_at=0.0,
        echo=request_echo(parse_create_request({"model": "m"})),
        background=False,
        emit=lambda frame: events.append(decode_event(frame)),
    )
    builder.start()
    builder.mark_in_progress()
    return TurnTranslator(builder), events


def _finish(translator: TurnTranslator, events: list[dict[str, Any]], reason: str = "stop") -> str:
    outcome = translator.finish(reason)  # type: ignore[arg-type]
    translator._builder.finish("completed", now=1.0)
    check_stream(events)
    return outcome.kind


def test_reasoning_then_final_answer() -> None:
    translator, events = _translator()
    translator.feed(
        _tokens(
            "<|channel|>analysis<|message|>Let me think.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Answer: 42<|return|>"
        )
    )
    assert translator.done
    assert _finish(translator, events) == "final"
    output = events[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert output[0]["content"][0]["text"] == "Let me think."
    assert output[1]["content"][0]["text"] == "Answer: 42"
    assert translator.reasoning_tokens == len(_tokens("Let me think."))


def test_function_call_ends_the_turn_with_a_call() -> None:
    translator, events = _translator()
    translator.feed(
        _tokens(
            "<|channel|>commentary to=functions.lookup <|constrain|>json"
            '<|message|>{"q":"x"}<|call|>'
        )
    )
    outcome = translator.finish("stop")
    assert outcome.kind == "tool_call" and outcome.call is not None
    assert outcome.call.recipient == "functions.lookup"
    assert outcome.call.arguments == '{"q":"x"}'
    item = events[-1]["item"]
    assert item["type"] == "function_call" and item["name"] == "lookup"


def test_multi_token_characters_are_not_split() -> None:
    text = "naïve café — \U0001d518\U0001d52b\U0001d526 🙂 日本語"
    translator, events = _translator()
    translator.feed(_tokens(f"<|channel|>final<|message|>{text}<|return|>"))
    _finish(translator, events)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == text
    assert all("\ufffd" not in delta for delta in deltas)


def test_truncated_inside_a_header_has_no_item() -> None:
    translator, events = _translator()
    translator.feed(_tokens("<|channel|>analysis")[:2])
    assert _finish(translator, events, "length") == "truncated"
    assert events[-1]["response"]["output"] == []


def test_truncated_inside_content_closes_the_item_incomplete() -> None:
    translator, events = _translator()
    translator.feed(_tokens("<|channel|>final<|message|>partial answer"))
    assert _finish(translator, events, "length") == "truncated"
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"


def test_malformed_tokens_raise() -> None:
    translator, _ = _translator()
    with pytest.raises(MalformedOutput, match="invalid harmony"):
        translator.feed(_tokens("<|channel|>final<|message|>hi<|end|>oops"))


def test_unknown_recipient_raises() -> None:
    translator, _ = _translator()
    with pytest.raises(MalformedOutput, match="not a tool of this request"):
        translator.feed(_tokens("<|channel|>commentary to=nowhere.tool<|message|>{}<|call|>"))


def test_parser_state_and_messages_are_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both re-serialise the whole message per access: reading them per token is quadratic."""

    def forbidden(self: StreamableParser) -> None:
        raise AssertionError("StreamableParser.state/messages must not be read")

    monkeypatch.setattr(StreamableParser, "state", property(forbidden))
    monkeypatch.setattr(StreamableParser, "messages", property(forbidden))
    monkeypatch.setattr(StreamableParser, "state_data", property(forbidden))
    monkeypatch.setattr(StreamableParser, "current_content", property(forbidden))
    translator, events = _translator()
    # A tab in the header: the Rust parser reads this turn (see StreamParser).
    translator.feed(_tokens("<|channel|>final\t<|message|>𠜎" + " word" * 3000 + "<|return|>"))
    assert translator._parser.handed_over
    _finish(translator, events)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 3001
