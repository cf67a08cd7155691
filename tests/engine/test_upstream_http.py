"""The remote engine's HTTP/1.1 client (`engine.upstream_http`) against a raw server.

The token streams themselves run against real ``vllm serve`` (``tests/vllm/remote``);
here, each way an HTTP server may frame or end a body, a kept-alive connection that
went stale, and the two ways a request fails (never sent, or broken after).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from trio_responses.engine.upstream_http import NotSent, StreamBroken, UpstreamHTTP

Handler = Callable[[trio.SocketStream, bytes], Awaitable[bool]]
"""Answers one request; True keeps the connection open for another."""

EVENTS = b"data: one\n\ndata: two\ndata: lines\n\n: comment\n\ndata: [DONE]\n\n"


def _chunked(body: bytes, size: int = 7) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


@asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server answering with ``handler``; yields its URL and the connections it accepted."""
    accepted: list[int] = []

    async def serve(stream: trio.SocketStream) -> None:
        accepted.append(1)
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some()
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(buffer) < length:
                buffer += await stream.receive_some()
            body, buffer = buffer[:length], buffer[length:]
            if not await handler(stream, head + b"\r\n\r\n" + body):
                await stream.aclose()
                return

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, serve, 0)
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}", accepted
        nursery.cancel_scope.cancel()


def _client(url: str) -> UpstreamHTTP:
    return UpstreamHTTP(
        url, headers={"Authorization": "Bearer k"}, connect_timeout_s=5, read_timeout_s=5
    )


async def _events(client: UpstreamHTTP, body: bytes = b"{}") -> list[bytes]:
    async with client.post("/v1/completions", body) as reply:
        assert reply.status == 200
        events = []
        while (event := await reply.next_event(5)) is not None:
            events.append(event)
        return events


@pytest.mark.parametrize("framing", ["chunked", "sized", "closed"])
async def test_events_of_every_body_framing(framing: str) -> None:
    requests: list[bytes] = []

    async def answer(stream: trio.SocketStream, request: bytes) -> bool:
        requests.append(request)
        if framing == "chunked":
            head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            await stream.send_all(head + _chunked(EVENTS))
        elif framing == "sized":
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(EVENTS))
            for i in range(0, len(EVENTS), 5):
                await stream.send_all(EVENTS[i : i + 5])
        else:
            await stream.send_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + EVENTS)
            return False
        return True

    async with _server(answer) as (url, accepted):
        client = _client(url)
        for _ in range(2):
            assert await _events(client, b'{"a": 1}') == [b"one", b"two\nlines", b"[DONE]"]
        # Kept alive unless the body ended with the connection.
        assert len(accepted) == (2 if framing == "closed" else 1)
        await client.aclose()
    assert requests[0].startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"Authorization: Bearer k\r\n" in requests[0] and requests[0].endswith(b'{"a": 1}')


async def test_a_stale_kept_connection_is_replaced() -> None:
    async def answer_once(stream: trio.SocketStream, request: bytes) -> bool:
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        await stream.send_all(head + _chunked(EVENTS))
        return False  # the server closes it after: the client kept it, now stale

    async with _server(answer_once) as (url, accepted):
        client = _client(url)
        await _events(client)
        await trio.testing.wait_all_tasks_blocked()
        assert await _events(client) == [b"one", b"two\nlines", b"[DONE]"]
        assert len(accepted) == 2


async def test_an_error_body_is_read_up_to_its_limit() -> None:
    async def refuse(stream: trio.SocketStream, request: bytes) -> bool:
        body = b'{"error": {"message": "' + b"x" * 5000 + b'"}}'
        await stream.send_all(b"HTTP/1.1 400 Bad\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        return True

    async with _server(refuse) as (url, _), _client(url).post("/x", b"{}") as reply:
        assert reply.status == 400
        assert len(await reply.text(100, 5)) == 100
        assert not reply.complete  # the rest unread: the connection will not be kept


async def test_no_connection_is_not_sent_and_a_break_is_broken() -> None:
    with trio.socket.socket() as closed:
        await closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(NotSent):
        await _events(_client(f"http://127.0.0.1:{port}"))

    async def break_off(stream: trio.SocketStream, request: bytes) -> bool:
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        await stream.send_all(head + _chunked(EVENTS)[:20])
        return False

    async with _server(break_off) as (url, _):
        with pytest.raises(StreamBroken):
            await _events(_client(url))
