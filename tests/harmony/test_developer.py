"""The developer message renders in bounded calls, with the tokens of one harmony render."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest
from openai_harmony import (
    DeveloperContent,
    Message,
    RenderOptions,
    Role,
    ToolDescription,
    ToolNamespaceConfig,
)

from trio_responses._exceptions import InvalidRequestError
from trio_responses.harmony import developer
from trio_responses.harmony.developer import MAX_TOOL_CHARS, render_developer
from trio_responses.harmony.encoding import get_encoding

_WORDS = [
    "word", "Word", " ", "\n", "\n\n", "\r\n", "don't", "123", ".", "/", "_", "é", "日本語",
    "\t", "<|end|>", "//", "*/", "\"", "'", "\\", "{", "}", "|", "e\u0301", "\u3000", "// x",
]  # fmt: skip


def _text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(_WORDS) for _ in range(size))


def _schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    kind = rng.choice(["string", "number", "integer", "boolean", "array", "object", "enum"])
    schema: dict[str, Any] = {"type": kind}
    if kind == "enum":
        schema = {"type": "string", "enum": [_text(rng, rng.randrange(1, 6)) for _ in range(3)]}
    elif kind == "array":
        schema["items"] = _schema(rng, depth + 1) if depth < 2 else {"type": "string"}
    elif kind == "object" and depth < 2:
        names = ["".join(rng.choices(string.ascii_letters, k=5)) for _ in range(rng.randrange(4))]
        schema["properties"] = {name: _schema(rng, depth + 1) for name in names}
        schema["required"] = names[:1]
    if rng.random() < 0.6:
        schema["description"] = _text(rng, rng.randrange(0, 30))
    if rng.random() < 0.2:
        schema["default"] = _text(rng, 3)
    return schema


def _tool(rng: random.Random, name: str) -> ToolDescription:
    parameters = _schema(rng) if rng.random() < 0.8 else None
    if parameters is not None:
        parameters = {"type": "object", "properties": {"a": parameters}}
    return ToolDescription.new(name, _text(rng, rng.randrange(0, 120)), parameters)


def _content(rng: random.Random) -> DeveloperContent:
    content = DeveloperContent.new()
    if rng.random() < 0.8:
        content = content.with_instructions(_text(rng, rng.randrange(1, 300)))
    if rng.random() < 0.7:
        content = content.with_function_tools(
            [_tool(rng, f"f{i}") for i in range(rng.randrange(1, 5))]
        )
    for n in range(rng.randrange(3)):
        description = _text(rng, rng.randrange(0, 80)) if rng.random() < 0.7 else None
        tools = [_tool(rng, f"t{i}") for i in range(rng.randrange(1, 4))]
        content = content.with_tools(
            ToolNamespaceConfig(name=f"ns{n}", description=description, tools=tools)
        )
    return content


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part goes through the skeleton, however short."""
    monkeypatch.setattr(developer, "SMALL_CHARS", 0)
    monkeypatch.setattr(developer, "_WHOLE_CHARS", 0)


@pytest.mark.usefixtures("small_parts")
@pytest.mark.parametrize("functions", [False, True])
def test_developer_messages_render_as_harmony_renders_them(functions: bool) -> None:
    rng = random.Random(3 + functions)
    encoding = get_encoding()
    options = RenderOptions(conversation_has_function_tools=functions)
    for _ in range(150):
        content = _content(rng)
        message = Message.from_role_and_content(Role.DEVELOPER, content)
        assert render_developer(content, options) == encoding.render(message, options)


def test_long_instructions_render_in_bounded_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    encoding = get_encoding()
    longest: list[int] = []
    original = type(encoding).encode

    def encode(self: Any, text: str, *args: Any, **kwargs: Any) -> list[int]:
        longest.append(len(text))
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(type(encoding), "encode", encode)
    instructions = "Follow these rules.\n" + "x" * 300_000 + "\nThe end."
    content = DeveloperContent.new().with_instructions(instructions)
    tokens = render_developer(content, RenderOptions())
    assert max(longest) <= 16_384 + 4_096
    assert instructions in encoding.decode(tokens)


def test_tools_too_large_or_with_unbroken_runs_are_refused() -> None:
    huge = ToolDescription.new("f", "word " * (MAX_TOOL_CHARS // 5 + 1))
    run = ToolDescription.new("g", "see: " + "a" * 10_000)
    for tool, code in ((huge, "string_above_max_length"), (run, "invalid_value")):
        content = DeveloperContent.new().with_function_tools([tool])
        with pytest.raises(InvalidRequestError) as raised:
            render_developer(content, RenderOptions())
        assert raised.value.code == code and raised.value.param == "tools"
