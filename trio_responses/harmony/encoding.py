"""The o200k_harmony encoding and the special tokens the translator watches.

Loading reads ``o200k_base.tiktoken`` (downloaded on first use, or from the
folder named by ``TIKTOKEN_ENCODINGS_BASE`` when offline); it happens once per
process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding


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
