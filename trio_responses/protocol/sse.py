"""Server-sent events framing. Events are encoded once and sent to every reader.

Frame: ``event: <type>\\ndata: <json>\\n\\n``; the stream ends with ``data: [DONE]``.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def encode_json(obj: Any) -> str:
    """Compact JSON, as the wire format uses it."""
    return _dumps(obj)


def encode_event(event: dict[str, Any]) -> bytes:
    """One SSE frame whose ``event:`` line equals the JSON ``type``."""
    return b"".join(
        (b"event: ", event["type"].encode(), b"\ndata: ", _dumps(event).encode(), b"\n\n")
    )


def decode_event(frame: bytes) -> dict[str, Any]:
    """The JSON object of one frame produced by `encode_event`."""
    start = frame.index(b"\ndata: ") + 7
    parsed: dict[str, Any] = json.loads(frame[start:])
    return parsed
