"""The o200k_harmony encoding and the special tokens the translator watches.

``oss-harmony`` carries the ``o200k_base`` vocabulary in its wheel: loading
needs no network and no setting. When ``TIKTOKEN_ENCODINGS_BASE`` is set, the
library reads ``o200k_base.tiktoken`` from that folder instead (and fails when
the folder does not hold it). Loading happens once per process.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from openai_harmony import (
    HarmonyEncoding,
    HarmonyEncodingName,
    HarmonyError,
    load_harmony_encoding,
)

from .._exceptions import StartupError

VOCABULARY_VARIABLE = "TIKTOKEN_ENCODINGS_BASE"
"""The environment variable naming a folder to read the vocabulary from instead."""


@dataclass(frozen=True)
class SpecialTokens:
    start: int
    channel: int
    constrain: int
    message: int
    end: int
    return_: int
    call: int

    @property
    def structural(self) -> frozenset[int]:
        return frozenset(
            (
                self.start,
                self.channel,
                self.constrain,
                self.message,
                self.end,
                self.return_,
                self.call,
            )
        )


@functools.cache
def get_encoding() -> HarmonyEncoding:
    """The gpt-oss harmony encoding (cached)."""
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def load_encoding() -> HarmonyEncoding:
    """`get_encoding`, for start-up: a vocabulary that cannot be loaded is a `StartupError`
    naming the folder and the variable that point at it.

    Raises:
        StartupError: the library cannot load the vocabulary.
    """
    try:
        return get_encoding()
    except HarmonyError as error:
        folder = os.environ.get(VOCABULARY_VARIABLE)
        if folder is None:
            raise StartupError(f"cannot load the harmony vocabulary: {error}") from error
        raise StartupError(
            f"cannot load the harmony vocabulary from {VOCABULARY_VARIABLE}={folder!r} "
            f"({error}): that folder must hold o200k_base.tiktoken; or unset "
            f"{VOCABULARY_VARIABLE} (oss-harmony carries the vocabulary)"
        ) from error


@functools.cache
def special_tokens() -> SpecialTokens:
    encoding = get_encoding()

    def one(text: str) -> int:
        (token,) = encoding.encode(text, allowed_special="all")
        return token

    return SpecialTokens(
        start=one("<|start|>"),
        channel=one("<|channel|>"),
        constrain=one("<|constrain|>"),
        message=one("<|message|>"),
        end=one("<|end|>"),
        return_=one("<|return|>"),
        call=one("<|call|>"),
    )


@functools.cache
def stop_tokens() -> tuple[int, ...]:
    """Tokens that end an assistant turn (``<|return|>``, ``<|call|>``)."""
    return tuple(get_encoding().stop_tokens_for_assistant_actions())
