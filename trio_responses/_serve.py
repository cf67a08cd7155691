"""Serving HTTP: hypercorn's trio worker over the quart-trio app.

`serve` runs the whole server inside the caller's nursery::

    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(serve, Config(port=0), shutdown_trigger=stop.wait))
        ...                          # talk to urls[0]
        stop.set()                   # graceful: running responses get shutdown_grace_s

Task tree::

    serve()
    └── open_responses_service()     state, engine, job nursery
        └── serve_service()
            ├── stop_when_triggered  graceful shutdown of the service
            └── hypercorn lifespan
                └── listeners and connection handlers (hypercorn's TCPServer)

The accept loop is hypercorn's trio worker (``hypercorn.trio.run.worker_serve``)
with one change: every connection's socket stream is a `BoundedWriteStream`.
Hypercorn writes to the socket inside a shielded cancel scope with no deadline,
so a client that stops reading blocks its handler for as long as the kernel
keeps the connection: that write ignores the graceful-shutdown deadline, which
is why a shutdown used to wait minutes for such a client, and the stream's
subscription (and with it its response's event log) stayed pinned. Each write
now has a deadline (``sse_write_timeout_s``, and the end of the graceful
shutdown); a write that misses it aborts the connection, which the app sees as
a disconnect.

Most writes need no waiting: the socket takes the bytes at once. `_TCPServer`
writes those synchronously (`BoundedWriteStream.send_nowait`), skipping the
send lock, the shielded scope, the deadline scope and the checkpoints of the
waiting path; only what the socket does not take at once goes that way.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from functools import lru_cache, partial
from typing import Any, cast, final

import h11
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ASGIFramework, ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr, wrap_app

from ._config import Config
from ._exceptions import StartupError
from ._service import ResponsesService, open_responses_service
from .api.asgi import connection_raw, shield_final_send
from .api.create_route import create_asgi_app

logger = logging.getLogger("trio_responses.serve")

_HEADER_NAME = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-z]+")
"""A header name as `_TCPServer.start_chunked` takes it: an HTTP token, lower case."""

_ABORT_ON_CLOSE = struct.pack("ii", 1, 0)
"""``SO_LINGER`` on, zero seconds: closing resets the connection and drops unsent data."""


def hypercorn_config(config: Config) -> HypercornConfig:
    """Hypercorn settings for ``config`` (bind address, graceful timeout)."""
    hconfig = HypercornConfig()
    host = f"[{config.host}]" if ":" in config.host else config.host
    hconfig.bind = [f"{host}:{config.port}"]
    hconfig.accesslog = None  # the app logs one line per request itself
    # Hypercorn's messages go through logging, configured by the embedding app or the CLI.
    hconfig.errorlog = logging.getLogger("hypercorn.error")
    # Once shutdown starts, open connections get this long before they are closed:
    # the responses' grace period, then the cleanup budget to deliver their last events.
    hconfig.graceful_timeout = config.shutdown_grace_s + config.cleanup_timeout_s
    # Hypercorn listens with a backlog of 100: a burst of new connections beyond it
    # waits for SYN retransmits (1 s, 3 s, 7 s...). Allow bursts of SSE readers.
    hconfig.backlog = 2048
    # A WebSocket message (a ``response.create`` event) may be as large as a request body.
    hconfig.websocket_max_message_size = config.max_body_bytes
    # Idle WebSockets get a ping now and then, so that a connection whose peer is
    # gone sees a write fail (TCP gives up, or `WriteDeadlines` does) and closes,
    # rather than waiting for a message forever.
    hconfig.websocket_ping_interval = WEBSOCKET_PING_INTERVAL_S
    return hconfig


WEBSOCKET_PING_INTERVAL_S = 20.0
"""Seconds between pings on an open WebSocket."""


WRITE_PIECE_BYTES = 64 * 1024
"""Writes go to the socket in pieces of this size, each with its own deadline."""


@final
class WriteDeadlines:
    """The write deadlines of every connection of one server.

    Each piece of a write (`WRITE_PIECE_BYTES`) gets ``timeout_s`` to be
    accepted by the client's socket, so a slow reader that keeps reading is
    served and one that stopped is not. After `close_by`, no write lasts past
    that moment either, those waiting now included.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.closing_at = math.inf
        """Set by `close_by`: no write lasts past this moment (trio time)."""
        self.aborted = 0
        """Connections aborted because a write missed its deadline."""
        self._waiting: set[trio.CancelScope] = set()

    def wrap(self, stream: trio.SocketStream) -> BoundedWriteStream:
        return BoundedWriteStream(stream, self)

    def close_by(self, deadline: float) -> None:
        """No write may last past ``deadline``, including those waiting now."""
        self.closing_at = min(self.closing_at, deadline)
        for scope in self._waiting:
            scope.deadline = min(scope.deadline, self.closing_at)

    def _open(self) -> trio.CancelScope:
        scope = trio.CancelScope(
            deadline=min(trio.current_time() + self.timeout_s, self.closing_at)
        )
        self._waiting.add(scope)
        return scope

    def _done(self, scope: trio.CancelScope) -> None:
        self._waiting.discard(scope)


