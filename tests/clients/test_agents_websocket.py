"""The Agents SDK's WebSocket model (``OpenAIResponsesWSModel``) running tool loops.

The SDK runs on asyncio: the agent runs in its own asyncio loop in a worker thread,
while the server runs on the test's Trio loop.
"""

from __future__ import annotations

import asyncio
import logging

import openai
import pytest
import trio
from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
from agents.models.openai_responses import OpenAIResponsesWSModel

from tests.support import MODEL, Server

ROUND_TRIPS = 20


async def test_twenty_tool_round_trips_on_one_connection(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "trio_responses.api")
    looked_up: list[int] = []

    @function_tool
    def lookup(n: int) -> str:
        """Look up entry n of the table."""
        looked_up.append(n)
        return f"entry {n} is {n * n}"

    async def scenario() -> tuple[list[str], set[int], list[str | None]]:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        model = OpenAIResponsesWSModel(MODEL, client)
        agent = Agent(
            name="table",
            instructions="Answer with the table's entries.",
            model=model,
            tools=[lookup],
            # Nothing stored: every continuation comes from the connection itself.
            model_settings=ModelSettings(store=False),
        )
        answers: list[str] = []
        connections: set[int] = set()
        previous_ids: list[str | None] = []
        previous: str | None = None
        try:
            for n in range(ROUND_TRIPS):
                result = await Runner.run(
                    agent,
                    f'call:lookup {{"n": {n}}} call:lookup {{"n": {n + 100}}}',
                    previous_response_id=previous,
                    auto_previous_response_id=True,
                    run_config=RunConfig(tracing_disabled=True),
                )
                answers.append(str(result.final_output))
                connections.add(id(model._ws_connection))
                previous_ids.append(previous)
                previous = result.last_response_id
        finally:
            await model.close()
            await client.close()
        return answers, connections, previous_ids

    async def bounded() -> tuple[list[str], set[int], list[str | None]]:
        async with asyncio.timeout(120):
            return await scenario()

    answers, connections, previous_ids = await trio.to_thread.run_sync(
        lambda: asyncio.run(bounded())
    )
    # Two calls a turn, in one response: both run before the answer.
    assert sorted(looked_up) == sorted([*range(ROUND_TRIPS), *range(100, 100 + ROUND_TRIPS)])
    answers_expected = [
        f"Tool result: entry {n + 100} is {(n + 100) ** 2}" for n in range(ROUND_TRIPS)
    ]
    assert answers == answers_expected
    assert len(connections) == 1  # the SDK kept one connection...
    opened = [r for r in caplog.records if r.getMessage() == "WebSocket /v1/responses opened"]
    assert len(opened) == 1  # ...and the server saw one upgrade
    assert all(previous is not None for previous in previous_ids[1:])
    # Nothing was stored: the chain lived on the connection only.
    with pytest.raises(openai.NotFoundError):
        await server.client.responses.retrieve(str(previous_ids[-1]))
