"""A lean HTTP/1.1 client for the remote engine's token streams.

One upstream's stream carries one small server-sent event per output token; a
general client spends about 60 µs of CPU on each (``bench/remote_compare.py``),
more than the rest of a token's path. This one does only what those streams
need: a POST with a JSON body on a kept-alive connection (TCP, or TLS for
``https://``), a response head, a chunked, sized or close-delimited body, split
into the events' ``data`` payloads: about 30 µs per event, most of it the
socket's receive.

Ending a stream early closes its connection (how the upstream learns the client
is gone); a connection is kept only after its response was read to the end.
Errors say whether the request may have reached the upstream: `NotSent` (the
connection could not be made or was dead: nothing started there) or
`StreamBroken` (the upstream may have begun; the stream is lost).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import trio

MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE_CONNECTIONS = 64
"""Kept-alive connections per upstream; more are closed when returned."""
RECEIVE_BYTES = 64 * 1024


class NotSent(Exception):
    """The request did not reach the upstream (no connection, or a dead one)."""


class StreamBroken(Exception):
    """The connection failed or timed out once the request was sent."""


@dataclass(eq=False)
class _Connection:
    stream: trio.abc.Stream
    buffer: bytearray = field(default_factory=bytearray)
    reused: bool = False

    async def receive(self, timeout_s: float) -> bytes:
        with trio.move_on_after(timeout_s):
            try:
                return bytes(await self.stream.receive_some(RECEIVE_BYTES))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                raise StreamBroken(f"{type(error).__name__}: {error}") from error
        raise StreamBroken(f"no data for {timeout_s:g} s")


class Reply:
    """A response being read: its status, then its body (`next_event`, or `text`)."""

    def __init__(self, connection: _Connection, status: int, headers: Mapping[bytes, bytes]):
        self.status = status
        self._connection = connection
        self._timeout_s = 0.0
        self._chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        length = headers.get(b"content-length")
        self._remaining = int(length) if length is not None and not self._chunked else None
        self._closes = b"close" in headers.get(b"connection", b"").lower()
        self.complete = False
        """The whole body was read: the connection may serve another request."""
        self._pending = bytearray()

    @property
    def reusable(self) -> bool:
        return self.complete and not self._closes

    async def _next_part(self) -> bytes | None:
        """The next piece of the decoded body, as it arrives; None after the last."""
        if self.complete:
            return None
        connection = self._connection
        buffer = connection.buffer
        if not self._chunked:
            if self._remaining == 0:
                self.complete = True
                return None
            if not buffer:
                data = await connection.receive(self._timeout_s)
                if not data:
                    if self._remaining is None:  # delimited by the close
                        self.complete = True
                        self._closes = True
                        return None
                    raise StreamBroken("the connection closed inside the body")
                buffer += data
            take = len(buffer)
            if self._remaining is not None:
                take = min(self._remaining, take)
                self._remaining -= take
            part = bytes(buffer[:take])
            del buffer[:take]
            return part
        while (end := buffer.find(b"\r\n")) < 0:
            await self._fill()
        size = int(bytes(buffer[:end]).split(b";", 1)[0], 16)
        if size == 0:
            while buffer.find(b"\r\n\r\n") < 0 and bytes(buffer[:2]) != b"\r\n":
                await self._fill()  # trailers, then the empty line
            self.complete = True
            buffer.clear()
            return None
        while len(buffer) < end + 2 + size + 2:
            await self._fill()
        part = bytes(buffer[end + 2 : end + 2 + size])
        del buffer[: end + 2 + size + 2]
        return part

    async def _fill(self) -> None:
        data = await self._connection.receive(self._timeout_s)
        if not data:
            raise StreamBroken("the connection closed inside the body")
        self._connection.buffer += data

    async def next_event(self, timeout_s: float) -> bytes | None:
        """The next server-sent event's ``data`` (its lines joined), as it arrives;
        None at the end of the body. ``timeout_s``: the longest silence."""
        self._timeout_s = timeout_s
        pending = self._pending
        while True:
            end = pending.find(b"\n\n")
            if end < 0:
                part = await self._next_part()
                if part is None:
                    return None
                pending += part
                continue
            block = bytes(pending[:end])
            del pending[: end + 2]
            data = [
                line[5:].lstrip(b" ")
                for line in block.replace(b"\r\n", b"\n").split(b"\n")
                if line.startswith(b"data:")
            ]
            if data:
                return b"\n".join(data)

    async def text(self, limit: int, timeout_s: float) -> str:
        """The body's first ``limit`` bytes (the rest is not read)."""
        self._timeout_s = timeout_s
        body = b""
        while len(body) < limit and (part := await self._next_part()) is not None:
            body += part
        return body[:limit].decode(errors="replace")


class UpstreamHTTP:
    """POST requests with streamed replies to one upstream, over kept-alive connections."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = parts.hostname
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        host_header = parts.netloc.rpartition("@")[2]
        self._head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._head += f"Host: {host_header}\r\nContent-Type: application/json\r\n"
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._idle: list[_Connection] = []
        self._ssl = ssl.create_default_context() if self._tls else None

    @asynccontextmanager
    async def post(self, path: str, body: bytes) -> AsyncIterator[Reply]:
        """POST ``body`` to ``path``; the reply, its head read.

        Raises:
            NotSent: no connection, or none that took the request.
            StreamBroken: the upstream accepted the request, then failed or went silent
                (``read_timeout_s``) before its response head.
        """
        request = (
            f"POST {self._prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        while True:
            connection = await self._connection()
            try:
                await connection.stream.send_all(request)
                status, headers = await self._read_head(connection)
            except (StreamBroken, trio.BrokenResourceError, OSError) as error:
                await trio.aclose_forcefully(connection.stream)
                if connection.reused:  # it had gone stale while idle: try a fresh one
                    continue
                if isinstance(error, StreamBroken):
                    raise
                raise NotSent(f"{type(error).__name__}: {error}") from error
            break
        reply = Reply(connection, status, headers)
        try:
            yield reply
        finally:
            if reply.reusable and len(self._idle) < MAX_IDLE_CONNECTIONS:
                connection.reused = True
                self._idle.append(connection)
            else:
                await trio.aclose_forcefully(connection.stream)

    async def _connection(self) -> _Connection:
        if self._idle:
            return self._idle.pop()
        try:
            with trio.fail_after(self._connect_timeout_s):
                if self._ssl is not None:
                    stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                        self._host, self._port, ssl_context=self._ssl
                    )
                else:
                    stream = await trio.open_tcp_stream(self._host, self._port)
        except (OSError, trio.TooSlowError) as error:
            raise NotSent(f"cannot connect: {type(error).__name__}: {error}") from error
        return _Connection(stream)

    async def _read_head(self, connection: _Connection) -> tuple[int, dict[bytes, bytes]]:
        buffer = connection.buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise StreamBroken("the response head is too large")
            data = await connection.receive(self._read_timeout_s)
            if not data:
                raise StreamBroken("the connection closed before the response")
            buffer += data
        head = bytes(buffer[:end]).split(b"\r\n")
        del buffer[: end + 4]
        try:
            status = int(head[0].split(b" ", 2)[1])
        except (IndexError, ValueError) as error:
            raise StreamBroken(f"not an HTTP response: {head[0][:80]!r}") from error
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if status == 100:  # Continue: the real head follows
            return await self._read_head(connection)
        return status, headers

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await trio.aclose_forcefully(connection.stream)
