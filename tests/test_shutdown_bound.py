"""Closing is bounded by exactly what the docs state, with everything hostile at once.

`serve_service` returns ``shutdown_grace_s + cleanup_timeout_s`` after its trigger
at the latest, and `ResponsesService.shutdown` too: each job's cleanup (its
engine request aborted, its final state written, its conversation released)
ends by one deadline, however many of its steps hang. Here they all hang: the
store stops answering (every write hangs forever), the engine's abort never
returns, thousands of finished responses wait for another try at their final
record, running responses have readers that never read, WebSocket sessions
stay open. Leaving the service afterwards waits for nothing (no tool servers,
the memory store, the scripted engine).

On trio's autojump clock, so the bound is measured in exact virtual seconds;
every client is in this process (a raw socket on the loopback interface).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing
import wsproto
import wsproto.events

from tests.support import MODEL, TERMINAL_TYPES
from trio_responses import (
    Config,
    ResponseHandle,
    ResponsesService,
    open_responses_service,
    serve_service,
)
from trio_responses import _opening as service_module
from trio_responses._cleanup import cleanup_scope
from trio_responses.engine import Engine
from trio_responses.engine.base import GenerationRequest, GenerationResult, TokenSink
from trio_responses.store.base import State

GRACE_S = 2.0
CLEANUP_S = 1.0
RUNNING = "tokens:100000 delay:5"
"""A response that runs past any grace period here (500 s), a token every 5 ms."""
TINY_BUFFER = 4096
"""A stalled client's receive buffer: the server's writes block soon."""
_FINAL = ("completed", "failed", "incomplete", "cancelled")


class HungStore:
    """The writes of a real state backend, made to hang forever on demand: first only
    the final record of a response (`final_records`), then everything (`dead`)."""

    WRITES = {
        "store": ("put", "delete"),
        "logs": ("append", "finish", "delete", "terminate"),
        "conversations": ("lock", "unlock", "add_items"),
    }

    def __init__(self, state: State) -> None:
        self.final_records = False
        self.dead = False
        for seam, names in self.WRITES.items():
            target = getattr(state, seam)
            for name in names:
                setattr(target, name, self._hanging(getattr(target, name), name))

    def _hanging(self, write: Callable[..., Awaitable[Any]], name: str) -> Callable[..., Any]:
        async def hanging(*args: Any, **kwargs: Any) -> Any:
            final = name == "put" and args[0].response["status"] in _FINAL
            if self.dead or (self.final_records and final):
                await trio.sleep_forever()  # the store stopped answering
            return await write(*args, **kwargs)

        return hanging


class AbortHangs:
    """An engine whose upstream abort never answers: as vLLM's, the abort of a
    cancelled request is a step of the job's cleanup (`cleanup_scope`)."""

    def __init__(self, engine: Engine, budget_s: float) -> None:
        self._engine = engine
        self._budget_s = budget_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, request: GenerationRequest, sink: TokenSink) -> GenerationResult:
        try:
            return await self._engine.generate(request, sink)
        except BaseException:
            with cleanup_scope(self._budget_s):
                await trio.sleep_forever()  # the abort request upstream
            raise


@pytest.fixture
def hanging_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    open_engine = service_module.open_engine

    @asynccontextmanager
    async def open_hanging(config: Config) -> AsyncIterator[Any]:
        async with open_engine(config) as engine:
            yield AbortHangs(engine, config.cleanup_timeout_s)

    monkeypatch.setattr(service_module, "open_engine", open_hanging)


def _config(unrecorded: int, **overrides: Any) -> Config:
    return Config(
        shutdown_grace_s=GRACE_S,
        cleanup_timeout_s=CLEANUP_S,
        max_active_jobs=unrecorded + 8,
        max_queued_jobs=8,
        **overrides,
    )


async def _leave_unrecorded(service: ResponsesService, store: HungStore, count: int) -> None:
    """``count`` finished responses whose final record the store never took: each
    waits for the maintenance task's next try."""
    store.final_records = True
    for index in range(count):
        await service.create({"model": MODEL, "input": f"number {index}"})
    while service.statistics().unrecorded_jobs < min(count, 10_000):  # noqa: ASYNC110
        await trio.sleep(CLEANUP_S)


async def _start_running(service: ResponsesService) -> list[ResponseHandle]:
    """Responses still running at the end of the grace period: background, foreground
    and one on a conversation (its lease to release, too)."""
    conversation = await service.conversations.create({}, owner=None)
    bodies: list[dict[str, Any]] = [
        {"background": True},
        {},
        {"conversation": conversation["id"]},
    ]
    return [await service.create({"model": MODEL, "input": RUNNING, **body}) for body in bodies]


async def test_a_cancelled_response_cleans_up_within_one_budget(
    autojump_clock: trio.testing.MockClock, hanging_abort: None
) -> None:
    """Its engine abort, final record, log retention and conversation release all hang:
    its task ends one budget after the cancel, not one budget per step."""
    async with open_responses_service(_config(0)) as service:
        store = HungStore(service.state)
        conversation = await service.conversations.create({}, owner=None)
        handle = await service.create(
            {
                "model": MODEL,
                "input": RUNNING,
                "background": True,
                "conversation": conversation["id"],
            }
        )
        await trio.sleep(1)
        store.dead = True
        cancelled = trio.current_time()
        assert (await service.cancel(handle.id))["status"] == "cancelled"
        await handle.wait_closed()
        assert trio.current_time() - cancelled == pytest.approx(CLEANUP_S)
        assert service.statistics().unrecorded_jobs == 1  # its final record: retried later


