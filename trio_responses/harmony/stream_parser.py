"""A streaming harmony parser for assistant output, cheap on the common path (sans-IO).

`StreamParser` reads what the translator reads of openai_harmony's
`StreamableParser` (`last_content_delta`, `current_channel`,
`current_recipient`) and gives the same answers, token for token. The Rust
parser is exact, but each call crosses into Rust and decodes again: a header
token costs it ~36 µs and a new parser ~165 µs, against ~1.5 µs per content
token, so the eight header tokens of a plain answer outweighed the whole rest
of a short stream.

This one reads the headers the model writes (plain ASCII words with
``<|channel|>`` and ``<|constrain|>``) and content made of tokens that decode
by themselves (special tokens inside content are text, as in harmony). At the
first token it is not sure of (a token that is only part of a UTF-8
character, any other special token in a header, a header outside that
alphabet or rejected by the rules below, a stray token after a message) it
hands over: a Rust parser replays the current message's header, in the state
harmony's parser has there, and reads the rest of the turn. So anything
unusual, errors included, is decided by the reference implementation, and a
hand-over replays a few tokens, never a long message.

The header rules, for the headers it takes: the channel is the word after the
first ``<|channel|>``, cut out of the header; a ``<|constrain|>`` marker
becomes its own word; the role word is dropped (after ``<|start|>`` it must be
``assistant``); then the last word is the recipient if it starts with ``to=``
or stands alone, else the content type, with at most one word before it, the
recipient (its ``to=`` removed).
"""

from __future__ import annotations

import re
from typing import Final

from openai_harmony import HarmonyError, Role, StreamableParser

from .encoding import get_encoding, special_tokens

_CHANNEL: Final = "<|channel|>"
_CONSTRAIN: Final = "<|constrain|>"
# Headers of these characters only: space is the only whitespace, so splitting
# and trimming agree with the Rust parser's ASCII and Unicode rules.
_SIMPLE_HEADER: Final = re.compile(r"[A-Za-z0-9_.:/=<|> -]*")
_CHANNEL_END: Final = re.compile(r"[ <]")

# What the parser has learnt of each token it met (at most the vocabulary, ~200,000):
_texts: dict[int, str] = {}
"""Tokens that decode by themselves, special ones included: their text."""
_special: set[int] = set()
"""Special tokens (their text is in `_texts` too)."""
_partial: set[int] = set()
"""Tokens that are not whole UTF-8 by themselves (or that no text decodes to)."""


def _learn(token: int) -> bool:
    """Put ``token`` in the tables above; False for a value that is no token at all
    (negative, too large, not an int: the Rust parser raises its own error)."""
    encoding = get_encoding()
    try:
        text = encoding.decode_utf8([token])
    except HarmonyError:
        _partial.add(token)
        return True
    except Exception:
        return False
    if encoding.is_special_token(token):
        _special.add(token)
    _texts[token] = text
    return True


class _Unsure(Exception):
    """The fast path cannot decide this token: hand over to the Rust parser."""


def _parse_header(header: str, *, after_start: bool) -> tuple[str | None, str | None]:
    """(channel, recipient) of a header, or raise `_Unsure`."""
    if _SIMPLE_HEADER.fullmatch(header) is None or header.count(_CONSTRAIN) > 1:
        raise _Unsure
    channel: str | None = None
    at = header.find(_CHANNEL)
    if at >= 0:
        rest = header[at + len(_CHANNEL) :]
        found = _CHANNEL_END.search(rest)
        end = found.start() if found is not None else len(rest)
        if end == 0 or _CHANNEL in rest:
            raise _Unsure
        channel = rest[:end]
        header = header[:at] + rest[end:]
    if _CONSTRAIN in header:
        header = header.replace(_CONSTRAIN, " " + _CONSTRAIN)
    words = header.split()
    if words and words[0] == "assistant":
        del words[0]
    elif after_start:
        raise _Unsure  # another role, or none: rare, and the Rust parser's call
    if not words:
        return channel, None
    last = words.pop()
    if last.startswith("to="):
        recipient = last[3:]
        if recipient.startswith("to="):
            raise _Unsure
    elif not words:
        recipient = last
    else:
        if len(words) != 1:
            raise _Unsure
        recipient = words.pop().removeprefix("to=")
    if words:
        raise _Unsure
    return channel, recipient


