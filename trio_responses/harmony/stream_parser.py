"""A streaming harmony parser for assistant output, cheap on the common path (sans-IO).

`StreamParser` reads what the translator reads of openai_harmony's
`StreamableParser` (`last_content_delta`, `current_channel`,
`current_recipient`) and gives the same answers, token for token. The Rust
parser is exact, but each call crosses into Rust and decodes again: a header
token costs it ~36 µs and a new parser ~165 µs, against ~1.5 µs per content
token, so the eight header tokens of a plain answer outweighed the whole rest
of a short stream.

This one handles the forms the model writes (a header of plain ASCII words with
``<|channel|>`` and ``<|constrain|>``, content whose every token is whole
UTF-8) itself. At the first token it is not sure of — any other special token,
a token that is only part of a UTF-8 character, a header outside that simple
alphabet, a header the rules below reject — it hands over: a Rust parser
replays every token so far and takes the rest of the turn, so anything unusual,
errors included, is decided by the reference implementation.

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

from openai_harmony import Role, StreamableParser

from .encoding import get_encoding, special_tokens

_CHANNEL: Final = "<|channel|>"
_CONSTRAIN: Final = "<|constrain|>"
# Headers of these characters only: space is the only whitespace, so splitting
# and trimming agree with the Rust parser's ASCII and Unicode rules.
_SIMPLE_HEADER: Final = re.compile(r"[A-Za-z0-9_.:/=<|> -]*")
_CHANNEL_END: Final = re.compile(r"[ <]")

# Token id -> its text; None for a special token, or one that is not whole UTF-8
# by itself. At most one entry per token of the vocabulary (~200,000).
_texts: dict[int, str | None] = {}


def _token_text(token: int) -> str | None:
    encoding = get_encoding()
    text: str | None = None
    if not encoding.is_special_token(token):
        try:
            text = encoding.decode_utf8([token])
        except Exception:  # part of a multi-byte character (openai_harmony's own error)
            text = None
    _texts[token] = text
    return text


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

    def __init__(self) -> None:
        special = special_tokens()
        self._start = special.start
        self._message = special.message
        self._stops = frozenset((special.end, special.call, special.return_))
        self._header_special = {special.channel: _CHANNEL, special.constrain: _CONSTRAIN}
        self._tokens: list[int] = []
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
        if state == _RUST:
            self._rust_process(token)
            return
        self._tokens.append(token)
        if state == _CONTENT:  # the common case first
            if token in self._stops:
                self._state = _BETWEEN
                self.last_content_delta = self.current_channel = self.current_recipient = None
                return
            text = _texts[token] if token in _texts else _token_text(token)
            if text is None:
                self._hand_over()
            else:
                self.last_content_delta = text
        elif state == _HEADER:
            if token == self._message:
                try:
                    channel, recipient = _parse_header(
                        "".join(self._header), after_start=self._after_start
                    )
                except _Unsure:
                    self._hand_over()
                    return
                self.current_channel, self.current_recipient = channel, recipient
                self._header.clear()
                self._state = _CONTENT
                return
            text = self._header_special.get(token) or _token_text(token)
            if text is None:
                self._hand_over()
            else:
                self._header.append(text)
        elif token == self._start:  # between messages, only <|start|> may come
            self._after_start = True
            self._state = _HEADER
        else:
            self._hand_over()

    def _hand_over(self) -> None:
        """Replay the turn into a Rust parser, which reads the rest of it."""
        tokens = self._tokens
        self._tokens = []
        self._state = _RUST
        self._rust = StreamableParser(get_encoding(), Role.ASSISTANT)
        for token in tokens:
            self._rust_process(token)

    def _rust_process(self, token: int) -> None:
        rust = self._rust
        if rust is None:  # pragma: no cover - the state says there is one
            raise RuntimeError("no Rust parser to hand over to")
        rust.process(token)
        self.last_content_delta = rust.last_content_delta
        self.current_channel = rust.current_channel
        self.current_recipient = rust.current_recipient
