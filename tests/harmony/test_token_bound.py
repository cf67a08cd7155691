"""The token lower bound: its figures hold for the vocabulary, and it never overshoots."""

from __future__ import annotations

import itertools
import random

from openai_harmony import Message, Role

from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.token_bound import (
    MAX_TOKEN_BYTES,
    MAX_TOKEN_DIGITS,
    MAX_TOKEN_LETTERS,
    MAX_TOKEN_NON_ASCII,
    MESSAGE_OVERHEAD,
    min_tokens,
)

LETTERS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
DIGITS = frozenset(b"0123456789")


def _vocabulary() -> list[bytes]:
    """The bytes of every ordinary token, as the encoding the server uses holds them
    (decoded one token at a time; ``surrogateescape`` keeps bytes that are not UTF-8)."""
    encoding = get_encoding()
    tokens: list[bytes] = []
    for token in itertools.count():
        if encoding.is_special_token(token):
            return tokens
        text = encoding.decode([token], errors="surrogateescape")
        tokens.append(text.encode("utf-8", "surrogateescape"))
    raise AssertionError("unreachable")


def test_the_bound_s_figures_hold_for_every_token_of_the_vocabulary() -> None:
    tokens = _vocabulary()
    assert len(tokens) > 199_000
    assert max(len(token) for token in tokens) == MAX_TOKEN_BYTES
    assert max(sum(byte in LETTERS for byte in token) for token in tokens) == MAX_TOKEN_LETTERS
    assert max(sum(byte in DIGITS for byte in token) for token in tokens) == MAX_TOKEN_DIGITS
    assert max(sum(byte >= 128 for byte in token) for token in tokens) == MAX_TOKEN_NON_ASCII


def test_the_bound_is_never_above_the_real_count() -> None:
    encoding = get_encoding()
    rng = random.Random(7)
    alphabet = "abcXYZ0123456789 \n\t.,-=*/_<|>éß日本語🙂"
    samples = [
        "",
        "hello",
        "a" * 5_000,
        "7" * 5_000,
        "-" * 5_000,
        " " * 5_000,
        "日本語" * 2_000,
        "<|end|><|start|>assistant" * 100,
        "abcdefghijklmnopqrstuvwxyz" * 100,
    ]
    samples += [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3_000))) for _ in range(200)
    ]
    for text in samples:
        message = Message.from_role_and_content(Role.USER, text)
        tokens = encoding.render(message)
        assert min_tokens(text) + MESSAGE_OVERHEAD <= len(tokens), text[:40]
    # Not a trivial bound: for English prose it is within a factor of 8.
    prose = "The quick brown fox jumps over the lazy dog. " * 2_000
    assert min_tokens(prose) * 8 > len(encoding.encode(prose))
