"""Rendering messages with long text in bounded tokenizer calls.

Harmony tokenizes a message in one call that holds the GIL: a 4 MB message
stops every other thread (the event loop included) for about half a second,
even when the render runs in a worker thread. Worse, byte-pair encoding is
quadratic in the length of one pre-tokenizer piece, and an unbroken run of
letters, spaces or punctuation is one piece: 32,768 repeated letters take
0.45 s, 100,000 take 4.5 s.

`render_message` renders a message whose text is long as the message's
header, then its text encoded segment by segment, then its end token. Segments
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

import re
from collections.abc import Iterator

from openai_harmony import Message, RenderOptions, TextContent

from .encoding import get_encoding, special_tokens

LONG_TEXT_CHARS = 16_384
"""Messages with less text than this render in one call (a few milliseconds)."""

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
    """``get_encoding().render(message, options)``, in bounded steps for long text."""
    encoding = get_encoding()
    if (
        len(message.content) != 1
        or not isinstance(message.content[0], TextContent)
        or len(message.content[0].text) < LONG_TEXT_CHARS
    ):
        return encoding.render(message, options)
    text = message.content[0].text
    frame = encoding.render(message.model_copy(update={"content": [TextContent(text="")]}), options)
    if len(frame) < 2 or frame[-2] != special_tokens().message:
        return encoding.render(message, options)  # not the header/text/end layout
    tokens = frame[:-1]
    tokens.extend(encode_text(text))
    tokens.append(frame[-1])
    return tokens


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
