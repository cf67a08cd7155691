"""Hypercorn's trio worker, with the changes `trio_responses._serve` needs.

Tested with hypercorn==0.18.0 (pinned in pyproject.toml). Hypercorn's public API
is its ``Config`` settings, ``hypercorn.trio.serve`` and ``hypercorn.typing``; what
follows relies on its internals too, listed in `RELIES_ON` and checked against the
installed version by tests/test_pinned_libraries.py:

- the trio worker's parts, put together again by `serve_http` as
  ``hypercorn.trio.run.worker_serve`` does: ``Config.create_sockets``,
  ``Config.set_statsd_logger_class``, ``utils.wrap_app``,
  ``utils.repr_socket_addr``, ``Lifespan`` (``Lifespan.handle_lifespan``,
  ``Lifespan.wait_for_startup``, ``Lifespan.wait_for_shutdown``),
  ``StatsdLogger``, ``WorkerContext`` (``WorkerContext.terminated``;
  ``WorkerContext.sleep``, replaced);
- the connection handler ``TCPServer``, subclassed: ``TCPServer.run`` and
  ``TCPServer.protocol_send`` (extended), ``TCPServer._read_data`` (replaced),
  ``TCPServer._initiate_server_close`` (called), ``tcp_server.MAX_RECV``, and its
  attributes ``TCPServer.idle_task`` (replaced by an object with the methods
  ``TrioSingleTask.restart`` and ``TrioSingleTask.stop``), ``TCPServer.protocol``,
  ``TCPServer.stream``, ``TCPServer.config``, ``TCPServer.send_lock``;
- for a response started and ended past hypercorn's stream (`start_chunked`,
  `end_chunked`): ``ProtocolWrapper.protocol``, ``ProtocolWrapper.handle``,
  ``H11Protocol.connection``, ``H11Protocol.stream``,
  ``H11Protocol.keep_alive_requests``, ``H11Protocol.stream_send`` (a stream's
  ``HTTPStream.send``), ``HTTPStream.state``, ``HTTPStream.scope``,
  ``HTTPStream.response``, ``HTTPStream.closed``, ``HTTPStream.stream_id``,
  ``ASGIHTTPState.REQUEST``, ``ASGIHTTPState.RESPONSE``, ``ASGIHTTPState.CLOSED``,
  ``Config.response_headers``, and the events ``RawData``, ``Closed``,
  ``StreamClosed``.

`serve_http` serves HTTP/1.1 and h2c over plain TCP sockets only: the server has
no TLS settings (put a TLS-terminating proxy in front), nor hypercorn's
``max_requests`` (it recycles worker processes; this server is one process).
"""

from __future__ import annotations

import errno
import math
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from functools import lru_cache, partial
from typing import Any, Protocol, cast, final

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

from .._exceptions import StartupError
from .._raw_connection import connection_raw
from . import Internal

PINNED = ("hypercorn==0.18.0",)
"""What pyproject.toml pins, and these internals were checked with."""

_SERVER = "hypercorn.trio.tcp_server:TCPServer"
_CONTEXT = "hypercorn.trio.worker_context"
_LIFESPAN = "hypercorn.trio.lifespan:Lifespan"
_H11 = "hypercorn.protocol.h11:H11Protocol"
_STREAM = "hypercorn.protocol.http_stream"