_HEADER, _CONTENT, _BETWEEN, _RUST = range(4)


class StreamParser:
    """Parse one assistant turn token by token (see the module)."""

    __slots__ = (
        "_after_start",
        "_header",
        "_header_special",
        "_header_tokens",
        "_message",
        "_rust",
        "_start",
        "_state",
        "_stops",
        "current_channel",
        "current_recipient",
        "last_content_delta",
    )

    def __init__(self) -> None:
        special = special_tokens()
        self._start = special.start
        self._message = special.message
        self._stops = frozenset((special.end, special.call, special.return_))
        self._header_special = {special.channel: _CHANNEL, special.constrain: _CONSTRAIN}
        self._header_tokens: list[int] = []
        """The current message's header tokens so far, ``<|start|>`` and ``<|message|>``
        included (what a hand-over replays)."""
        self._header: list[str] = []
        self._after_start = False
        self._state = _HEADER
        self._rust: StreamableParser | None = None
        self.last_content_delta: str | None = None
        """The text the last token added to the message content (None: none)."""
        self.current_channel: str | None = None
        """The open message's channel (None outside a message)."""
        self.current_recipient: str | None = None
        """The open message's recipient (None outside a message, or none)."""

    @property
    def handed_over(self) -> bool:
        """True once the Rust parser reads this turn."""
        return self._state == _RUST

    def process(self, token: int) -> None:
        """Take the next token.

        Raises:
            openai_harmony.HarmonyError: the tokens break the harmony format.
        """
        state = self._state
        if state == _CONTENT:  # the common case first
            if token in self._stops:
                self._state = _BETWEEN
                self._header_tokens.clear()
                self.last_content_delta = self.current_channel = self.current_recipient = None
            elif (text := _texts.get(token)) is not None:
                self.last_content_delta = text
            elif _learn(token) and token in _texts:
                self.last_content_delta = _texts[token]
            else:  # part of a character: harmony holds its bytes
                self._hand_over(token)
        elif state == _HEADER:
            self._header_tokens.append(token)
            if token == self._message:
                try:
                    channel, recipient = _parse_header(
                        "".join(self._header), after_start=self._after_start
                    )
                except _Unsure:
                    self._hand_over(None)
                    return
                self.current_channel, self.current_recipient = channel, recipient
                self._header.clear()
                self._state = _CONTENT
                return
            text = self._header_special.get(token)
            if text is None and (token in _texts or _learn(token)) and token not in _special:
                text = _texts.get(token)
            if text is None:
                self._hand_over(None)
            else:
                self._header.append(text)
        elif state == _BETWEEN and token == self._start:  # only <|start|> may come here
            self._after_start = True
            self._header_tokens.append(token)
            self._state = _HEADER
        elif state == _RUST:
            self._rust_process(token)
        else:
            self._hand_over(token)

    def _hand_over(self, token: int | None) -> None:
        """Let a Rust parser read the rest of the turn: it replays the current message's
        header (in the state harmony's parser has there), then ``token``.

        The content before ``token`` is not replayed: every token of it was whole
        text, so the Rust parser would hold nothing back from it, and nothing read
        here depends on it. A replay is a few tokens, however long the message.
        """
        tokens, self._header_tokens = self._header_tokens, []
        # Within the turn's first message harmony's parser knows the role already.
        first = self._state != _BETWEEN and not self._after_start
        self._rust = StreamableParser(get_encoding(), Role.ASSISTANT if first else None)
        self._state = _RUST
        for replayed in tokens:
            self._rust_process(replayed)
        if token is not None:
            self._rust_process(token)

    def _rust_process(self, token: int) -> None:
        rust = self._rust
        if rust is None:  # pragma: no cover - the state says there is one
            raise RuntimeError("no Rust parser to hand over to")
        rust.process(token)
        self.last_content_delta = rust.last_content_delta
        self.current_channel = rust.current_channel
        self.current_recipient = rust.current_recipient
