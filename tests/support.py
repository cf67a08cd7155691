"""Test helpers: a real server on port 0, the openai SDK, a raw SSE client."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h11
import httpx2
import pytest
import trio
import trio.testing
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from trio_responses import (
    Config,
    ResponseHandle,
    ResponsesService,
    open_responses_service,
    serve_service,
)

MODEL = "gpt-oss-scripted"


@dataclass
class Server:
    url: str
    service: ResponsesService
    client: AsyncOpenAI
    http: httpx2.AsyncClient

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


async def assert_nothing_left(server: Server) -> None:
    """No job, job task, subscriber or engine request is left once the server has
    settled: a job goes on for a few steps after its terminal event (its final
    record), so this waits for the jobs to end first (a leak times out)."""
    with trio.fail_after(10):
        await server.service.wait_idle()
        await trio.testing.wait_all_tasks_blocked()
    stats = server.service.statistics()
    assert stats.running_jobs == 0
    assert stats.job_tasks == 0
    assert stats.subscribers == 0
    assert server.service.engine.running_requests == frozenset()  # type: ignore[attr-defined]


async def open_socket(server: Server) -> trio.SocketStream:
    """A raw TCP connection to ``server``."""
    parts = urlsplit(server.url)
    assert parts.hostname is not None and parts.port is not None
    return await trio.open_tcp_stream(parts.hostname, parts.port)


async def read_reply(
    socket: trio.SocketStream, client: h11.Connection
) -> tuple[h11.Response, bytes]:
    """The next response on ``socket``, head and whole body, read and checked by h11
    (``client``, which sent the request) up to its end."""
    head: h11.Response | None = None
    received = bytearray()
    while True:
        event = client.next_event()
        if event is h11.NEED_DATA:
            client.receive_data(await socket.receive_some(65536))
        elif isinstance(event, h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            received.extend(event.data)
        elif isinstance(event, h11.EndOfMessage):
            break
        else:
            raise AssertionError(f"unexpected {event!r}")
    assert head is not None
    return head, bytes(received)


def count_tasks(name_suffix: str = "") -> int:
    """Tasks alive anywhere in this Trio run whose name ends with ``name_suffix``."""
    count = 0
    root = trio.lowlevel.current_root_task()
    assert root is not None
    pending = [root]
    while pending:
        task = pending.pop()
        count += task.name.endswith(name_suffix)
        pending.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return count


async def run_server(
    config: Config, *, task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED
) -> None:
    async with open_responses_service(config) as service, trio.open_nursery() as nursery:
        urls = await nursery.start(serve_service, service)
        url = urls[0]
        key = config.api_keys[0] if config.api_keys else "unused"
        client = AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        async with httpx2.AsyncClient(base_url=url, timeout=30) as http:
            try:
                task_status.started(Server(url, service, client, http))
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await client.close()


@dataclass
class SSEEvent:
    event: str | None
    data: str

    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.data)
        return parsed


def parse_sse(raw: bytes) -> list[SSEEvent]:
    """Split a raw SSE body into events (comments skipped)."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        event_name = None
        data_lines = []
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            field, _, value = line.partition(": ")
            if field == "event":
                event_name = value
            elif field == "data":
                data_lines.append(value)
        if data_lines:
            events.append(SSEEvent(event_name, "\n".join(data_lines)))
    return events


async def read_sse(
    http: httpx2.AsyncClient, method: str, path: str, **kwargs: Any
) -> tuple[int, list[SSEEvent], bytes]:
    """Send a request and read the whole SSE body: (status, events, raw bytes)."""
    chunks = []
    async with http.stream(method, path, **kwargs) as response:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
        status = response.status_code
    raw = b"".join(chunks)
    return status, parse_sse(raw), raw


_STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def validate_event(data: dict[str, Any]) -> Any:
    """Parse an event with the SDK's own type; raises if the shape is wrong."""
    return _STREAM_EVENT.validate_python(data)


def validate_response(data: dict[str, Any]) -> Response:
    """Parse a Response object with the SDK's own type."""
    return Response.model_validate(data)


