"""pydantic-ai's ``OpenAIResponsesModel`` against the server (scripted engine).

pydantic-ai runs on asyncio: each agent run goes in its own event loop in a
worker thread while the server runs on the test's Trio loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pydantic
import trio
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.messages import ModelMessage, ToolCallPart
from pydantic_ai.models.openai import OpenAIResponsesModel, OpenAIResponsesModelSettings
from pydantic_ai.providers.openai import OpenAIProvider

from tests.support import MODEL, Server

T = TypeVar("T")


class City(pydantic.BaseModel):
    name: str
    population: int


def _model(server: Server) -> OpenAIResponsesModel:
    provider = OpenAIProvider(base_url=server.base_url, api_key="unused")
    return OpenAIResponsesModel(MODEL, provider=provider)


async def _in_asyncio(run: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return await trio.to_thread.run_sync(lambda: asyncio.run(run()))


TWO_CITIES = 'call:get_weather {"city": "Paris"} call:get_weather {"city": "Oslo"}'


def _weather_agent(server: Server, asked: list[str], **options: Any) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(_model(server), **options)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    return agent


def _calls(message: ModelMessage) -> list[ToolCallPart]:
    return [part for part in message.parts if isinstance(part, ToolCallPart)]


async def test_run(server: Server) -> None:
    agent: Agent[None, str] = Agent(_model(server))
    result = await _in_asyncio(lambda: agent.run("hello"))
    assert result.output == "You said: hello"
    assert result.usage.output_tokens > 0


async def test_stream(server: Server) -> None:
    agent: Agent[None, str] = Agent(_model(server))

    async def stream() -> list[str]:
        async with agent.run_stream("hello") as run:
            return [delta async for delta in run.stream_text(delta=True, debounce_by=None)]

    deltas = await _in_asyncio(stream)
    assert len(deltas) > 1
    assert "".join(deltas) == "You said: hello"


async def test_function_tool_round_trip(server: Server) -> None:
    asked: list[str] = []
    agent = _weather_agent(server, asked)
    result = await _in_asyncio(lambda: agent.run(TWO_CITIES))
    # Both calls came in one response and were run before the answer.
    assert sorted(asked) == ["Oslo", "Paris"]
    assert [len(_calls(m)) for m in result.all_messages() if _calls(m)] == [2]
    assert result.output == "Tool result: sunny in Oslo"


async def test_structured_output(server: Server) -> None:
    agent = Agent(_model(server), output_type=NativeOutput(City))
    result = await _in_asyncio(lambda: agent.run('{"name": "Paris", "population": 2100000}'))
    assert result.output == City(name="Paris", population=2100000)


async def test_websocket_transport(server: Server) -> None:
    settings = OpenAIResponsesModelSettings(openai_transport="websocket")
    asked: list[str] = []
    agent = _weather_agent(server, asked, model_settings=settings)
    result = await _in_asyncio(lambda: agent.run(TWO_CITIES))
    assert sorted(asked) == ["Oslo", "Paris"]
    assert result.output == "Tool result: sunny in Oslo"
