"""The SSE body coalesces queued events and keeps quiet streams alive."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from tests.conftest import StartServer
from tests.support import MODEL
from trio_responses import StoreError
from trio_responses.api.asgi import ChunkedBody, response_chunked_body, response_send
from trio_responses.api.sse import SSEBody
from trio_responses.background.event_log import EventLog
from trio_responses.background.subscription import LogSubscription
from trio_responses.protocol.codec import DONE, KEEPALIVE, decode_event, encode_event


def _frame(n: int) -> bytes:
    return encode_event({"type": "response.in_progress", "sequence_number": n})


async def test_everything_queued_goes_out_in_one_write() -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20)
    body = SSEBody(LogSubscription(log, -1), keepalive_s=10)
    for n in range(30):
        log.append(_frame(n))
    assert await body.__anext__() == b"".join(_frame(n) for n in range(30))
    log.close()
    assert await body.__anext__() == DONE


async def test_idle_stream_gets_keepalive_comments(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20)
    closed: list[bool] = []
    body = SSEBody(LogSubscription(log, -1), keepalive_s=15, on_close=lambda: closed.append(True))
    start = trio.current_time()
    assert await body.__anext__() == KEEPALIVE
    assert trio.current_time() - start == 15
    await body.aclose()
    await body.aclose()
    assert closed == [True]


async def test_keepalive_reaches_the_client(start_server: StartServer) -> None:
    server = await start_server(sse_keepalive_s=0.02)
    body = {"model": MODEL, "input": "tokens:2 delay:60", "stream": True}
    async with server.http.stream("POST", "/v1/responses", json=body) as response:
        raw = b"".join([chunk async for chunk in response.aiter_bytes()])
    assert b"\n\n: keep-alive\n\n" in raw
    assert raw.endswith(b"data: [DONE]\n\n")


class _FailingReader:
    """A stored log's reader whose backend fails after a few frames."""

    def __init__(self) -> None:
        self.cursor = 4
        self.closed = False

    async def receive_frames(self) -> list[bytes]:
        await trio.lowlevel.checkpoint()
        raise StoreError("The response store (Redis) is unavailable.")

    def close(self) -> None:
        self.closed = True


async def test_a_backend_failing_mid_stream_ends_it_with_a_reason() -> None:
    reader = _FailingReader()
    body = SSEBody(reader, keepalive_s=10)  # type: ignore[arg-type]
    chunk = await body.__anext__()
    error_frame, _, rest = chunk.partition(b"\n\n")
    assert rest == DONE
    event = decode_event(error_frame + b"\n\n")
    assert event["type"] == "error" and event["code"] == "store_unavailable"
    assert event["sequence_number"] == 5
    assert "starting_after=4" in event["message"]
    await body.aclose()
    assert reader.closed


class _ThrottledConnection:
    """A connection whose socket takes ``budget`` bytes at once, then nothing."""

    def __init__(self) -> None:
        self.wire = bytearray()
        self.budget = 1 << 20
        self.direct_writes = 0

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.wire.extend(data)

    def write_nowait(self, data: bytes) -> int:
        taken = min(len(data), self.budget)
        self.budget -= taken
        self.wire.extend(data[:taken])
        self.direct_writes += taken > 0
        return taken


def _unchunk(wire: bytes) -> bytes:
    """The body inside chunked framing (raises if the framing is broken)."""
    body = bytearray()
    rest = wire
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        assert rest[size : size + 2] == b"\r\n", "bad chunk framing"
        body.extend(rest[:size])
        rest = rest[size + 2 :]
    return bytes(body)


def _served_directly(
    *,
    keepalive_s: float,
    producer_writes: bool = True,
    connection: _ThrottledConnection | None = None,
) -> tuple[_ThrottledConnection, EventLog, Callable[[], Awaitable[None]]]:
    """A body following a log as an HTTP/1.1 response would (its chunks written to
    the connection, events maybe by the producer): the connection, the log, and
    the task that serves the body."""
    connection = connection or _ThrottledConnection()
    log = EventLog(max_events=100, max_bytes=1 << 20)
    body = SSEBody(
        LogSubscription(log, -1), keepalive_s=keepalive_s, producer_writes=producer_writes
    )

    async def send(message: object) -> None:
        raise AssertionError("chunks go through the chunked body, not ASGI")

    async def serve() -> None:
        response_send.set(send)
        response_chunked_body.set(ChunkedBody(connection))
        async for _ in body:
            raise AssertionError("the body writes its chunks itself")

    return connection, log, serve


