"""JSON and server-sent events, in and out: every JSON body, event and record the
server writes is encoded here, and every SSE frame it takes apart is decoded here.

JSON (`encode_json` and its variants) is compact (no spaces) and UTF-8 as it is
(no ``\\u`` escapes), except where a variant says otherwise:

- `encode_json`: the wire (Response objects, events, JSON bodies) and sealed
  payloads. Allows NaN and the infinities (as Python writes them) rather than fail
  a stream: nothing a client sends holds them (`json_body.decode_json_body`
  refuses them), and nothing the server adds is a float that could be one.
- `encode_strict_json`: what is stored (records, conversations, items): NaN and
  the infinities raise ``ValueError``, since no reader could load them back.
- `encode_ascii_json`: non-ASCII escaped: error bodies and events, whose message
  may quote any string a client sent (a lone surrogate cannot be UTF-8), and a
  JSON schema quoted in a prompt, whose bytes the prompt's tokens depend on.

`decode_json` reads back what the server wrote (records, sealed payloads);
a client's request body goes through `json_body.decode_json_body` instead.

SSE frame: ``event: <type>\nid: <sequence_number>\ndata: <json>\n\n``; the
stream ends with ``data: [DONE]``. The ``id`` lets standard SSE clients resume
with a ``Last-Event-ID`` header. `encode_event` makes a frame, `frame_data` and
`decode_event` take it apart. Streamed tokens take `delta_frame`, built from a
prefix encoded once per item: the encoders are bound once, at import.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Any

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_dumps_strict = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_dumps_ascii = json.JSONEncoder(separators=(",", ":")).encode


def encode_json(obj: Any) -> str:
    """Compact JSON, as the wire format uses it."""
    return _dumps(obj)


def encode_strict_json(obj: Any) -> str:
    """Compact JSON as it is stored: ``ValueError`` for NaN and the infinities,
    ``TypeError`` for what JSON cannot hold."""
    return _dumps_strict(obj)


def encode_ascii_json(obj: Any) -> str:
    """Compact JSON with every non-ASCII character escaped."""
    return _dumps_ascii(obj)


def decode_json(data: str | bytes) -> Any:
    """A JSON value the server wrote (a record, a sealed payload)."""
    return json.loads(data)


def encode_event(event: dict[str, Any]) -> bytes:
    """One SSE frame whose ``event:`` line equals the JSON ``type``."""
    return b"event: %s\nid: %d\ndata: %s\n\n" % (
        event["type"].encode(),
        event["sequence_number"],
        _dumps(event).encode(),
    )


def encode_response_event(event_type: str, response: str, sequence_number: int) -> bytes:
    """`encode_event` of ``{"type", "response", "sequence_number"}`` whose response
    is encoded already (`encode_json`): events that carry the same Response object
    encode it once."""
    return b'event: %s\nid: %d\ndata: {"type":%s,"response":%s,"sequence_number":%d}\n\n' % (
        event_type.encode(),
        sequence_number,
        _dumps(event_type).encode(),
        response.encode(),
        sequence_number,
    )


_TERMINAL_PREFIXES = (
    b"event: response.completed\n",
    b"event: response.incomplete\n",
    b"event: response.failed\n",
)


def is_terminal_frame(frame: bytes) -> bool:
    """True for the frame of a response's terminal event (the last of its log)."""
    return frame.startswith(_TERMINAL_PREFIXES)


def split_frames(joined: bytes) -> list[bytes]:
    """The frames of concatenated SSE frames (as stores keep batches of them).

    Every frame ends with a blank line and holds no other (compact JSON has no raw
    newline), so splitting there gives the frames back. Raises ValueError when
    ``joined`` does not end with a whole frame.
    """
    parts = joined.split(b"\n\n")
    if parts[-1]:
        raise ValueError("not a sequence of whole SSE frames")
    return [part + b"\n\n" for part in parts[:-1]]


_DATA = b"\ndata: "


def frame_data(frame: bytes) -> bytes:
    """The JSON of one frame produced by `encode_event` (what follows ``data:``)."""
    return frame[frame.index(_DATA) + len(_DATA) : -2]


def decode_event(frame: bytes) -> dict[str, Any]:
    """The event of one frame produced by `encode_event`."""
    parsed: dict[str, Any] = json.loads(frame_data(frame))
    return parsed


DeltaPrefix = tuple[bytes, bytes]


def delta_prefix(event_type: str, fields: dict[str, Any]) -> DeltaPrefix:
    """The constant parts of every delta frame of one item.

    `delta_frame` completes them. Deltas are the bulk of a stream; building them
    from a prefix costs one string escape instead of a JSON encode per token.
    """
    head = _dumps({"type": event_type, **fields})[:-1]
    return (
        b"event: %s\nid: " % event_type.encode(),
        b'\ndata: %s,"delta":' % head.encode(),
    )


def delta_frame(prefix: DeltaPrefix, delta: str, sequence_number: int) -> bytes:
    """One delta frame: the prefix, the JSON string ``delta``, the sequence number."""
    return b'%s%d%s%s,"sequence_number":%d}\n\n' % (
        prefix[0],
        sequence_number,
        prefix[1],
        encode_basestring(delta).encode(),
        sequence_number,
    )
