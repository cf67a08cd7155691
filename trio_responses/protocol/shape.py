"""The shape of a create request, for a debug log line: what it asks for, never what it says.

`request_shape` names the model, counts the input items and tools by type, and
lists the flags and settings (``stream``, ``background``, ``text.format``…). No
text a client wrote reaches it but the model name, quoted with ``ascii`` and cut
short; instructions show as their length.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .request import CreateRequest

_MODEL_CHARS = 64
"""The most of a model name a shape shows."""


def request_shape(request: CreateRequest) -> str:
    """One line describing ``request`` without its content (see the module docstring)."""
    model = request.model
    shown = ascii(model[:_MODEL_CHARS]) + ("…" if len(model) > _MODEL_CHARS else "")
    parts = [f"model={shown}"]
    if isinstance(request.input, str):
        parts.append("input=text")
    else:
        parts.append(f"input={len(request.input)} items{_counts(request.input)}")
    if request.tools:
        parts.append(f"tools={len(request.tools)}{_counts(request.tools)}")
    choice = request.tool_choice
    parts.append(f"tool_choice={choice if isinstance(choice, str) else choice.type}")
    flags = [
        name
        for name, on in (
            ("stream", request.stream),
            ("background", request.background),
            ("store", request.store),
            ("parallel_tool_calls", request.parallel_tool_calls),
            ("previous_response_id", request.previous_response_id is not None),
            ("conversation", request.conversation is not None),
            ("metadata", request.metadata is not None),
        )
        if on
    ]
    parts.append("flags=" + (",".join(flags) or "none"))
    if request.instructions is not None:
        parts.append(f"instructions={len(request.instructions)} chars")
    if request.text is not None and request.text.format is not None:
        parts.append(f"text.format={request.text.format.type}")
    if request.reasoning is not None and request.reasoning.effort is not None:
        parts.append(f"reasoning.effort={request.reasoning.effort}")
    for name in ("max_output_tokens", "max_tool_calls", "temperature", "top_p"):
        value = getattr(request, name)
        if value is not None:
            parts.append(f"{name}={value}")
    parts.append(f"truncation={request.truncation}")
    if request.include:
        parts.append("include=" + ",".join(request.include))
    return " ".join(parts)


def _counts(things: Sequence[object]) -> str:
    """`` (message 2, function_call 1)``: how many of each ``type``, in order of first use."""
    # An item reference may leave out its type.
    counts = Counter(str(getattr(thing, "type", None) or "item_reference") for thing in things)
    return " (" + ", ".join(f"{kind} {count}" for kind, count in counts.items()) + ")"
