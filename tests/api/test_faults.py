"""No request can end the process: a job, a request handler and a WebSocket session
each end at their own fault, a panic in native code (pyo3's ``PanicException``, a
`BaseException`) included, and everything else goes on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import pytest
import trio
import websockets

from tests.conftest import StartServer
from tests.processes import ServeCommand
from tests.support import MODEL, TERMINAL_TYPES, Server, assert_nothing_left
from trio_responses._lease import ConversationTurn
from trio_responses._recorder import Recorder
from trio_responses.engine import script
from trio_responses.harmony.encoding import get_encoding

PANICKING = "x" * 1_000_000
"""A million letters: one tokenizer call on them panics (its stack overflows)."""


def _panic_type() -> type[BaseException]:
    try:
        get_encoding().encode(PANICKING, disallowed_special=())
    except BaseException as panic:  # pyo3_runtime.PanicException
        assert not isinstance(panic, Exception)
        return type(panic)
    raise AssertionError("the tokenizer took a million letters in one call")


@pytest.fixture(scope="module")
def panic_type() -> type[BaseException]:
    return _panic_type()


async def test_a_megabyte_echo_leaves_the_server_up(nursery: trio.Nursery) -> None:
    server = await ServeCommand.start(nursery)
    async with httpx2.AsyncClient(base_url=server.url, timeout=120) as http:
        echoed = await http.post("/v1/responses", json={"model": MODEL, "input": PANICKING})
        assert echoed.status_code == 200, echoed.text[:300]
        response = echoed.json()
        assert response["status"] in ("completed", "incomplete")
        assert response["output"][-1]["content"][0]["text"].startswith("You said: xxx")
        after = await http.post("/v1/responses", json={"model": MODEL, "input": "still up?"})
        assert after.json()["status"] == "completed"
        # Over WebSocket too: a 4 MB message.
        url = server.url.replace("http", "ws", 1) + "/v1/responses"
        big = json.dumps({"type": "response.create", "model": MODEL, "input": "x" * 4_000_000})

        async def over_websocket() -> str:
            async with asyncio.timeout(120), websockets.connect(url, max_size=None) as ws:
                await ws.send(big)
                while True:
                    event = json.loads(await ws.recv())
                    if event["type"] == "error":  # refused (too long for the context)
                        return f"error {event['status']}"
                    if event["type"] in TERMINAL_TYPES:
                        return str(event["type"])

        terminal = await trio.to_thread.run_sync(lambda: asyncio.run(over_websocket()))
        assert terminal in ("response.completed", "response.incomplete", "error 400"), terminal
    assert await server.stop(timeout_s=60) == 0
    assert b"Traceback" not in server.log, server.log.decode(errors="replace")[-3000:]


async def test_a_panic_inside_a_job_fails_that_response_only(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch, panic_type: type[BaseException]
) -> None:
    server = await start_server()
    encode = get_encoding().encode
    # The scripted model encodes its answer in one call again, as it once did.
    monkeypatch.setattr(script, "_text", lambda text: encode(text, disallowed_special=()))
    other = await server.client.responses.create(
        model=MODEL, input="tokens:40 delay:20", background=True
    )
    failed = await server.client.responses.create(model=MODEL, input=PANICKING)
    assert failed.status == "failed"
    assert failed.error is not None and failed.error.code == "server_error"
    with trio.fail_after(60):
        finished = await server.service.wait(other.id)
    assert finished["status"] == "completed"
    assert len(finished["output"][-1]["content"][0]["text"].split()) >= 10
    again = await server.client.responses.create(model=MODEL, input="still up?")
    assert again.output_text == "You said: still up?"
    await assert_nothing_left(server)


async def test_a_panic_in_a_request_handler_is_a_500(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch, panic_type: type[BaseException]
) -> None:
    server = await start_server()
    created = await server.client.responses.create(model=MODEL, input="hello")

    async def panicking(*args: Any, **kwargs: Any) -> Any:
        raise panic_type("a native library panicked")

    with monkeypatch.context() as patch:
        patch.setattr(server.service, "retrieve", panicking)
        patch.setattr(server.service, "create", panicking)
        retrieved = await server.http.get(f"/v1/responses/{created.id}")
        posted = await server.http.post("/v1/responses", json={"model": MODEL, "input": "x"})
    for reply in (retrieved, posted):
        assert reply.status_code == 500, reply.text
        assert reply.json()["error"]["code"] == "server_error"
    assert (await server.client.responses.retrieve(created.id)).status == "completed"


async def test_a_panic_in_a_websocket_session_is_an_error_event(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch, panic_type: type[BaseException]
) -> None:
    server = await start_server()
    original = server.service.prepare

    async def prepare(body: Any, **kwargs: Any) -> Any:
        if body.get("input") == "panic":
            raise panic_type("a native library panicked")
        return await original(body, **kwargs)

    monkeypatch.setattr(server.service, "prepare", prepare)
    url = server.url.replace("http", "ws", 1) + "/v1/responses"

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with asyncio.timeout(60), websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "panic"}))
            error = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
            while (event := json.loads(await ws.recv()))["type"] not in TERMINAL_TYPES:
                pass
            return error, event

    error, event = await trio.to_thread.run_sync(lambda: asyncio.run(scenario()))
    assert (error["type"], error["status"], error["error"]["code"]) == (
        "error",
        500,
        "server_error",
    )
    assert event["response"]["status"] == "completed"
    await assert_nothing_left(server)


def _failing_once_started(
    original: Callable[..., Awaitable[None]], when: Callable[[Any], bool]
) -> Callable[..., Awaitable[None]]:
    """``original`` (a task of a job), except that where ``when(self)`` it fails with
    a bug as soon as it has started."""

    async def task(self: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        if not when(self):
            await original(self, task_status=task_status)
            return
        task_status.started()
        raise RuntimeError("a bug beside the generation")

    return task


@pytest.mark.parametrize("store_url", ["sqlite", "redis"], indirect=True)
async def test_a_bug_in_recording_fails_that_response_only(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch, store_url: str
) -> None:
    server, other_id = await _serving_another_response(start_server, store_url)
    monkeypatch.setattr(
        Recorder,
        "follow",
        _failing_once_started(Recorder.follow, lambda rec: "fault" in str(rec._job.request.input)),
    )
    failed = await server.client.responses.create(model=MODEL, input="fault tokens:200 delay:5")
    await _assert_only_it_failed(server, failed.id, other_id)


async def test_a_bug_in_the_conversation_lease_fails_that_response_only(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch, store_url: str
) -> None:
    server, other_id = await _serving_another_response(start_server, store_url)
    monkeypatch.setattr(
        ConversationTurn,
        "keep",
        _failing_once_started(ConversationTurn.keep, lambda turn: True),
    )
    conversation = await server.client.conversations.create()
    failed = await server.client.responses.create(
        model=MODEL, input="tokens:200 delay:5", conversation=conversation.id
    )
    await _assert_only_it_failed(server, failed.id, other_id)


async def _serving_another_response(
    start_server: StartServer, store_url: str
) -> tuple[Server, str]:
    """A server on ``store_url`` with a background response generating; its id."""
    server = await start_server(store_url=store_url)
    other = await server.client.responses.create(
        model=MODEL, input="tokens:40 delay:20", background=True
    )
    return server, other.id


async def _assert_only_it_failed(server: Server, failed_id: str, other_id: str) -> None:
    with trio.fail_after(60):
        failed = await server.service.wait(failed_id)
        other = await server.service.wait(other_id)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "server_error"
    assert other["status"] == "completed"
    again = await server.client.responses.create(model=MODEL, input="still up?")
    assert again.output_text == "You said: still up?"
    stored = await server.client.responses.retrieve(failed_id)
    assert stored.status == "failed"
    await assert_nothing_left(server)
