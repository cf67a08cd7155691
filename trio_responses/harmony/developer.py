"""Rendering the developer message in bounded tokenizer calls.

Harmony renders a developer message (instructions, then each tool namespace
with its tools described as TypeScript) as one text that it encodes in one
call: a 300,000-character instruction held the GIL for 41 s. Harmony encodes
exactly that text, so the same tokens come from its text encoded in bounded
segments (`long_text.encode_text`) — if the text can be had without encoding
the large parts.

It can: the message is first rendered as a *skeleton*, in which the
instructions and every large tool or namespace description are replaced by
short markers (private-use characters that occur nowhere in the content).
Each large part's own text is what it renders to next to a marker's: the part
is rendered alone (a namespace holding just that tool), once as itself and
once as its marker, and the two texts differ only where the part is. Harmony
writes the instructions as they are. One call then costs at most one tool's
rendering, and a tool's size is bounded (`MAX_TOOL_CHARS`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from openai_harmony import (
    DeveloperContent,
    Message,
    RenderOptions,
    Role,
    ToolDescription,
    ToolNamespaceConfig,
)

from .._exceptions import InvalidRequestError
from .encoding import get_encoding
from .long_text import MAX_RUN_CHARS, encode_text, unbroken

SMALL_CHARS = 512
"""Tools and descriptions up to this size are rendered in the skeleton itself."""

MAX_TOOL_CHARS = 64 * 1024
"""The largest tool (name, description and parameters' JSON) or namespace
description, rendered in one call: at most about 25 ms (prose in every
parameter's description; a schema of numbers takes a few)."""

MAX_TOOL_RUN_CHARS = 512
"""The most characters in a row without a piece boundary in a tool's texts (a word of
512 letters, say): more is refused, as byte-pair encoding is quadratic in it."""

_WHOLE_CHARS = MAX_RUN_CHARS
"""A developer message whose content is up to this size is rendered by harmony at once."""


def render_developer(content: DeveloperContent, options: RenderOptions) -> list[int]:
    """``get_encoding().render(developer message of content, options)``, in bounded calls.

    Raises:
        InvalidRequestError: a tool is larger than `MAX_TOOL_CHARS`, or one of its
            texts has more than `MAX_TOOL_RUN_CHARS` characters without a space
            (byte-pair encoding is quadratic in such a run).
    """
    encoding = get_encoding()
    serialized = content.model_dump_json()
    if len(serialized) <= _WHOLE_CHARS:
        return encoding.render(_message(content), options)
    markers = _markers(serialized)
    instructions_marker = next(markers) if content.instructions else None
    replacements: list[tuple[str, str]] = []
    namespaces: dict[str, ToolNamespaceConfig] = {}
    for name, namespace in (content.tools or {}).items():
        description = namespace.description
        if description is not None and len(description) > SMALL_CHARS:
            marker = next(markers)
            replacements.append(_namespace_text(namespace, marker, options))
            description = marker
        tools: list[ToolDescription] = []
        for tool in namespace.tools:
            if _size(tool) > SMALL_CHARS:
                _check(tool)
                marker = next(markers)
                stand_in = ToolDescription.new(tool.name, marker)
                replacements.append(_tool_text(namespace, tool, stand_in, options))
                tool = stand_in
            tools.append(tool)
        namespaces[name] = namespace.model_copy(update={"description": description, "tools": tools})
    skeleton = DeveloperContent(instructions=instructions_marker, tools=namespaces or None)
    text = _text(skeleton, options)
    for marked, real in replacements:
        text = _replace_once(text, marked, real)
    if instructions_marker is not None:
        text = _replace_once(text, instructions_marker, content.instructions or "")
    frame = encoding.render(_message(DeveloperContent.new()), options)
    return [*frame[:-1], *encode_text(text), frame[-1]]


def _message(content: DeveloperContent) -> Message:
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _text(content: DeveloperContent, options: RenderOptions) -> str:
    """The text harmony encodes for a developer message of ``content``."""
    encoding = get_encoding()
    tokens = encoding.render(_message(content), options)
    # <|start|>developer<|message|> ... <|end|>: the text sits between the
    # frame's tokens, which an empty message shows.
    frame = encoding.render(_message(DeveloperContent.new()), options)
    return encoding.decode(tokens[len(frame) - 1 : -1])


def _tool_text(
    namespace: ToolNamespaceConfig,
    tool: ToolDescription,
    stand_in: ToolDescription,
    options: RenderOptions,
) -> tuple[str, str]:
    """The stand-in's text and the tool's, each alone in its namespace."""
    alone = namespace.model_copy(update={"description": None, "tools": [tool]})
    marked = namespace.model_copy(update={"description": None, "tools": [stand_in]})
    return _difference(_text(_content(alone), options), _text(_content(marked), options))


def _namespace_text(
    namespace: ToolNamespaceConfig, marker: str, options: RenderOptions
) -> tuple[str, str]:
    """The marker's text and the namespace description's, in an empty namespace."""
    description = namespace.description or ""
    if len(description) > MAX_TOOL_CHARS:
        raise InvalidRequestError(
            f"The description of tool namespace {namespace.name!r} is {len(description)} "
            f"characters long; at most {MAX_TOOL_CHARS} are allowed.",
            param="tools",
            code="string_above_max_length",
        )
    if unbroken(description, MAX_TOOL_RUN_CHARS):
        raise _refused(f"The description of tool namespace {namespace.name!r}")
    empty = ToolDescription.new("tool", "")
    real = namespace.model_copy(update={"tools": [empty]})
    marked = namespace.model_copy(update={"description": marker, "tools": [empty]})
    return _difference(_text(_content(real), options), _text(_content(marked), options))


def _content(namespace: ToolNamespaceConfig) -> DeveloperContent:
    return DeveloperContent(tools={namespace.name: namespace})


def _difference(real: str, marked: str) -> tuple[str, str]:
    """Where two texts differ: (the marked text's part, the real text's part)."""
    prefix = 0
    limit = min(len(real), len(marked))
    while prefix < limit and real[prefix] == marked[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and real[-1 - suffix] == marked[-1 - suffix]:
        suffix += 1
    return marked[prefix : len(marked) - suffix], real[prefix : len(real) - suffix]


def _replace_once(text: str, stand_in: str, real: str) -> str:
    at = text.find(stand_in)
    if at < 0:  # harmony rendered a part differently in the skeleton
        raise RuntimeError("developer message skeleton lost a marker")
    return text[:at] + real + text[at + len(stand_in) :]


def _markers(serialized: str) -> Iterator[str]:
    """Unique short strings of a private-use character absent from ``serialized``
    (JSON: characters outside ASCII appear as themselves)."""
    delimiter = next(chr(c) for c in range(0xE000, 0xF900) if chr(c) not in serialized)
    number = 0
    while True:
        yield f"{delimiter}{number}{delimiter}"
        number += 1


def _size(tool: ToolDescription) -> int:
    # A size bound, not a body: measured as Python's json writes it (what the bounds assume).
    parameters = json.dumps(tool.parameters) if tool.parameters is not None else ""
    return len(tool.name) + len(tool.description) + len(parameters)


def _check(tool: ToolDescription) -> None:
    """Refuse a tool too large to render in one call, or with a quadratic run."""
    if _size(tool) > MAX_TOOL_CHARS:
        raise InvalidRequestError(
            f"The definition of tool {tool.name!r} is {_size(tool)} characters long "
            f"(description and parameters); at most {MAX_TOOL_CHARS} are allowed.",
            param="tools",
            code="string_above_max_length",
        )
    texts = [tool.description, *_strings(tool.parameters)]
    if any(unbroken(text, MAX_TOOL_RUN_CHARS) for text in texts):
        raise _refused(f"The definition of tool {tool.name!r}")


def _refused(what: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{what} holds a run of more than {MAX_TOOL_RUN_CHARS} characters without a "
        "space or line break; break it up.",
        param="tools",
        code="invalid_value",
    )


def _strings(value: object) -> Iterator[str]:
    """Every string in a decoded JSON value, keys included."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for key, child in item.items():
                yield str(key)
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)