@pytest.mark.parametrize("unrecorded", [300, pytest.param(10_001, marks=pytest.mark.slow)])
async def test_the_service_closes_within_grace_and_cleanup_whatever_hangs(
    autojump_clock: trio.testing.MockClock, hanging_abort: None, unrecorded: int
) -> None:
    async with open_responses_service(_config(unrecorded)) as service:
        store = HungStore(service.state)
        running = await _start_running(service)
        stalled = [handle.subscribe() for handle in running]  # readers that never read
        await _leave_unrecorded(service, store, unrecorded)
        store.dead = True
        await trio.sleep(5 * CLEANUP_S)  # maintenance retries the unrecorded meanwhile
        assert all(handle.status == "in_progress" for handle in running)

        triggered = trio.current_time()
        await service.shutdown(GRACE_S)
        shut_down = trio.current_time() - triggered
    closed = trio.current_time() - triggered
    stats = service.statistics()

    # Every cleanup step of the running responses hangs: they take the whole bound,
    # and not a moment more (with a budget per step, the chain outlasted it).
    assert shut_down == pytest.approx(GRACE_S + CLEANUP_S)
    assert closed == shut_down  # nothing else to wait for here
    assert stats.running_jobs == stats.job_tasks == 0
    # The running ones' final records hung too: they wait with the others, at most 10,000.
    assert stats.unrecorded_jobs == min(unrecorded + len(running), 10_000)
    for handle, subscription in zip(running, stalled, strict=True):
        assert handle.response["error"]["code"] == "server_shutdown"
        events = [event async for event in subscription]
        assert events[-1]["type"] == "response.failed"


async def test_closing_without_shutdown_takes_one_cleanup_budget(
    autojump_clock: trio.testing.MockClock, hanging_abort: None
) -> None:
    async with open_responses_service(_config(0)) as service:
        store = HungStore(service.state)
        running = await _start_running(service)
        await trio.sleep(1)
        store.dead = True
        closing = trio.current_time()
    assert trio.current_time() - closing == pytest.approx(CLEANUP_S)
    assert all(handle.response["error"]["code"] == "server_shutdown" for handle in running)


# -- over HTTP ---------------------------------------------------------------------------


async def _connect(url: str) -> trio.SocketStream:
    """A client socket that takes little and is never read from."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, TINY_BUFFER)
    await sock.connect((host, int(port)))
    return trio.SocketStream(sock)


async def _stalled_stream(url: str, **body: Any) -> trio.SocketStream:
    """A streaming create whose client never reads the answer."""
    client = await _connect(url)
    payload = json.dumps({"model": MODEL, "input": RUNNING, "stream": True, **body}).encode()
    await client.send_all(
        b"POST /v1/responses HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    return client


async def _websocket(url: str, *messages: dict[str, Any]) -> trio.SocketStream:
    """An open WebSocket session of ``/v1/responses`` that sends ``messages`` and never
    reads past the handshake."""
    client = await _connect(url)
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    await client.send_all(ws.send(wsproto.events.Request(host="test", target="/v1/responses")))
    while not any(isinstance(event, wsproto.events.AcceptConnection) for event in ws.events()):
        ws.receive_data(await client.receive_some(TINY_BUFFER))
    for message in messages:
        await client.send_all(ws.send(wsproto.events.TextMessage(json.dumps(message))))
    return client


async def _rest(client: trio.SocketStream) -> bytes:
    """What the client can still read; the connection must have ended (EOF or reset)."""
    received = bytearray()
    while True:
        try:
            chunk = await client.receive_some(1 << 16)
        except trio.BrokenResourceError:  # reset: the server cut its writes short
            break
        if not chunk:
            break
        received.extend(chunk)
    await client.aclose()
    return bytes(received)


async def test_serving_closes_within_grace_and_cleanup_whatever_hangs(
    autojump_clock: trio.testing.MockClock, hanging_abort: None
) -> None:
    stop = trio.Event()
    returned: list[float] = []

    async def serving(
        service: ResponsesService, *, task_status: trio.TaskStatus[list[str]]
    ) -> None:
        await serve_service(service, shutdown_trigger=stop.wait, task_status=task_status)
        returned.append(trio.current_time())

    async with open_responses_service(_config(300, port=0)) as service:
        store = HungStore(service.state)
        async with trio.open_nursery() as nursery:
            url = (await nursery.start(partial(serving, service)))[0]
            clients = [
                await _stalled_stream(url),
                await _stalled_stream(url, background=True),
                await _websocket(
                    url, {"type": "response.create", "model": MODEL, "input": RUNNING}
                ),
                await _websocket(url),  # open, idle
            ]
            running = await _start_running(service)
            await _leave_unrecorded(service, store, 300)
            store.dead = True
            await trio.sleep(5 * CLEANUP_S)  # the stalled clients' writes block by now
            assert service.statistics().running_jobs == len(running) + 3

            triggered = trio.current_time()
            stop.set()
        served = returned[0] - triggered
    closed = trio.current_time() - triggered

    assert served == pytest.approx(GRACE_S + CLEANUP_S)
    assert closed == pytest.approx(served)
    for client in clients[:3]:
        rest = await _rest(client)
        # Their last events never reached them: the writes were cut at the bound.
        assert not any(kind.encode() in rest for kind in TERMINAL_TYPES)
        assert b"data: [DONE]" not in rest
