"""A real webhook receiver on a loopback port, scripted per request.

Each request is answered by the next behaviour in its script (then by the
default): a status (``200``, ``503``…, optionally with ``Retry-After``), or
``"hang"`` (read the request, never answer). `close` stops listening (the port
refuses connections) and `open` listens again on the same port. Every request
that arrives is kept (`received`) and announced (`arrivals`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import h11
import trio

Behaviour = int | tuple[int, str] | Literal["hang"]


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    path: str
    answered: int | None = None
    """The status it got (None: hung)."""


@dataclass
class Receiver:
    default: Behaviour = 200
    script: deque[Behaviour] = field(default_factory=deque)
    received: list[Received] = field(default_factory=list)
    port: int = 0
    host: str = "127.0.0.1"
    _scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    _closed: trio.Event = field(default_factory=trio.Event)
    _changed: trio.Event = field(default_factory=trio.Event)
    _nursery: trio.Nursery | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hooks"

    def delivered(self) -> list[Received]:
        """The requests it answered with a 2xx."""
        return [r for r in self.received if r.answered is not None and 200 <= r.answered < 300]

    async def wait_for(self, count: int, *, delivered: bool = False) -> None:
        """Until ``count`` requests (or 2xx deliveries) have arrived (a minute at most)."""
        with trio.fail_after(60):
            while len(self.delivered() if delivered else self.received) < count:
                await self._changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.open()
            task_status.started()
            await trio.sleep_forever()

    async def open(self) -> None:
        assert self._nursery is not None
        self._closed = trio.Event()
        self._scope = await self._nursery.start(self._listen)

    async def close(self) -> None:
        """Stop listening: connections to the port are refused until `open`."""
        self._scope.cancel()
        await self._closed.wait()

    async def _listen(self, *, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        try:
            with trio.CancelScope() as scope:
                listeners = await trio.open_tcp_listeners(self.port, host=self.host)
                self.port = listeners[0].socket.getsockname()[1]
                task_status.started(scope)
                await trio.serve_listeners(self._serve, listeners)
        finally:
            self._closed.set()

    def _announce(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _serve(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read_request(stream, connection)
                if request is None:
                    return
                behaviour = self.script.popleft() if self.script else self.default
                self.received.append(request)
                if behaviour == "hang":
                    self._announce()
                    await trio.sleep_forever()
                status, retry_after = (
                    behaviour if isinstance(behaviour, tuple) else (behaviour, None)
                )
                headers = [("content-length", "2")]
                if retry_after is not None:
                    headers.append(("retry-after", retry_after))
                await stream.send_all(
                    connection.send(h11.Response(status_code=status, headers=headers))
                    + connection.send(h11.Data(data=b"ok"))
                    + connection.send(h11.EndOfMessage())
                )
                request.answered = status
                self._announce()
                connection.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return

    @staticmethod
    async def _read_request(
        stream: trio.SocketStream, connection: h11.Connection
    ) -> Received | None:
        headers: dict[str, str] = {}
        body = b""
        path = ""
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return None
                connection.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                headers = {k.decode().lower(): v.decode() for k, v in event.headers}
                path = event.target.decode()
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return Received(headers, body, path)
            elif isinstance(event, h11.ConnectionClosed):
                return None