@final
class BoundedWriteStream(trio.abc.HalfCloseableStream):
    """A connection's socket stream whose writes have deadlines (`WriteDeadlines`).

    A write that misses one (the client stopped reading, or the server is
    closing) aborts the connection: the socket is reset, dropping what the
    kernel still holds for it, and the write raises `trio.BrokenResourceError`,
    which hypercorn treats as the client going away. A read waiting on the same
    socket ends at once (`trio.ClosedResourceError`).

    Hypercorn tells a TLS stream from a plain one by ``do_handshake``; this
    wraps plain sockets only, so it has none.
    """

    def __init__(self, stream: trio.SocketStream, deadlines: WriteDeadlines) -> None:
        self._stream = stream
        self._deadlines = deadlines

    @property
    def socket(self) -> trio.socket.SocketType:
        return self._stream.socket

    def send_nowait(self, data: bytes) -> int:
        """Write what the socket takes at once, without waiting or checkpointing.

        Returns the number of bytes written: 0 when the socket takes none now,
        and also when writing fails (the waiting `send_all` then reports the
        failure the usual way).
        """
        fd = self._stream.socket.fileno()
        if fd < 0:
            return 0
        try:
            return os.write(fd, data)
        except OSError:
            return 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        deadlines = self._deadlines
        with memoryview(data) as view:
            start = 0
            while True:
                scope = deadlines._open()
                try:
                    with scope:
                        await self._stream.send_all(view[start : start + WRITE_PIECE_BYTES])
                finally:
                    deadlines._done(scope)
                if scope.cancelled_caught:
                    break
                start += WRITE_PIECE_BYTES
                if start >= len(view):
                    return
        reason = (
            "the server is shutting down"
            if trio.current_time() >= deadlines.closing_at
            else f"the client stopped reading ({WRITE_PIECE_BYTES // 1024} KiB not accepted "
            f"within {deadlines.timeout_s:g} s)"
        )
        self._abort(reason)
        raise trio.BrokenResourceError(f"connection aborted: {reason}")

    def _abort(self, reason: str) -> None:
        sock = self._stream.socket
        self._deadlines.aborted += 1
        try:
            peer = repr_socket_addr(sock.family, sock.getpeername())
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT_ON_CLOSE)
        except OSError:
            peer = "a client"
        logger.warning("closed the connection from %s: %s", peer, reason)
        sock.close()  # wakes a read waiting on it, without a checkpoint

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self._stream.aclose()


