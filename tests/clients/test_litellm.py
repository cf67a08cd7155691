"""LiteLLM's Responses API client (``litellm.responses`` / ``litellm.aresponses``).

LiteLLM must stay offline: the bundled model cost map and offline mode are forced
before it is imported, and `loopback_only` fails a test that resolved any host but
the local server's. Async LiteLLM calls run in their own asyncio loop in a worker
thread, while the server runs on the test's Trio loop.
"""

from __future__ import annotations

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["LITELLM_OFFLINE_MODE"] = "true"
os.environ.setdefault("LITELLM_TELEMETRY", "False")

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import litellm
import openai
import pytest
import trio

from tests.support import MODEL, Server

T = TypeVar("T")

pytestmark = [
    # LiteLLM's own pydantic models warn while it imports and serialises them.
    pytest.mark.filterwarnings(
        "ignore:Items? .* (is|are) using the .ReadOnly. qualifier:UserWarning"
    ),
    pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning"),
]

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Refuse (and report) any name resolution but loopback's during the test."""
    attempts: list[str] = []
    resolve = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in LOOPBACK:
            attempts.append(name)
            raise OSError(f"this test talks to loopback only, not {name!r}")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)
    yield
    assert attempts == [], f"LiteLLM tried to reach the network: {attempts}"


def _options(server: Server) -> dict[str, Any]:
    return {"api_base": server.base_url, "api_key": "unused", "custom_llm_provider": "openai"}


async def _in_asyncio(make: Callable[[], Awaitable[T]]) -> T:
    """Run one LiteLLM coroutine in a fresh asyncio loop in a worker thread."""

    async def main() -> T:
        return await make()

    return await trio.to_thread.run_sync(asyncio.run, main())


async def test_responses_sync(server: Server) -> None:
    response = await trio.to_thread.run_sync(
        lambda: litellm.responses(model=MODEL, input="hello", **_options(server))
    )
    assert response.status == "completed"
    assert response.output_text == "You said: hello"
    assert response.usage is not None
    assert response.usage.input_tokens > 0


async def test_aresponses(server: Server) -> None:
    response = await _in_asyncio(
        lambda: litellm.aresponses(
            model=MODEL, input="hi", instructions="Be brief.", **_options(server)
        )
    )
    assert response.status == "completed"
    [reasoning, message] = response.output
    assert reasoning.type == "reasoning"
    assert message.type == "message"
    assert message.content[0].text == "You said: hi"


async def test_aresponses_stream(server: Server) -> None:
    async def stream() -> list[Any]:
        events = await litellm.aresponses(
            model=MODEL, input="hello stream", stream=True, **_options(server)
        )
        return [event async for event in events]

    events = await _in_asyncio(stream)
    types = [
        str(event.type.value if hasattr(event.type, "value") else event.type) for event in events
    ]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 1
    assert "".join(deltas) == "You said: hello stream"
    assert events[-1].response.output_text == "You said: hello stream"


async def test_function_call_round_trip(server: Server) -> None:
    async def loop() -> tuple[Any, Any]:
        call = await litellm.aresponses(
            model=MODEL,
            input='call:get_weather {"city": "Paris"} call:get_weather {"city": "Oslo"}',
            tools=[WEATHER_TOOL],
            **_options(server),
        )
        calls = [item for item in call.output if item.type == "function_call"]
        answer = await litellm.aresponses(
            model=MODEL,
            previous_response_id=call.id,
            input=[
                {
                    "type": "function_call_output",
                    "call_id": function_call.call_id,
                    "output": f"sunny {index}",
                }
                for index, function_call in enumerate(calls)
            ],
            tools=[WEATHER_TOOL],
            **_options(server),
        )
        return calls, answer

    calls, answer = await _in_asyncio(loop)
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_weather", '{"city": "Oslo"}'),
    ]
    assert answer.output_text == "Tool result: sunny 1"


async def test_retrieve_and_delete(server: Server) -> None:
    options = _options(server)

    async def lifecycle() -> tuple[Any, Any, Any]:
        created = await litellm.aresponses(model=MODEL, input="keep me", **options)
        fetched = await litellm.aget_responses(response_id=created.id, **options)
        deleted = await litellm.adelete_responses(response_id=created.id, **options)
        return created, fetched, deleted

    created, fetched, deleted = await _in_asyncio(lifecycle)
    assert fetched.status == "completed"
    assert fetched.output_text == "You said: keep me"
    assert deleted.deleted is True
    # LiteLLM wraps the id; the server's own id is gone for every client.
    assert deleted.id.startswith("resp_")
    with pytest.raises(openai.NotFoundError):
        await server.client.responses.retrieve(deleted.id)
    with pytest.raises(litellm.NotFoundError):
        await _in_asyncio(lambda: litellm.aget_responses(response_id=created.id, **options))