def check_stream(events: list[dict[str, Any]]) -> None:
    """The invariants every full response stream must satisfy.

    Sequence numbers 0, 1, 2…; one terminal event, last; every event an SDK
    type; items added/done in order with matching ids and indexes; deltas
    adding up to their ``done`` text.
    """
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        validate_event(event)
    terminal = [e for e in events if e["type"] in TERMINAL_TYPES]
    assert len(terminal) == 1 and terminal[0] is events[-1], [e["type"] for e in terminal]
    added: dict[int, str] = {}
    done: set[int] = set()
    texts: dict[tuple[str, str], str] = {}
    for event in events:
        kind = event["type"]
        if kind == "response.output_item.added":
            index = event["output_index"]
            assert index == len(added), "output_index must count up from 0"
            assert all(i in done for i in added), "previous item must be done first"
            added[index] = event["item"]["id"]
        elif kind == "response.output_item.done":
            index = event["output_index"]
            assert added[index] == event["item"]["id"]
            done.add(index)
        elif "item_id" in event:
            assert added[event["output_index"]] == event["item_id"]
            assert event["output_index"] not in done
            if kind.endswith(".delta"):
                key = (event["item_id"], kind.removesuffix(".delta"))
                texts[key] = texts.get(key, "") + event["delta"]
            elif kind.endswith(".done") and kind != "response.content_part.done":
                key = (event["item_id"], kind.removesuffix(".done"))
                final = event.get(
                    "text", event.get("arguments", event.get("code", event.get("input")))
                )
                assert texts.get(key, "") == final, kind
    assert set(added) == done, "every added item must be done"


TERMINAL_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})


class JobSpy:
    """Records the jobs a service creates, so a test can wait on them."""

    def __init__(self, service: ResponsesService, monkeypatch: pytest.MonkeyPatch) -> None:
        self.jobs: list[ResponseHandle] = []
        self._created = trio.Event()
        original = service.create

        async def create(*args: Any, **kwargs: Any) -> ResponseHandle:
            job = await original(*args, **kwargs)
            self.jobs.append(job)
            self._created.set()
            return job

        monkeypatch.setattr(service, "create", create)

    async def first(self) -> ResponseHandle:
        """The first job created (waits for it)."""
        await self._created.wait()
        return self.jobs[0]


class RawSSEClient:
    """A raw HTTP/1.1 client for one SSE response: no library between us and the bytes.

    `read_all` returns the decoded body (chunked encoding removed), so two
    readers of the same log can be compared byte for byte.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.status = 0
        self.body = bytearray()
        self._buffer = bytearray()
        self._eof = False

    @classmethod
    async def open(
        cls,
        server: Server,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        receive_buffer: int | None = None,
    ) -> RawSSEClient:
        parts = urlsplit(server.url)
        assert parts.hostname is not None and parts.port is not None
        sock = trio.socket.socket()
        if receive_buffer is not None:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, receive_buffer)
        await sock.connect((parts.hostname, parts.port))
        client = cls(trio.SocketStream(sock))
        payload = json.dumps(body).encode() if body is not None else b""
        lines = [f"{method} {path} HTTP/1.1", "Host: test"]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        await client.stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        return client

    async def read_head(self) -> int:
        while b"\r\n\r\n" not in self._buffer:
            await self._fill()
        head, _, rest = bytes(self._buffer).partition(b"\r\n\r\n")
        self.status = int(head.split(b" ", 2)[1])
        self._chunked = b"transfer-encoding: chunked" in head.lower()
        self._buffer = bytearray(rest)
        return self.status

    async def read_events(self, count: int) -> list[SSEEvent]:
        """Read until at least ``count`` complete events have arrived."""
        if not self.status:
            await self.read_head()
        while len(parse_sse(bytes(self._complete_body()))) < count:
            await self._fill()
        return parse_sse(bytes(self._complete_body()))

    async def read_until(self, event_type: str) -> list[SSEEvent]:
        """Read until an event of ``event_type`` has arrived; returns the events so far."""
        if not self.status:
            await self.read_head()
        while True:
            events = parse_sse(bytes(self._complete_body()))
            if any(event.event == event_type for event in events):
                return events
            await self._fill()

    async def read_all(self) -> bytes:
        """Read to the end of the response (the last chunk)."""
        if not self.status:
            await self.read_head()
        while not self._body_done():
            await self._fill()
        return bytes(self.body)

    async def aclose(self) -> None:
        await self.stream.aclose()

    def _complete_body(self) -> bytearray:
        self._body_done()
        end = self.body.rfind(b"\n\n")
        return self.body[: end + 2]

    def _body_done(self) -> bool:
        """Move complete chunks from the buffer to the body; True after the last one."""
        if not self._chunked:
            self.body.extend(self._buffer)
            self._buffer.clear()
            return self._eof
        while True:
            line_end = self._buffer.find(b"\r\n")
            if line_end < 0:
                return False
            size = int(self._buffer[:line_end], 16)
            if len(self._buffer) < line_end + 2 + size + 2:
                return False
            start = line_end + 2
            self.body.extend(self._buffer[start : start + size])
            del self._buffer[: start + size + 2]
            if size == 0:
                return True

    async def _fill(self) -> None:
        chunk = await self.stream.receive_some(1 << 16)
        if not chunk:
            self._eof = True
            if self._chunked:
                raise ConnectionError("connection closed inside a chunked body")
            return
        self._buffer.extend(chunk)

    async def at_eof(self) -> bool:
        """True if the server closed the connection (reads what is left)."""
        return await self.stream.receive_some(1 << 16) == b""
