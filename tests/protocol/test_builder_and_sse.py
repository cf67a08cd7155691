"""Event construction and SSE framing, checked against the SDK's types."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import check_stream, validate_response
from trio_responses.protocol.builder import ResponseBuilder, request_echo
from trio_responses.protocol.codec import (
    decode_event,
    decode_json,
    encode_ascii_json,
    encode_event,
    encode_json,
    encode_strict_json,
    frame_data,
    split_frames,
)
from trio_responses.protocol.lifecycle import IllegalTransition
from trio_responses.protocol.request import parse_create_request


def _builder(
    events: list[dict[str, Any]], *, frames: list[bytes] | None = None, **request: Any
) -> ResponseBuilder:
    """A builder for ``request`` whose events go to ``events`` (decoded), or to
    ``frames`` as they are."""
    parsed = parse_create_request({"model": "m", **request})
    return ResponseBuilder(
        response_id="resp_test",
        model="m",
        created_at=1.0,
        echo=request_echo(parsed),
        background=parsed.background,
        emit=frames.append if frames is not None else lambda f: events.append(decode_event(f)),
    )


def test_full_response_events_are_valid() -> None:
    events: list[dict[str, Any]] = []
    builder = _builder(events)
    builder.start()
    builder.mark_in_progress()
    builder.open_reasoning()
    builder.delta("think")
    builder.close_item()
    builder.open_message()
    for part in ("Hel", "lo"):
        builder.delta(part)
    builder.close_item()
    builder.open_function_call("f")
    builder.delta('{"a":')
    builder.delta("1}")
    builder.close_item()
    builder.usage.input_tokens = 3
    builder.usage.output_tokens = 4
    builder.finish("completed", now=2.0)
    check_stream(events)
    final = validate_response(events[-1]["response"])
    assert final.output_text == "Hello"
    assert final.usage is not None and final.usage.total_tokens == 7
    assert final.completed_at == 2.0


def test_background_start_is_queued() -> None:
    events: list[dict[str, Any]] = []
    builder = _builder(events, background=True)
    builder.start()
    assert [e["type"] for e in events] == ["response.created", "response.queued"]
    assert events[0]["response"]["status"] == "queued"
    builder.finish("cancelled", now=1.0)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "cancelled"


def test_snapshot_holds_finished_items_only() -> None:
    builder = _builder([])
    builder.start()
    builder.open_message()
    builder.delta("partial")
    assert builder.snapshot()["output"] == []
    builder.close_item()
    assert builder.snapshot()["output"][0]["content"][0]["text"] == "partial"


def test_finish_closes_an_open_item_as_incomplete() -> None:
    events: list[dict[str, Any]] = []
    builder = _builder(events)
    builder.start()
    builder.open_message()
    builder.delta("cut")
    builder.finish("incomplete", now=1.0, incomplete_reason="max_output_tokens")
    check_stream(events)
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"


def test_illegal_transitions_raise() -> None:
    builder = _builder([])
    builder.finish("completed", now=1.0)
    with pytest.raises(IllegalTransition, match="from 'completed' to 'failed'"):
        builder.finish("failed", now=1.0)


def test_mcp_headers_are_never_echoed() -> None:
    parsed = parse_create_request(
        {
            "model": "m",
            "tools": [
                {
                    "type": "mcp",
                    "server_label": "s",
                    "server_url": "http://127.0.0.2/mcp",
                    "headers": {"Authorization": "Bearer secret"},
                }
            ],
        }
    )
    echo = request_echo(parsed)
    assert "secret" not in repr(echo)
    assert echo["tools"][0]["server_label"] == "s"


@pytest.mark.parametrize("background", [False, True])
def test_lifecycle_frames_are_what_encode_event_writes(background: bool) -> None:
    # created, queued and in_progress share one encoding of the response where it
    # is the same: each frame is still exactly the event's own encoding.
    frames: list[bytes] = []
    builder = _builder(
        [],
        frames=frames,
        input="héllo 🙂",
        instructions='be "brief"\n',
        metadata={},
        background=background,
    )
    builder.start()
    builder.mark_in_progress()
    builder.finish("completed", now=2)
    events = [decode_event(frame) for frame in frames]
    assert [encode_event(event) for event in events] == frames
    expected = ["response.created", "response.in_progress", "response.completed"]
    if background:
        expected.insert(1, "response.queued")
    assert [event["type"] for event in events] == expected
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    in_progress = events[-2]["response"]
    assert in_progress["status"] == "in_progress"
    assert events[0]["response"] == (
        {**in_progress, "status": "queued"} if background else in_progress
    )


def test_in_progress_carries_what_changed_since_created() -> None:
    events: list[dict[str, Any]] = []
    builder = _builder(events)
    builder.start()
    builder.open_message()
    builder.delta("early")
    builder.close_item()
    builder.mark_in_progress()
    assert events[0]["response"]["output"] == []
    in_progress = events[-1]
    assert in_progress["type"] == "response.in_progress"
    assert [item["content"][0]["text"] for item in in_progress["response"]["output"]] == ["early"]


def test_sse_frame_round_trip() -> None:
    event = {"type": "response.output_text.delta", "delta": "héllo\n\n🙂", "sequence_number": 3}
    frame = encode_event(event)
    assert frame.startswith(b"event: response.output_text.delta\nid: 3\ndata: {")
    assert frame.endswith(b"\n\n") and frame.count(b"\n\n") == 1
    assert decode_event(frame) == event
    assert frame_data(frame) == encode_json(event).encode()  # what WebSocket mode sends


def test_json_encoders_differ_only_where_they_say() -> None:
    value = {"text": "é\ud800", "n": [1, 2.5]}
    assert encode_json(value) == '{"text":"é\ud800","n":[1,2.5]}'
    assert encode_ascii_json(value) == '{"text":"\\u00e9\\ud800","n":[1,2.5]}'
    assert encode_ascii_json(value).encode("ascii")  # sendable whatever a client's text held
    assert decode_json(encode_ascii_json(value)) == value
    assert encode_strict_json({"ok": 1.5}) == encode_json({"ok": 1.5})
    assert encode_json(float("nan")) == "NaN"
    with pytest.raises(ValueError):
        encode_strict_json({"usage": float("inf")})


def test_joined_frames_split_back() -> None:
    frames = [
        encode_event({"type": "response.output_text.delta", "sequence_number": n, "delta": d})
        for n, d in enumerate(["a\n\nb", "\\n\\n", "plain", '"quoted"'])
    ]
    assert split_frames(b"".join(frames)) == frames
    assert split_frames(b"") == []
    with pytest.raises(ValueError, match="whole SSE frames"):
        split_frames(b"".join(frames)[:-1])