@final
class _IdleTimer:
    """Hypercorn's keep-alive timeout for one connection, without a task.

    Hypercorn stops its idle task when a request comes (a cancellation the task
    wakes for) and starts a new one when the connection is idle again (a
    `nursery.start`). Here the connection's own reads wait under the deadline
    (`_TCPServer._read_data`, `read_scope`): `restart` (idle again) sets it
    ``keep_alive_timeout`` ahead and `stop` (busy) lifts it, each without a
    checkpoint. Like hypercorn's task, the connection is closed when the deadline
    passes while idle, or when the server terminates (`terminate`): at once if
    idle, else as soon as it is idle again.
    """

    def __init__(self, keep_alive_s: float, *, terminated: bool) -> None:
        self._keep_alive_s = keep_alive_s
        self._terminated = terminated
        self._idle = False
        self._deadline = math.inf
        self._scope: trio.CancelScope | None = None
        """The scope of the read under way (set by `read_scope`)."""

    async def restart(self, task_group: Any, action: object) -> None:
        """Idle from now (hypercorn's signature; ``action``, its idle task, is not used)."""
        self._idle = True
        self._move(-math.inf if self._terminated else trio.current_time() + self._keep_alive_s)

    async def stop(self) -> None:
        """Busy from now: no timeout until `restart`."""
        self._idle = False
        self._move(math.inf)

    def terminate(self) -> None:
        """The server is closing its connections: this one goes once it is idle."""
        self._terminated = True
        if self._idle:
            self._move(-math.inf)

    def read_scope(self) -> trio.CancelScope:
        """A scope for the next read: cancelled when the connection is to close."""
        self._scope = trio.CancelScope(deadline=self._deadline)
        return self._scope

    @property
    def expired(self) -> bool:
        """Whether the connection is idle past its deadline (or terminated while idle).

        A read cancelled while this is False was cancelled just before a request
        came (or its deadline moved): read again."""
        return self._idle and trio.current_time() >= self._deadline

    def _move(self, deadline: float) -> None:
        self._deadline = deadline
        if self._scope is not None:
            self._scope.deadline = deadline


@final
class _Connections:
    """The idle timers of one server's open connections, to close them at termination."""

    def __init__(self, keep_alive_s: float, terminated: Callable[[], bool]) -> None:
        self._keep_alive_s = keep_alive_s
        self._terminated = terminated
        self._timers: set[_IdleTimer] = set()

    def open(self) -> _IdleTimer:
        timer = _IdleTimer(self._keep_alive_s, terminated=self._terminated())
        self._timers.add(timer)
        return timer

    def close(self, timer: _IdleTimer) -> None:
        self._timers.discard(timer)

    def terminate(self) -> None:
        """Idle connections close now, busy ones once they are idle."""
        for timer in self._timers:
            timer.terminate()


def _writable(name: bytes, value: bytes) -> bool:
    """A header `_TCPServer.start_chunked` can write as it is after h11's framing."""
    return not (
        b"\r" in value
        or b"\n" in value
        or b"\0" in value
        or not _HEADER_NAME.fullmatch(name)
        or name in (b"content-length", b"transfer-encoding")
    )


@lru_cache(maxsize=4)
def _server_lines(config: HypercornConfig, second: int) -> bytes | None:
    """The server's own headers (hypercorn's ``Date``, ``Server``, ``Alt-Svc``) as
    head lines, rendered once for each ``second`` of Unix time (a ``Date`` is whole
    seconds); None if one cannot be written as it is (or names the connection)."""
    lines = []
    for name, value in config.response_headers("h11"):
        if not _writable(name, value) or name == b"connection":
            return None
        lines.append(b"%s: %s\r\n" % (name, value))
    return b"".join(lines)


_connection: ContextVar[_TCPServer | None] = ContextVar("trio_responses_connection", default=None)
"""The connection whose task (or one of its children) runs now."""


