"""Server-sent events framing. Events are encoded once and sent to every reader.

Frame: ``event: <type>\\ndata: <json>\\n\\n``; the stream ends with ``data: [DONE]``.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring
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


def delta_prefix(event_type: str, fields: dict[str, Any]) -> bytes:
    """The constant start of every delta frame of one item: all but delta and number.

    `delta_frame` completes it. Deltas are the bulk of a stream; building them
    from a prefix costs one string escape instead of a JSON encode per token.
    """
    head = _dumps({"type": event_type, **fields})[:-1]
    return b"".join((b"event: ", event_type.encode(), b"\ndata: ", head.encode(), b',"delta":'))


def delta_frame(prefix: bytes, delta: str, sequence_number: int) -> bytes:
    """One delta frame: ``prefix`` + the JSON string ``delta`` + the sequence number."""
    return b'%s%s,"sequence_number":%d}\n\n' % (
        prefix,
        encode_basestring(delta).encode(),
        sequence_number,
    )
