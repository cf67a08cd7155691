"""Test helpers: a real server on port 0, the openai SDK, a raw SSE client."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
import trio
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from trio_responses import Config, ResponsesService, open_responses_service, serve_service
from trio_responses.background.job import Job

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
                final = event.get("text", event.get("arguments", event.get("code")))
                assert texts.get(key, "") == final, kind
    assert set(added) == done, "every added item must be done"


TERMINAL_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})


class JobSpy:
    """Records the jobs a service creates, so a test can wait on them."""

    def __init__(self, service: ResponsesService, monkeypatch: pytest.MonkeyPatch) -> None:
        self.jobs: list[Job] = []
        self._created = trio.Event()
        original = service.create

        async def create(*args: Any, **kwargs: Any) -> Job:
            job = await original(*args, **kwargs)
            self.jobs.append(job)
            self._created.set()
            return job

        monkeypatch.setattr(service, "create", create)

    async def first(self) -> Job:
        """The first job created (waits for it)."""
        await self._created.wait()
        return self.jobs[0]
