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

The accept loop is hypercorn's trio worker (``hypercorn.trio.run.worker_serve``),
put together again in `trio_responses._adapters.hypercorn` (the one module that
touches hypercorn's internals) with one change: every connection's socket stream
is a `BoundedWriteStream`.
Hypercorn writes to the socket inside a shielded cancel scope with no deadline,
so a client that stops reading blocks its handler for as long as the kernel
keeps the connection: that write ignores the graceful-shutdown deadline, which
is why a shutdown used to wait minutes for such a client, and the stream's
subscription (and with it its response's event log) stayed pinned. Each write
now has a deadline (``sse_write_timeout_s``, and the end of the graceful
shutdown); a write that misses it aborts the connection, which the app sees as
a disconnect.

Most writes need no waiting: the socket takes the bytes at once. The adapter's
connection handler writes those synchronously (`BoundedWriteStream.send_nowait`), skipping the
send lock, the shielded scope, the deadline scope and the checkpoints of the
waiting path; only what the socket does not take at once goes that way.

With ``reuse_port`` the listening socket is bound here with ``SO_REUSEPORT``
(`bind_shared`) and handed to hypercorn: several processes then listen on one
port, each taking a share of its new connections (``serve --workers N``:
`trio_responses._workers`).

The server speaks HTTP/1.1 and h2c over plain TCP: it has no TLS settings (put a
TLS-terminating proxy in front of it), nor hypercorn's ``max_requests``.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from functools import partial
from typing import final

import trio
from hypercorn.config import Config as HypercornConfig

from ._adapters.hypercorn import repr_socket_addr, serve_http
from ._config import Config
from ._exceptions import StartupError
from ._opening import open_responses_service
from ._service import ResponsesService
from .api.app import create_asgi_app
from .api.asgi import shield_final_send

logger = logging.getLogger("trio_responses.serve")

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


def bind_shared(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT`` (not listening yet):
    every process that binds the port so and listens gets a share of its new
    connections, spread by the kernel. Port 0 picks a free port.

    Raises:
        StartupError: the address cannot be bound (another process holds the port
            without ``SO_REUSEPORT``, or as another user; not this machine's address).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host.strip("[]"), port))
    except OSError as error:
        sock.close()
        reason = error.strerror or str(error)
        raise StartupError(
            f"cannot listen on {host}:{port} with SO_REUSEPORT: {reason}; another process "
            "may hold the port without sharing it: stop it, or choose another --port"
        ) from error
    return sock


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
    if config.reuse_port:
        # Hypercorn sets SO_REUSEPORT only for its own worker processes: bind here,
        # and hand it the socket (its ``fd://`` bind takes the descriptor over).
        hconfig.bind = [f"fd://{bind_shared(config.host, config.port).detach()}"]
    deadlines = WriteDeadlines(config.sse_write_timeout_s)
    if shutdown_trigger is None:
        await serve_http(app, hconfig, deadlines, shutdown_trigger=None, task_status=task_status)
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
            partial(serve_http, app, hconfig, deadlines, shutdown_trigger=stopping.wait)
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


__all__ = ["bind_shared", "hypercorn_config", "serve", "serve_service"]
