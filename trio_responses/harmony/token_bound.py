"""A lower bound of a text's token count, without tokenizing it.

Tokenizing is the expensive part of rendering a prompt (and harmony holds the
GIL while it does it), so a request that cannot fit the context window should
be refused from a cheaper figure. Every ordinary (non-special) token of the
o200k vocabulary decodes to at most 128 bytes, of which at most 26 are ASCII
letters, at most 3 ASCII digits and at most 60 non-ASCII bytes; a text of B
bytes, L letters, D digits and N non-ASCII bytes therefore takes at least
``max(B/128, L/26, D/3, N/60)`` tokens, whatever the tokenizer does with it.
(tests/harmony/test_token_bound.py checks these figures against the vocabulary.)

Message content is encoded as ordinary text (``<|end|>`` typed by a user is
text, not the special token), so the bound holds for what a message renders.
"""

from __future__ import annotations

MAX_TOKEN_BYTES = 128
MAX_TOKEN_LETTERS = 26
MAX_TOKEN_DIGITS = 3
MAX_TOKEN_NON_ASCII = 60

MESSAGE_OVERHEAD = 3
"""Tokens every rendered message has besides its content: ``<|start|>``,
``<|message|>`` and its end token."""

_LETTERS = bytes(range(ord("A"), ord("Z") + 1)) + bytes(range(ord("a"), ord("z") + 1))
_DIGITS = b"0123456789"
_NON_ASCII = bytes(range(128, 256))
_CHUNK = 1 << 20
"""Characters counted per step, so a long text never holds the GIL for long."""


def min_tokens(text: str) -> int:
    """At least how many tokens ``text`` encodes to (see the module docstring).

    Linear in the text's length, with no tokenizing; about 4 ms per MB.
    """
    size = letters = digits = non_ascii = 0
    for start in range(0, len(text), _CHUNK):
        data = text[start : start + _CHUNK].encode("utf-8", "surrogatepass")
        size += len(data)
        letters += len(data) - len(data.translate(None, _LETTERS))
        digits += len(data) - len(data.translate(None, _DIGITS))
        non_ascii += len(data) - len(data.translate(None, _NON_ASCII))
    return max(
        -(-size // MAX_TOKEN_BYTES),
        -(-letters // MAX_TOKEN_LETTERS),
        -(-digits // MAX_TOKEN_DIGITS),
        -(-non_ascii // MAX_TOKEN_NON_ASCII),
    )
