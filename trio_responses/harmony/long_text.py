"""Rendering message text in bounded tokenizer calls, around a remembered frame.

Harmony tokenizes a message in one call that holds the GIL: a 4 MB message
stops every other thread (the event loop included) for about half a second,
even when the render runs in a worker thread. Worse, byte-pair encoding is
quadratic in the length of one pre-tokenizer piece, and an unbroken run of
letters, spaces or punctuation is one piece: 32,768 repeated letters take
0.45 s, 100,000 take 4.5 s.

`render_message` renders a message of one text as the message's header,
then its text encoded segment by segment, then its end token. Segments
end only where the o200k pre-tokenizer ends a piece anyway (before a space
or tab that precedes a visible character, or after a line break that does),
so the tokens are exactly those of one call; the GIL is released between
calls. A stretch of more than `MAX_RUN_CHARS` characters with no such
boundary is the one exception: it is encoded in pieces of that length, which
decode to the same text but may differ from the canonical tokens at the cuts.
Such a stretch is rarely language (a run of one character, a blob of base64),
and bounding it is what keeps one request from freezing the server or
overflowing the tokenizer's stack (a million letters in one call panics it).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import regex  # type: ignore[import-untyped]
from openai_harmony import Author, Message, RenderOptions, Role, TextContent

from .encoding import get_encoding, special_tokens

SEGMENT_CHARS = 16_384
"""Text encoded per call, give or take the distance to the next piece boundary."""

MAX_RUN_CHARS = 2_048
"""Longest stretch without a piece boundary encoded in one call (about 5 ms)."""

# Positions where the o200k pre-tokenizer ends a piece whatever the text around
# them (no piece holds such a position, so encoding the text on either side of
# it separately gives the tokens of one call):
# - before a space or tab that precedes a visible character: it starts the next
#   word, number or punctuation piece, or is a piece of its own;
# - after a line break that precedes a visible character other than ``/``
#   (punctuation pieces swallow the line breaks and slashes that follow them);
# - after a letter, or a letter and marks, that precedes anything but a letter,
#   mark, space or apostrophe (a word piece ends there, unless a contraction such
#   as 's follows; marks after punctuation belong to the punctuation's piece);
# - after a digit that precedes anything but a digit or space (numbers are pieces
#   of at most three digits).
# The `regex` module has the Unicode classes of the tokenizer's own pattern.
_BOUNDARY = regex.compile(
    r"(?=[^\S\r\n]\S)|(?<=[\r\n])(?=[^\s/])"
    r"|(?=[^\s\p{L}\p{M}'])(?<=\p{L}\p{M}*)|(?<=\p{N})(?=[^\s\p{N}])"
)


def render_message(message: Message, options: RenderOptions) -> list[int]:
    """``get_encoding().render(message, options)``, in bounded steps for long text.

    A message of one text renders as its frame (the tokens of the same message
    with no text: header, ``<|message|>``, end token) around its text encoded
    as ordinary text. The frame depends only on the header, and rendering one
    costs harmony ~250 µs against ~2 µs to encode a short text, so frames are
    remembered (`_frame`). One difference from harmony's render, which refuses
    it: a lone surrogate in the text (possible in a tool's output; requests
    refuse them) is encoded as U+FFFD.
    """
    if len(message.content) != 1 or not isinstance(message.content[0], TextContent):
        return get_encoding().render(message, options)
    author = message.author
    frame = _frame(
        author.role.value,
        author.name,
        message.channel,
        message.recipient,
        message.content_type,
        options.conversation_has_function_tools,
    )
    if frame is None:
        return get_encoding().render(message, options)  # not the header/text/end layout
    tokens = list(frame[:-1])
    tokens.extend(encode_text(message.content[0].text))
    tokens.append(frame[-1])
    return tokens


@functools.lru_cache(maxsize=256)
def _frame(
    role: str,
    name: str | None,
    channel: str | None,
    recipient: str | None,
    content_type: str | None,
    has_function_tools: bool,
) -> tuple[int, ...] | None:
    """The tokens of a message with this header and no text, if they end with
    ``<|message|>`` and the end token (the layout `render_message` fills in).

    Headers name functions and tools, which tenants choose: the 256 most recent
    are kept (a header is a few dozen tokens).
    """
    empty = Message(
        author=Author(role=Role(role), name=name),
        content=[TextContent(text="")],
        channel=channel,
        recipient=recipient,
        content_type=content_type,
    )
    options = RenderOptions(conversation_has_function_tools=has_function_tools)
    frame = get_encoding().render(empty, options)
    if len(frame) < 2 or frame[-2] != special_tokens().message:
        return None
    return tuple(frame)


def encode_text(text: str) -> list[int]:
    """The tokens of ``text`` as ordinary text (special-token names included), one
    bounded tokenizer call at a time."""
    encoding = get_encoding()
    tokens: list[int] = []
    for segment in segments(text):
        tokens.extend(encoding.encode(segment, disallowed_special=()))
    return tokens


def segments(text: str) -> Iterator[str]:
    """``text`` cut into the segments `encode_text` encodes (they join to ``text``).

    Segments end at piece boundaries about every `SEGMENT_CHARS`. A stretch of
    more than `MAX_RUN_CHARS` with no boundary in it (a run of one character, a
    line of base64, text in a script without spaces) may be one piece, which
    byte-pair encoding handles in quadratic time and which can overflow the
    tokenizer's stack: it is cut every `MAX_RUN_CHARS` instead.
    """
    start = last = 0
    for boundary in _BOUNDARY.finditer(text):
        at = boundary.start()
        if at - last > MAX_RUN_CHARS:
            if last > start:
                yield text[start:last]
            yield from _cut(text, last, at)
            start = at
        elif at - start >= SEGMENT_CHARS:
            yield text[start:at]
            start = at
        last = at
    if len(text) - last > MAX_RUN_CHARS:
        if last > start:
            yield text[start:last]
        yield from _cut(text, last, len(text))
    elif len(text) > start:
        yield text[start:]


def unbroken(text: str, limit: int = MAX_RUN_CHARS) -> bool:
    """Whether ``text`` has more than ``limit`` characters in a row with no piece boundary."""
    last = 0
    for boundary in _BOUNDARY.finditer(text):
        if boundary.start() - last > limit:
            return True
        last = boundary.start()
    return len(text) - last > limit


def _cut(text: str, start: int, end: int) -> Iterator[str]:
    for cut in range(start, end, MAX_RUN_CHARS):
        yield text[cut : min(cut + MAX_RUN_CHARS, end)]