@final
class _WorkerContext(WorkerContext):
    """Hypercorn's worker context, with a ``sleep`` that ends when its connection closes.

    Hypercorn's WebSocket ping loop is all that sleeps through the context: it
    pings, sleeps ``websocket_ping_interval``, and stops once the stream is
    closed. A client that closed its WebSocket left that sleep running, and the
    connection's task (its socket too) with it, for up to the whole interval; a
    shutdown waited as long. Here the sleep ends as soon as the connection's
    reading ends, and the loop sees its stream closed.
    """

    @staticmethod
    async def sleep(wait: float | int) -> None:
        connection = _connection.get()
        with trio.move_on_after(wait):
            if connection is None:
                await trio.sleep_forever()
            else:
                await connection.read_closed.wait()


@final
class _TCPServer(TCPServer):
    """Hypercorn's connection handler, writing synchronously what the socket takes at once.

    It also offers its writes to the app (`connection_raw`, a `RawConnection`):
    an HTTP/1.1 streaming body writes its framed chunks through it, past h11, and
    may start and end its response there (`start_chunked`, `end_chunked`). Its
    keep-alive timeout costs no task (`_IdleTimer`); hypercorn's ``read_timeout``,
    which `hypercorn_config` leaves unset, is not applied.
    """

    def __init__(self, *args: Any, connections: _Connections) -> None:
        super().__init__(*args)
        self._connections = connections
        self._timer = connections.open()
        self.idle_task = self._timer  # type: ignore[assignment]
        self._chunked: tuple[H11Protocol, HTTPStream] | None = None
        """The protocol and stream whose response `start_chunked` began."""
        self._bounded = cast(BoundedWriteStream, self.stream)  # hypercorn's is typed SSL
        self.read_closed = trio.Event()
        """Set once nothing more is read from the connection (`_WorkerContext`)."""

    async def run(self) -> None:
        connection_raw.set(self)  # for this connection's task and its app tasks
        _connection.set(self)
        try:
            await super().run()
        finally:
            self._connections.close(self._timer)
            self.read_closed.set()

    async def _read_data(self) -> None:
        try:
            await self._read_until_closed()
        finally:
            self.read_closed.set()

    async def _read_until_closed(self) -> None:
        timer = self._timer
        while True:
            data = None
            with timer.read_scope():
                try:
                    data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    break
            if data is None:  # the deadline moved, or passed
                if timer.expired:
                    with trio.CancelScope(shield=True):
                        await self._initiate_server_close()
                    return
                continue
            await self.protocol.handle(RawData(bytes(data)))
            if not data:
                break
        await self.protocol.handle(Closed())

    async def write(self, data: bytes) -> None:
        await self.protocol_send(RawData(data=data))

    def start_chunked(self, status: int, headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
        """Start the response to the current HTTP/1.1 request, chunked, as the app's
        ``http.response.start`` would, but past hypercorn's stream and protocol and
        h11's checks of every header (three times each): our app's headers, checked
        here only for what would break the head (a line break or NUL in a value, a
        name that is not a lower-case token). h11 is told of the response (its
        framing and any ``Connection: close`` only) and keeps deciding keep-alive;
        hypercorn's stream takes it as started.

        Returns the head (h11's status line and framing, then ``headers`` and the
        server's ``Date``/``Server``) to write before any chunk; None, changing
        nothing, when this connection is not at the start of an HTTP/1.1 response
        with a body (send the ASGI message then).
        """
        protocol = self.protocol.protocol
        if type(protocol) is not H11Protocol:
            return None
        stream, connection = protocol.stream, protocol.connection
        if (
            type(stream) is not HTTPStream
            or stream.state is not ASGIHTTPState.REQUEST
            or type(connection) is not h11.Connection
            or connection.our_state is not h11.SEND_RESPONSE
            or connection.their_http_version != b"1.1"
            or stream.scope["method"] == "HEAD"
            or status < 200
            or status in (204, 304)
        ):
            return None
        framing = [(b"transfer-encoding", b"chunked")]
        if protocol.keep_alive_requests >= self.config.keep_alive_max_requests:
            framing.append((b"connection", b"close"))
        server_lines = _server_lines(self.config, int(time.time()))
        if server_lines is None:
            return None
        lines = []
        for name, value in headers:
            if not _writable(name, value):
                return None
            if name == b"connection":
                framing.append((name, value))  # h11's to act on (and to write)
            else:
                lines.append(b"%s: %s\r\n" % (name, value))
        lines.append(server_lines)
        try:
            head = connection.send(h11.Response(status_code=status, headers=framing))
        except h11.LocalProtocolError:
            return None  # the ASGI message meets the same, as hypercorn handles it
        stream.response = {"type": "http.response.start", "status": status, "headers": [*headers]}
        stream.state = ASGIHTTPState.RESPONSE
        self._chunked = protocol, stream
        # h11's head ends with an empty line: the app's headers go before it.
        return b"".join((head[:-2], *lines, b"\r\n"))

    async def end_chunked(self, last: bytes) -> None:
        """End the response `start_chunked` began, as the app's final body message
        would: ``last`` (framed chunks) and the body's end in one write, then
        hypercorn recycles the connection for the next request (or closes it).
        Nothing if the stream is gone already."""
        started, self._chunked = self._chunked, None
        if started is None:
            return
        protocol, stream = started
        if (
            protocol.stream is not stream
            or stream.closed
            or stream.state is not ASGIHTTPState.RESPONSE
        ):
            return
        connection = protocol.connection
        try:
            end = connection.send(h11.EndOfMessage())
        except h11.LocalProtocolError:  # as hypercorn does: the client broke the protocol
            if connection.their_state is not h11.ERROR:
                raise
            end = None
        if end is not None:
            await self.write(last + end)
        stream.state = ASGIHTTPState.CLOSED  # (hypercorn's access log is off)
        await stream.send(StreamClosed(stream_id=stream.stream_id))

    def write_nowait(self, data: bytes) -> int:
        if self.send_lock.locked():
            return 0
        return self._bounded.send_nowait(data)

    async def protocol_send(self, event: Event) -> None:
        if type(event) is RawData and not self.send_lock.locked():
            stream = self._bounded
            data = event.data
            sent = stream.send_nowait(data)
            if sent == len(data):
                return
            if sent:
                # Part is on the wire: the rest must follow it, cancelled or not
                # (its write has a deadline). Nothing has awaited since the
                # lock was seen free, so the rest takes it first.
                with trio.CancelScope(shield=True):
                    await super().protocol_send(RawData(data=data[sent:]))
                return
        await super().protocol_send(event)


def _create_sockets(hconfig: HypercornConfig) -> Any:
    """Hypercorn's listening sockets for ``hconfig.bind``.

    Raises:
        StartupError: an address cannot be bound (in use, not this machine's, not
            resolvable), named with the reason.
    """
    try:
        return hconfig.create_sockets()
    except OSError as error:
        where = ", ".join(hconfig.bind)
        reason = error.strerror or str(error)
        hint = {
            errno.EADDRINUSE: "another process listens there: stop it, or choose another "
            "--port (0 picks a free one)",
            errno.EADDRNOTAVAIL: "that address is not one of this machine's: choose another "
            "--host (127.0.0.1, or 0.0.0.0 for every interface)",
            errno.EACCES: "ports below 1024 need privileges: choose a --port above 1023",
        }.get(error.errno or 0, "check --host and --port")
        raise StartupError(f"cannot listen on {where}: {reason}; {hint}") from error


async def _serve_http(
    app: ASGIFramework,
    hconfig: HypercornConfig,
    deadlines: WriteDeadlines,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """Hypercorn's trio worker (``worker_serve``, HTTP/1.1 and h2c over plain
    sockets) with `BoundedWriteStream` connections.

    Serves until cancelled, or until ``shutdown_trigger`` returns: then stops
    accepting, lets open connections finish for ``hconfig.graceful_timeout``
    and closes what is left, writes included.
    """
    hconfig.set_statsd_logger_class(StatsdLogger)
    wrapped = wrap_app(app, hconfig.wsgi_max_body_size, "asgi")
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(wrapped, hconfig, lifespan_state)
    context = _WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as handlers:
            sockets = _create_sockets(hconfig)
            listeners = []
            urls = []
            for sock in sockets.insecure_sockets:
                sock.listen(hconfig.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
                # Reported to the caller (the command logs "listening on URL").
                urls.append("http://" + repr_socket_addr(sock.family, sock.getsockname()))
            state = ConnectionState(lifespan_state.copy())
            connections = _Connections(hconfig.keep_alive_timeout, context.terminated.is_set)

            async def handle(stream: trio.SocketStream) -> None:
                bounded: Any = deadlines.wrap(stream)  # hypercorn annotates an SSLStream
                await _TCPServer(wrapped, hconfig, context, state, bounded, connections=connections)

            task_status.started(urls)
            try:
                async with trio.open_nursery() as accepting:
                    accepting.start_soon(
                        partial(trio.serve_listeners, handle, listeners, handler_nursery=handlers)
                    )
                    if shutdown_trigger is None:
                        await trio.sleep_forever()
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
            finally:
                # Idle keep-alive connections close now, busy ones once idle (at the
                # deadline at the latest).
                await context.terminated.set()
                connections.terminate()
                deadline = trio.current_time() + hconfig.graceful_timeout
                handlers.cancel_scope.deadline = deadline
                deadlines.close_by(deadline)
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def serve_service(
    service: ResponsesService,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``service`` over HTTP until cancelled or until ``shutdown_trigger`` returns.

    Reports the bound URLs (``http://127.0.0.1:PORT``) through ``task_status``.
    When ``shutdown_trigger`` returns, shuts down gracefully: stop accepting
    connections and responses, give running responses ``shutdown_grace_s`` to
    finish, end the rest ``failed`` (``server_shutdown``), then return once
    their streams have ended and their jobs' cleanup is done, and
    ``shutdown_grace_s + cleanup_timeout_s`` after the trigger at the latest,
    whatever the clients, the store and the engine do: a client that has not
    taken its last events by then is disconnected (its writes are cut short),
    and each job's cleanup (engine abort, final writes, conversation, tool
    sessions) ends by one deadline, no later than ``cleanup_timeout_s`` after
    the grace period (`ResponsesService.shutdown`). Leaving the service after
    that is bounded too (see `open_responses_service`).

    Every piece of a write to a client (`WRITE_PIECE_BYTES`) has
    ``sse_write_timeout_s`` to be accepted; a client that takes longer is
    disconnected (its foreground response is cancelled, as on any disconnect).
    """
    app = shield_final_send(create_asgi_app(service))
    config = service.config
    hconfig = hypercorn_config(config)
    deadlines = WriteDeadlines(config.sse_write_timeout_s)
    if shutdown_trigger is None:
        await _serve_http(app, hconfig, deadlines, shutdown_trigger=None, task_status=task_status)
        return
    trigger = shutdown_trigger
    stopping = trio.Event()

    async def stop_when_triggered() -> None:
        await trigger()
        stopping.set()  # stop accepting; open connections get graceful_timeout
        await service.shutdown(config.shutdown_grace_s)
        logger.info("all responses ended; closing connections")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_when_triggered)
        urls = await nursery.start(
            partial(_serve_http, app, hconfig, deadlines, shutdown_trigger=stopping.wait)
        )
        task_status.started(urls)


async def serve(
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the server (state, engine, jobs, HTTP) until cancelled or until
    ``shutdown_trigger`` returns (then it shuts down gracefully, see `serve_service`).

    Use with ``nursery.start``: it returns the bound URLs once listening.
    """
    async with open_responses_service(config) as service:
        await serve_service(service, shutdown_trigger=shutdown_trigger, task_status=task_status)


__all__ = ["hypercorn_config", "serve", "serve_service"]
