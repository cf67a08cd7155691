"""Message text is tokenized in bounded calls, with the tokens of one harmony render."""

from __future__ import annotations

import random
import time

import pytest
from openai_harmony import Author, Message, RenderOptions, Role

from trio_responses.harmony import long_text
from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.long_text import MAX_RUN_CHARS, encode_text, render_message, segments

# Pieces that meet at every kind of pre-tokenizer boundary: words, contractions,
# digits, punctuation that swallows newlines, runs of spaces, non-ASCII letters,
# and special-token names typed as text.
_PARTS = [
    "word", "Word", " ", "  ", "\n", "\n\n", "\r\n", " \n", "don't", "'s", "123", "4567",
    ".", "...", "/", "_", "(x)", "é", "日本語", "\t", "<|end|>", "<|start|>", "a", "Z",
    "!\n/", "/\n", "e\u0301", "\u0301", "。", "Ünïcödé", "\u00a0", "\u3000", " \t", "\r",
    "١٢٣", "-", "'", "\"", "Ⅻ", "{\"", "\":", "\",\"", "}", "½", "a\u0308", "'S", "ǅ", "ʰ",
    "=", "+", "base64/", "\u200d", "😀",
]  # fmt: skip


def _text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(_PARTS) for _ in range(size))


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(long_text, "SEGMENT_CHARS", 48)


@pytest.mark.usefixtures("small_segments")
def test_segmented_encoding_gives_the_tokens_of_one_call() -> None:
    rng = random.Random(7)
    encoding = get_encoding()
    cut = 0
    for _ in range(300):
        text = _text(rng, rng.randrange(1, 600))
        parts = list(segments(text))
        assert "".join(parts) == text
        cut += len(parts) - 1
        assert encode_text(text) == encoding.encode(text, disallowed_special=())
    assert cut > 1000  # the texts really were cut, many times


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize(
    "message",
    [
        Message.from_role_and_content(Role.USER, "x"),
        Message.from_role_and_content(Role.ASSISTANT, "x").with_channel("final"),
        Message.from_role_and_content(Role.ASSISTANT, "x").with_channel("analysis"),
        Message.from_author_and_content(Author.new(Role.TOOL, "functions.f"), "x").with_channel(
            "commentary"
        ),
        Message.from_role_and_content(Role.ASSISTANT, "x")
        .with_channel("commentary")
        .with_recipient("functions.f")
        .with_content_type("<|constrain|>json"),
    ],
    ids=["user", "final", "analysis", "tool", "call"],
)
def test_long_messages_render_as_harmony_renders_them(message: Message) -> None:
    rng = random.Random(11)
    encoding = get_encoding()
    options = RenderOptions(conversation_has_function_tools=True)
    for _ in range(20):
        long = message.model_copy(
            update={"content": [type(message.content[0])(text=_text(rng, 400))]}
        )  # type: ignore[call-arg]
        assert render_message(long, options) == encoding.render(long, options)


def test_short_messages_of_every_header_render_as_harmony_renders_them() -> None:
    rng = random.Random(5)
    encoding = get_encoding()
    authors = [
        Author.new(Role.USER, "x").model_copy(update={"name": None}),
        Author.new(Role.ASSISTANT, "x").model_copy(update={"name": None}),
        Author.new(Role.TOOL, "functions.get_weather"),
        Author.new(Role.TOOL, "browser.search"),
        Author.new(Role.TOOL, "python"),
    ]
    for _ in range(300):
        message = Message.from_author_and_content(rng.choice(authors), _text(rng, rng.randrange(8)))
        if rng.random() < 0.7:
            message = message.with_channel(rng.choice(["analysis", "commentary", "final"]))
        if rng.random() < 0.3:
            message = message.with_recipient(rng.choice(["functions.f", "python", "assistant"]))
        if rng.random() < 0.3:
            message = message.with_content_type(rng.choice(["<|constrain|>json", "json", "code"]))
        for functions in (False, True):
            options = RenderOptions(conversation_has_function_tools=functions)
            assert render_message(message, options) == encoding.render(message, options)


def test_a_run_of_one_character_is_encoded_in_bounded_pieces() -> None:
    # One piece of 100,000 letters: quadratic for the tokenizer (seconds in one call).
    text = "intro " + "a" * 100_000 + " outro\n" + " " * 20_000 + "end"
    parts = list(segments(text))
    assert "".join(parts) == text
    assert max(len(part) for part in parts) <= MAX_RUN_CHARS
    message = Message.from_role_and_content(Role.USER, text)
    tokens = render_message(message, RenderOptions())
    # The same text reaches the model, inside the same message frame.
    empty = get_encoding().render(Message.from_role_and_content(Role.USER, ""), RenderOptions())
    assert tokens[: len(empty) - 1] == empty[:-1] and tokens[-1] == empty[-1]
    assert get_encoding().decode(tokens[len(empty) - 1 : -1]) == text


def test_runs_just_short_of_the_limit_are_found_in_linear_time() -> None:
    # 100 runs of 4,000 letters: each is scanned once, not once per position.
    text = ("a" * 4000 + " ") * 100
    started = time.monotonic()
    parts = list(segments(text))
    assert time.monotonic() - started < 3  # ~0.05 s; it was ~11 s
    assert "".join(parts) == text