RELIES_ON = (
    Internal("hypercorn.config:Config.create_sockets", ("self",)),
    Internal("hypercorn.config:Config.set_statsd_logger_class", ("self", "statsd_logger")),
    Internal("hypercorn.config:Config.response_headers", ("self", "protocol")),
    Internal("hypercorn.utils:wrap_app", ("app", "wsgi_max_body_size", "mode")),
    Internal("hypercorn.utils:repr_socket_addr", ("family", "address")),
    Internal(_LIFESPAN, ("app", "config", "state")),
    Internal(f"{_LIFESPAN}.handle_lifespan", ("self", "task_status")),
    Internal(f"{_LIFESPAN}.wait_for_startup", ("self",)),
    Internal(f"{_LIFESPAN}.wait_for_shutdown", ("self",)),
    Internal("hypercorn.trio.statsd:StatsdLogger"),
    Internal(f"{_CONTEXT}:WorkerContext", ("max_requests",)),
    Internal(f"{_CONTEXT}:WorkerContext.sleep", ("wait",)),
    Internal(f"{_CONTEXT}:WorkerContext.terminated", on_instances=True),
    Internal(f"{_CONTEXT}:TrioSingleTask.restart", ("self", "task_group", "action")),
    Internal(f"{_CONTEXT}:TrioSingleTask.stop", ("self",)),
    Internal("hypercorn.trio.tcp_server:MAX_RECV"),
    Internal(_SERVER, ("app", "config", "context", "state", "stream")),
    Internal(f"{_SERVER}.run", ("self",)),
    Internal(f"{_SERVER}.protocol_send", ("self", "event")),
    Internal(f"{_SERVER}._read_data", ("self",)),
    Internal(f"{_SERVER}._initiate_server_close", ("self",)),
    *(
        Internal(f"{_SERVER}.{name}", on_instances=True)
        for name in ("idle_task", "protocol", "stream", "config", "send_lock")
    ),
    Internal("hypercorn.protocol:ProtocolWrapper.protocol", on_instances=True),
    Internal("hypercorn.protocol:ProtocolWrapper.handle", ("self", "event")),
    *(
        Internal(f"{_H11}.{name}", on_instances=True)
        for name in ("connection", "stream", "keep_alive_requests")
    ),
    Internal(f"{_H11}.stream_send", ("self", "event")),
    *(
        Internal(f"{_STREAM}:HTTPStream.{name}", on_instances=True)
        for name in ("state", "scope", "response", "closed", "stream_id", "send")
    ),
    *(Internal(f"{_STREAM}:ASGIHTTPState.{name}") for name in ("REQUEST", "RESPONSE", "CLOSED")),
    Internal("hypercorn.events:RawData", ("data", "address")),
    Internal("hypercorn.events:Closed", ()),
    Internal("hypercorn.protocol.events:StreamClosed", ("stream_id",)),
)
"""The internals above, for tests/test_pinned_libraries.py."""


class NowaitStream(Protocol):
    """A connection's plain socket stream that can also write without waiting."""

    @property
    def socket(self) -> trio.socket.SocketType: ...

    def send_nowait(self, data: bytes) -> int:
        """Write what the socket takes at once; the number of bytes written (0 also
        when writing fails: the waiting `send_all` reports it)."""
        ...

    async def send_all(self, data: bytes | bytearray | memoryview) -> None: ...

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray: ...

    async def send_eof(self) -> None: ...

    async def aclose(self) -> None: ...


class WriteBounds(Protocol):
    """What bounds a server's writes (`trio_responses._serve.WriteDeadlines`)."""

    def wrap(self, stream: trio.SocketStream) -> NowaitStream:
        """The stream a new connection is served over."""
        ...

    def close_by(self, deadline: float) -> None:
        """No write may last past ``deadline`` (trio time), those waiting now included."""
        ...


_HEADER_NAME = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-z]+")
"""A header name as `_TCPServer.start_chunked` takes it: an HTTP token, lower case."""


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
        self._bounded = cast(NowaitStream, self.stream)  # hypercorn's is typed SSL
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


async def serve_http(
    app: ASGIFramework,
    hconfig: HypercornConfig,
    bounds: WriteBounds,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """Hypercorn's trio worker (``worker_serve``, HTTP/1.1 and h2c over plain
    sockets) with each connection's stream from ``bounds.wrap``.

    Serves until cancelled, or until ``shutdown_trigger`` returns: then stops
    accepting, lets open connections finish for ``hconfig.graceful_timeout``
    and closes what is left, writes included (``bounds.close_by``).
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
                bounded: Any = bounds.wrap(stream)  # hypercorn annotates an SSLStream
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
                bounds.close_by(deadline)
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


__all__ = ["NowaitStream", "WriteBounds", "repr_socket_addr", "serve_http"]