async def test_a_half_taken_direct_write_is_finished_before_anything_else(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Events written from the producer's task; one of them the socket takes only in
    part: the body's task writes the rest before the next event and before the end."""
    connection, log, serve = _served_directly(keepalive_s=1000)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await trio.testing.wait_all_tasks_blocked()
        for n in range(3):
            await trio.sleep(0.01)  # more than 1 ms apart: written by the producer
            log.append(_frame(n))
        assert connection.direct_writes == 3
        connection.budget = 10  # the next event is taken in part
        await trio.sleep(0.01)
        log.append(_frame(3))
        connection.budget = 1 << 20
        log.append(_frame(4))
        log.close()
    assert _unchunk(bytes(connection.wire)) == b"".join(_frame(n) for n in range(5)) + DONE


async def test_with_the_switch_off_the_producer_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``--reader-writes``: the same stream, every event written by the body's task."""
    connection, log, serve = _served_directly(keepalive_s=1000, producer_writes=False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await trio.testing.wait_all_tasks_blocked()
        for n in range(3):
            await trio.sleep(0.01)
            log.append(_frame(n))
            assert connection.direct_writes == 0
            await trio.testing.wait_all_tasks_blocked()  # the body's task wrote it
            assert _unchunk(bytes(connection.wire)) == b"".join(_frame(k) for k in range(n + 1))
        log.close()
    assert connection.direct_writes == 0
    assert _unchunk(bytes(connection.wire)) == b"".join(_frame(n) for n in range(3)) + DONE


class _FailingConnection(_ThrottledConnection):
    """A connection whose write from the producer fails once (a bug in the writer's
    path, say): a waiting write still works."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    def write_nowait(self, data: bytes) -> int:
        if self.direct_writes == 1 and not self.failures:
            self.failures += 1
            raise RuntimeError("the socket went wrong")
        return super().write_nowait(data)


async def test_a_failing_producer_write_is_the_readers_alone(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The producer's append never sees a reader's failure: the writer stops taking
    and the body's task writes the rest of the stream, in order."""
    connection = _FailingConnection()
    connection, log, serve = _served_directly(keepalive_s=1000, connection=connection)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await trio.testing.wait_all_tasks_blocked()
        for n in range(4):
            await trio.sleep(0.01)
            log.append(_frame(n))  # raises nothing
        log.close()
    assert isinstance(connection, _FailingConnection) and connection.failures == 1
    assert connection.direct_writes == 1  # the first; then the body's task wrote
    assert _unchunk(bytes(connection.wire)) == b"".join(_frame(n) for n in range(4)) + DONE
    assert "writing a stream's events from its producer failed" in caplog.text


async def test_a_direct_stream_gets_keepalives_only_when_quiet(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Written by the producer, a stream's writes count as activity; once it goes
    quiet, the body's task writes a keep-alive every ``keepalive_s``."""
    connection, log, serve = _served_directly(keepalive_s=15)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await trio.testing.wait_all_tasks_blocked()
        for n in range(12):  # one every 5 s for a minute: no keep-alive needed
            await trio.sleep(5)
            log.append(_frame(n))
        await trio.sleep(40)  # quiet: keep-alives at 15 and 30 s
        log.close()
    frames = b"".join(_frame(n) for n in range(12))
    assert _unchunk(bytes(connection.wire)) == frames + KEEPALIVE * 2 + DONE


async def test_an_asgi_stream_gets_keepalives_when_quiet(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Served through ASGI messages (not HTTP/1.1), keep-alives go the same way."""
    log = EventLog(max_events=100, max_bytes=1 << 20)
    body = SSEBody(LogSubscription(log, -1), keepalive_s=15)
    sent: list[bytes] = []

    async def send(message: dict[str, object]) -> None:
        await trio.lowlevel.checkpoint()
        chunk = message["body"]
        assert isinstance(chunk, bytes)
        sent.append(chunk)

    async def serve() -> None:
        response_send.set(send)  # type: ignore[arg-type]
        response_chunked_body.set(None)
        async for _ in body:
            raise AssertionError("the body writes its chunks itself")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(0))
        await trio.sleep(40)
        log.close()
    assert sent == [_frame(0), KEEPALIVE, KEEPALIVE, DONE]


async def test_a_direct_stream_woken_often_still_gets_keepalives(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Events closer than the producer writes them wake the body's task, which then
    leaves the keep-alives to a task of their own: they still come when quiet."""
    connection, log, serve = _served_directly(keepalive_s=15)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await trio.testing.wait_all_tasks_blocked()
        for n in range(12):
            await trio.sleep(0.0002)  # closer than the producer writes: a wake-up each
            log.append(_frame(n))
            await trio.testing.wait_all_tasks_blocked()
        assert connection.direct_writes < 12
        await trio.sleep(40)
        log.close()
    frames = b"".join(_frame(n) for n in range(12))
    assert _unchunk(bytes(connection.wire)) == frames + KEEPALIVE * 2 + DONE


class _RecordingConnection:
    """An HTTP/1.1 connection that records each write: the head `start_chunked`
    returns is the body's to write; `end_chunked` writes what it is given, then the
    body's end."""

    HEAD = b"HTTP/1.1 200 \r\nTransfer-Encoding: chunked\r\n\r\n"

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def start_chunked(self, status: int, headers: object) -> bytes:
        return self.HEAD

    async def end_chunked(self, last: bytes) -> None:
        await self.write(last + b"0\r\n\r\n")

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.writes.append(data)

    def write_nowait(self, data: bytes) -> int:
        self.writes.append(data)
        return len(data)


def _terminal(n: int) -> bytes:
    return encode_event({"type": "response.completed", "response": {}, "sequence_number": n})


def _started_stream() -> tuple[_RecordingConnection, EventLog, Callable[[], Awaitable[None]]]:
    """A body following a log as the create route serves it on HTTP/1.1 (start, the
    body, end): the connection, the log, and the task that serves the response."""
    connection = _RecordingConnection()
    log = EventLog(max_events=100, max_bytes=1 << 20)
    body = SSEBody(LogSubscription(log, -1), keepalive_s=1000)

    async def send(message: object) -> None:
        raise AssertionError("the response starts, goes and ends past ASGI")

    async def serve() -> None:
        chunked = ChunkedBody(connection)
        response_send.set(send)
        response_chunked_body.set(chunked)
        assert chunked.start(200, [(b"content-type", b"text/event-stream")])
        await body.write_all(send)
        await chunked.end()

    return connection, log, serve


async def test_a_started_response_writes_its_head_and_its_end_with_events() -> None:
    """The head goes out with the first events, and the terminal event with
    ``[DONE]`` and the end of the body: two writes for a short stream, not five."""
    connection, log, serve = _started_stream()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        log.append(_frame(0))
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(1))
        log.append(_terminal(2))
        log.close()
    head = _RecordingConnection.HEAD
    assert connection.writes == [
        head + ChunkedBody.frame(_frame(0)),
        ChunkedBody.frame(_frame(1) + _terminal(2) + DONE) + b"0\r\n\r\n",
    ]


async def test_a_paced_started_response_ends_in_one_write(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Events far apart are written by the producer, but not the terminal one: the
    body's task writes it with ``[DONE]`` and the end of the body."""
    connection, log, serve = _started_stream()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        log.append(_frame(0))
        for n in range(1, 4):
            await trio.sleep(0.01)  # far apart: written from the producer's task
            log.append(_frame(n))
        await trio.sleep(0.01)
        log.append(_terminal(4))
        log.close()
    assert connection.writes == [
        _RecordingConnection.HEAD + ChunkedBody.frame(_frame(0)),
        *(ChunkedBody.frame(_frame(n)) for n in range(1, 4)),
        ChunkedBody.frame(_terminal(4) + DONE) + b"0\r\n\r\n",
    ]


async def test_a_started_response_ended_before_any_chunk_still_sends_its_head() -> None:
    """A response ended with nothing written sends its head, then the end of the
    body, in one write."""
    connection = _RecordingConnection()
    chunked = ChunkedBody(connection)
    assert chunked.start(200, [])
    await chunked.end()
    assert connection.writes == [_RecordingConnection.HEAD + b"0\r\n\r\n"]
