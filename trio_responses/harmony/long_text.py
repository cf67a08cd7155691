"""Rendering message text in bounded tokenizer calls, around a remembered frame.

Harmony tokenizes a message in one call that holds the GIL: a 4 MB message
stops every other thread (the event loop included) for about half a second,
even when the render runs in a worker thread. Worse, byte-pair encoding is
quadratic in the length of one pre-tokenizer piece, and an unbroken run of
letters, spaces or punctuation is one piece: 32,768 repeated letters take
0.45 s, 100,000 take 4.5 s.

`render_message` renders a message of one text as the message's header,
then its text encoded segment by segment, then its end token. Segments
end only where the o200k pre-tokenizer ends a piece anyway (after a newline
before an ASCII letter or digit, or before a space that separates two ASCII
words), so the tokens are exactly those of one call; the GIL is released
between calls. A run of one character class longer than `MAX_RUN_CHARS` is
the one exception: it is encoded in pieces of that length, which decode to the
same text but may differ from the canonical tokens at the cuts. Such a run is
not language, and bounding it is what keeps one request from freezing the
server.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

from openai_harmony import Author, Message, RenderOptions, Role, TextContent

from .encoding import get_encoding, special_tokens

SEGMENT_CHARS = 16_384
"""Text encoded per call, give or take the distance to the next piece boundary."""

MAX_RUN_CHARS = 4_096
"""Longest run of one character class encoded in one piece (about 10 ms)."""

# One pre-tokenizer piece: letters, whitespace or punctuation (``_`` included:
# it is punctuation to the tokenizer). Digits come in pieces of three anyway.
# Each alternative is anchored at the start of its run (the character before is of
# another class): unanchored, a run just short of the limit would be scanned again
# from each of its positions, 4,096 steps per character.
_LONG = f"{{{MAX_RUN_CHARS + 1},}}"
_LONG_RUN = re.compile(
    rf"(?<![^\W\d_])[^\W\d_]{_LONG}|(?<!\s)\s{_LONG}|(?<![^\w\s]|_)(?:[^\w\s]|_){_LONG}"
)
# Positions where the tokenizer's pieces end whatever follows: after a newline
# that precedes an ASCII letter or digit, or before a space between ASCII words.
_BOUNDARY = re.compile(r"(?<=\n)(?=[A-Za-z0-9])|(?<=[A-Za-z0-9])(?= [A-Za-z])")


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
    """``text`` cut into the segments `encode_text` encodes (they join to ``text``)."""
    start = 0
    for run in _LONG_RUN.finditer(text):
        yield from _ordinary_segments(text, start, run.start())
        for cut in range(run.start(), run.end(), MAX_RUN_CHARS):
            yield text[cut : min(cut + MAX_RUN_CHARS, run.end())]
        start = run.end()
    yield from _ordinary_segments(text, start, len(text))


def _ordinary_segments(text: str, start: int, end: int) -> Iterator[str]:
    """``text[start:end]`` cut at piece boundaries about every `SEGMENT_CHARS`."""
    while end - start > SEGMENT_CHARS:
        boundary = _BOUNDARY.search(text, start + SEGMENT_CHARS, end)
        if boundary is None:
            break
        yield text[start : boundary.start()]
        start = boundary.start()
    if end > start:
        yield text[start:end]
