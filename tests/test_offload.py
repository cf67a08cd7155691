"""`estimated_size`: what decides whether a request's work leaves the event loop."""

from __future__ import annotations

import json
import random
from typing import Any

from pydantic import BaseModel

from trio_responses._offload import INLINE_BYTES, estimated_size


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(6 if depth < 5 else 3)
    if kind == 0:
        return "".join(rng.choice('abcé 😀"\\') for _ in range(rng.randrange(40)))
    if kind == 1:
        return rng.choice([0, 12345, -1.5, True, None])
    if kind == 2:
        return ""
    if kind == 3:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    if kind == 4:
        return tuple(_value(rng, depth + 1) for _ in range(rng.randrange(4)))
    return {f"key{n}": _value(rng, depth + 1) for n in range(rng.randrange(6))}


def test_the_estimate_follows_the_json_length() -> None:
    rng = random.Random(7)
    for _ in range(500):
        value = _value(rng)
        actual = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        estimate = estimated_size(value)
        assert actual / 3 - 8 <= estimate <= actual * 3 + 8, (value, estimate, actual)


class _Model(BaseModel):
    name: str
    parts: list[dict[str, Any]]
    note: str | None = None


def test_models_count_their_fields() -> None:
    small = estimated_size(_Model(name="x", parts=[]))
    large = estimated_size(_Model(name="x", parts=[{"text": "y" * 10_000}]))
    assert small < 100
    assert 10_000 < large < 10_100
    assert estimated_size((_Model(name="x", parts=[]), [{"text": "y" * 10_000}])) > 10_000


def test_it_stops_once_past_the_limit() -> None:
    messages = [{"role": "user", "content": "x" * 1_000}] * 1_000  # ~1 MB as JSON
    assert INLINE_BYTES < estimated_size(messages) < INLINE_BYTES + 1_100
    assert 1_000 < estimated_size(messages, limit=1_000) < 2_100
    nested = [[["x" * 100] * 100] * 100] * 100  # ~100 MB as JSON
    assert INLINE_BYTES < estimated_size(nested) < INLINE_BYTES + 200
    # More members than the limit: over it before any member is looked at.
    many = [{"role": "user", "content": "hello"}] * 1_000_000
    assert estimated_size(many) == 2 + 1_000_000
    assert estimated_size("z" * 10_000_000) == 10_000_002
