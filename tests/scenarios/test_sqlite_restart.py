"""``--store sqlite:///PATH`` across restarts, through real server processes and the SDK.

Each test runs ``trio-responses serve`` children (`ServeCommand`) on one SQLite
file under ``tmp_path``, stops them the hard way (SIGKILL) or gracefully
(SIGTERM), starts a new one on the same file and checks what a client sees:
stored responses, input items, follow-ups, replayed event streams, and the
terminal state of responses the old process was running.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
import pytest
import trio
from openai import AsyncOpenAI
from openai.types.responses import Response

from tests.processes import ServeCommand
from tests.support import MODEL, parse_sse, read_sse, validate_event

POLL_LIMIT_S = 20
"""Most seconds a test waits for a response to change status."""


@dataclass
class Client:
    """The SDK and a raw HTTP client on one server process."""

    sdk: AsyncOpenAI
    http: httpx2.AsyncClient


@asynccontextmanager
async def connect(command: ServeCommand) -> AsyncIterator[Client]:
    sdk = AsyncOpenAI(base_url=command.url + "/v1", api_key="unused", max_retries=0)
    try:
        async with httpx2.AsyncClient(base_url=command.url, timeout=30) as http:
            yield Client(sdk, http)
    finally:
        with trio.CancelScope(shield=True):
            await sdk.close()


def sqlite_flags(path: pathlib.Path, *more: str) -> tuple[str, ...]:
    return ("--store", f"sqlite:///{path}", *more)


async def poll_status(
    client: Client, response_id: str, *, until: frozenset[str], limit_s: float = POLL_LIMIT_S
) -> Response:
    """Retrieve ``response_id`` until its status is one of ``until`` (at most ``limit_s``)."""
    with trio.fail_after(limit_s):
        while True:
            response = await client.sdk.responses.retrieve(response_id)
            if response.status in until:
                return response
            await trio.sleep(0.02)


FINISHED = frozenset({"completed", "incomplete", "failed", "cancelled"})


async def stream_again(
    client: Client, response_id: str, starting_after: int | None = None
) -> tuple[list[dict[str, Any]], bytes]:
    """``GET /v1/responses/{id}?stream=true[&starting_after=N]`` to its end:
    (the events' payloads, the raw body). Checks the framing on the way."""
    path = f"/v1/responses/{response_id}?stream=true"
    if starting_after is not None:
        path += f"&starting_after={starting_after}"
    with trio.fail_after(POLL_LIMIT_S):
        status, events, raw = await read_sse(client.http, "GET", path)
    assert status == 200, raw
    assert raw.endswith(b"data: [DONE]\n\n"), raw[-200:]
    assert events[-1].data == "[DONE]"
    payloads = [event.json() for event in events[:-1]]
    for event, payload in zip(events, payloads, strict=False):
        assert event.event == payload["type"]
        validate_event(sdk_shaped(payload))
    return payloads, raw


SERVER_ERROR_CODES = frozenset({"server_restarted", "server_shutdown"})
"""Error codes of SPEC §8/§12 that the SDK's ``ResponseError.code`` literal does not list
(the SDK parses responses without validating, so its clients still read them)."""


def sdk_shaped(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with our own error codes replaced by the SDK's ``server_error``, so that
    the rest of its shape can be validated strictly."""
    response = payload.get("response")
    if not isinstance(response, dict):
        return payload
    error = response.get("error")
    if not (isinstance(error, dict) and error.get("code") in SERVER_ERROR_CODES):
        return payload
    return {**payload, "response": {**response, "error": {**error, "code": "server_error"}}}


def error_code(response: Response) -> str | None:
    """The error code of ``response`` as sent (a plain string: see `SERVER_ERROR_CODES`)."""
    return None if response.error is None else str(response.error.code)


def dump(response: Response) -> dict[str, Any]:
    return response.model_dump(mode="json")


async def list_input_items(client: Client, response_id: str) -> list[dict[str, Any]]:
    page = client.sdk.responses.input_items.list(response_id, order="asc", limit=100)
    return [item.model_dump(mode="json") async for item in page]


async def test_restart_after_kill_keeps_finished_responses_and_fails_running_ones(
    nursery: trio.Nursery, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "responses.db"
    first = await ServeCommand.start(nursery, *sqlite_flags(path))
    async with connect(first) as a:
        # (a) a finished foreground response with several input items.
        conversation = await a.sdk.responses.create(
            model=MODEL,
            instructions="Be brief.",
            input=[
                {"role": "developer", "content": "Answer in English."},
                {"role": "user", "content": "My name is Ada."},
                {"role": "assistant", "content": "Hello Ada."},
                {"role": "user", "content": "What is my name?"},
            ],
        )
        assert conversation.status == "completed"
        conversation_items = await list_input_items(a, conversation.id)
        assert len(conversation_items) == 4
        # (b) its follow-up.
        follow_up = await a.sdk.responses.create(
            model=MODEL, input="And my surname?", previous_response_id=conversation.id
        )
        assert follow_up.status == "completed" and follow_up.usage is not None
        # (c) a finished background response, and its whole event log.
        finished = await a.sdk.responses.create(model=MODEL, input="tokens:40", background=True)
        finished_done = await poll_status(a, finished.id, until=FINISHED)
        assert finished_done.status == "completed"
        finished_log, _ = await stream_again(a, finished.id)
        assert finished_log[-1]["type"] == "response.completed"
        # (d) a background response still running when the process dies.
        body = {
            "model": MODEL,
            "input": "tokens:5000 delay:20",
            "background": True,
            "stream": True,
        }
        async with a.http.stream("POST", "/v1/responses", json=body) as live:
            assert live.status_code == 200
            raw = b""
            async for chunk in live.aiter_bytes():
                raw += chunk
                seen = parse_sse(raw[: raw.rfind(b"\n\n") + 2])
                if len(seen) >= 20:
                    break
            running_id: str = seen[0].json()["response"]["id"]
            seen_log = [event.json() for event in seen]
            assert [e["sequence_number"] for e in seen_log] == list(range(len(seen_log)))
            assert first.process.returncode is None
            assert await first.kill() == -9  # no shutdown: the file is left as it was
        with pytest.raises(openai.APIConnectionError):
            await a.sdk.responses.retrieve(conversation.id)

    second = await ServeCommand.start(nursery, *sqlite_flags(path))
    async with connect(second) as b:
        # Finished responses are there as they were.
        assert dump(await b.sdk.responses.retrieve(conversation.id)) == dump(conversation)
        assert dump(await b.sdk.responses.retrieve(follow_up.id)) == dump(follow_up)
        assert await list_input_items(b, conversation.id) == conversation_items
        # A new turn continues the stored chain (a -> b -> new).
        third = await b.sdk.responses.create(
            model=MODEL, input="Thanks.", previous_response_id=follow_up.id
        )
        assert third.status == "completed" and third.usage is not None
        assert third.usage.input_tokens > follow_up.usage.input_tokens
        assert third.previous_response_id == follow_up.id

        # The finished background response's log replays from any cursor.
        assert dump(await b.sdk.responses.retrieve(finished.id)) == dump(finished_done)
        after = 9
        tail, _ = await stream_again(b, finished.id, starting_after=after)
        assert tail == finished_log[after + 1 :]
        whole, _ = await stream_again(b, finished.id)
        assert whole == finished_log
        with trio.fail_after(POLL_LIMIT_S):
            async with b.sdk.responses.stream(
                response_id=finished.id, starting_after=after
            ) as resumed:
                numbers = [event.sequence_number async for event in resumed]
                resumed_final = await resumed.get_final_response()
        assert numbers == list(range(after + 1, len(finished_log)))
        assert resumed_final.id == finished.id
        assert resumed_final.output_text == finished_done.output_text

        # The response that was running is failed (server_restarted)...
        interrupted = await b.sdk.responses.retrieve(running_id)
        assert interrupted.status == "failed"
        assert error_code(interrupted) == "server_restarted"
        # ...and its stream replays what was persisted, then that terminal event.
        replayed, _ = await stream_again(b, running_id)
        assert [e["sequence_number"] for e in replayed] == list(range(len(replayed)))
        terminal = replayed[-1]
        assert terminal["type"] == "response.failed"
        assert terminal["response"]["id"] == running_id
        assert terminal["response"]["status"] == "failed"
        assert terminal["response"]["error"]["code"] == "server_restarted"
        assert all(e["type"] != "response.failed" for e in replayed[:-1])
        stored = await b.http.get(f"/v1/responses/{running_id}")
        assert terminal["response"] == stored.json()
        persisted = replayed[:-1]
        assert [e["type"] for e in persisted[:3]] == [
            "response.created",
            "response.queued",
            "response.in_progress",
        ]
        # What was persisted is what the live stream sent (as far as both go).
        overlap = min(len(persisted), len(seen_log))
        assert persisted[:overlap] == seen_log[:overlap]
        # Resuming inside the persisted part gives the rest of it.
        tail, _ = await stream_again(b, running_id, starting_after=1)
        assert tail == replayed[2:]

        # Ids never stored are still unknown.
        with pytest.raises(openai.NotFoundError):
            await b.sdk.responses.retrieve("resp_" + "0" * 32)
        missing = await b.http.get(f"/v1/responses/resp_{'0' * 32}?stream=true")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"

    assert await second.stop() == 0, second.log.decode()
    assert b"Traceback" not in second.log


async def test_a_second_process_on_the_same_file_is_refused(
    nursery: trio.Nursery, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "responses.db"
    owner = await ServeCommand.start(nursery, *sqlite_flags(path))
    async with connect(owner) as client:
        response = await client.sdk.responses.create(model=MODEL, input="mine")
        intruder = await ServeCommand.start(nursery, *sqlite_flags(path), ready=False)
        code = await intruder.wait()
        assert code != 0, intruder.log.decode()
        log = intruder.log.decode()
        assert f"cannot use the store sqlite:///{path}" in log
        assert "in use by another trio-responses process" in log
        assert "listening on" not in log and "Traceback" not in log
        # The process that owns the file goes on as before.
        assert dump(await client.sdk.responses.retrieve(response.id)) == dump(response)
        again = await client.sdk.responses.create(
            model=MODEL, input="still here", previous_response_id=response.id
        )
        assert again.status == "completed"
    assert await owner.stop() == 0, owner.log.decode()


async def test_graceful_restart_keeps_the_shutdown_failure(
    nursery: trio.Nursery, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "responses.db"
    first = await ServeCommand.start(nursery, *sqlite_flags(path, "--shutdown-grace", "0.5"))
    async with connect(first) as a:
        created = await a.sdk.responses.create(
            model=MODEL, input="tokens:5000 delay:20", background=True
        )
        path_live = f"/v1/responses/{created.id}?stream=true"
        async with a.http.stream("GET", path_live) as live:
            assert live.status_code == 200
            raw = b""
            chunks = live.aiter_bytes()
            async for chunk in chunks:
                raw += chunk
                if b"event: response.output_text.delta" in raw:
                    break
            started = trio.current_time()
            first.terminate()  # SIGTERM: a graceful shutdown
            with trio.fail_after(POLL_LIMIT_S):
                async for chunk in chunks:
                    raw += chunk
        assert raw.endswith(b"data: [DONE]\n\n"), raw[-300:]
        live_log = [event.json() for event in parse_sse(raw)[:-1]]
    assert await first.wait() == 0, first.log.decode()
    assert trio.current_time() - started < POLL_LIMIT_S
    terminal = live_log[-1]
    assert terminal["type"] == "response.failed"
    assert terminal["response"]["error"]["code"] == "server_shutdown"
    assert [e["sequence_number"] for e in live_log] == list(range(len(live_log)))

    second = await ServeCommand.start(nursery, *sqlite_flags(path))
    async with connect(second) as b:
        stored = await b.sdk.responses.retrieve(created.id)
        assert stored.status == "failed"
        assert error_code(stored) == "server_shutdown"
        replayed, _ = await stream_again(b, created.id)
        assert replayed == live_log
        tail, _ = await stream_again(b, created.id, starting_after=len(live_log) - 3)
        assert tail == live_log[-2:]
    # Recovery at start (before listening) found nothing to do.
    assert b"server_restarted" not in second.log
    assert await second.stop() == 0, second.log.decode()


async def test_unstored_responses_are_not_in_the_file(
    nursery: trio.Nursery, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "responses.db"
    first = await ServeCommand.start(nursery, *sqlite_flags(path))
    async with connect(first) as a:
        stored = await a.sdk.responses.create(model=MODEL, input="keep me")
        unstored = await a.sdk.responses.create(model=MODEL, input="forget me", store=False)
        assert unstored.status == "completed" and unstored.output_text == "You said: forget me"
        streamed = await a.sdk.responses.create(
            model=MODEL, input="forget me too", store=False, stream=True
        )
        events = [event async for event in streamed]
        assert events[-1].type == "response.completed"
        unstored_ids = [unstored.id, events[-1].response.id]
        for response_id in unstored_ids:
            with pytest.raises(openai.NotFoundError):
                await a.sdk.responses.retrieve(response_id)
        with pytest.raises(openai.BadRequestError) as refused:
            await a.sdk.responses.create(model=MODEL, input="x", store=False, background=True)
        assert refused.value.param == "background"
        await first.kill()

    second = await ServeCommand.start(nursery, *sqlite_flags(path))
    async with connect(second) as b:
        assert dump(await b.sdk.responses.retrieve(stored.id)) == dump(stored)
        for response_id in unstored_ids:
            with pytest.raises(openai.NotFoundError):
                await b.sdk.responses.retrieve(response_id)
            with pytest.raises(openai.NotFoundError):
                await b.sdk.responses.input_items.list(response_id)
            with pytest.raises(openai.NotFoundError):
                await b.sdk.responses.create(
                    model=MODEL, input="continue", previous_response_id=response_id
                )
    assert await second.stop() == 0, second.log.decode()
