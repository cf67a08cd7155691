"""LangChain's ``ChatOpenAI`` on the Responses API (``use_responses_api=True``).

Sync LangChain calls run in a worker thread while the server runs on the test's
Trio loop; ``ainvoke`` runs in its own asyncio loop in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import openai
import pytest
import trio
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.support import MODEL, Server


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def _chat(server: Server, **options: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=server.base_url,
        api_key="unused",  # type: ignore[arg-type]
        model=MODEL,
        use_responses_api=True,
        max_retries=0,
        timeout=30,
        **options,
    )


def _blocks(message: BaseMessage, kind: str) -> list[dict[str, Any]]:
    assert isinstance(message.content, list)
    return [b for b in message.content if isinstance(b, dict) and b.get("type") == kind]


def _merge(chunks: Sequence[BaseMessage]) -> AIMessageChunk:
    """The streamed message, its chunks added up as LangChain does."""
    assert chunks, "nothing was streamed"
    first, *rest = chunks
    assert isinstance(first, AIMessageChunk)
    whole = first
    for chunk in rest:
        assert isinstance(chunk, AIMessageChunk)
        whole = whole + chunk
    return whole


async def test_invoke(server: Server) -> None:
    message = await trio.to_thread.run_sync(_chat(server).invoke, "hello")
    assert isinstance(message, AIMessage)
    assert message.text == "You said: hello"
    assert message.response_metadata["status"] == "completed"
    assert message.response_metadata["model_name"] == MODEL
    assert str(message.id).startswith("resp_")
    usage = message.usage_metadata
    assert usage is not None
    assert usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    [reasoning] = _blocks(message, "reasoning")
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Thinking about: hello"}]


async def test_ainvoke(server: Server) -> None:
    chat = _chat(server)
    message = await trio.to_thread.run_sync(asyncio.run, chat.ainvoke("hello from asyncio"))
    assert message.text == "You said: hello from asyncio"


async def test_stream(server: Server) -> None:
    chat = _chat(server)
    chunks = await trio.to_thread.run_sync(lambda: list(chat.stream("hello stream")))
    texts = [chunk.text for chunk in chunks if chunk.text]
    assert len(texts) > 1, "the answer arrived in one piece, not streamed"
    assert "".join(texts) == "You said: hello stream"
    whole = _merge(chunks)
    assert whole.usage_metadata is not None
    assert whole.usage_metadata["output_tokens"] > 0


async def _tool_loop(chat: ChatOpenAI) -> tuple[AIMessage, AIMessage]:
    """Ask for two calls in one response, run the tool for each, send both outputs back;
    both AI messages."""
    bound = chat.bind_tools([get_weather])
    messages: list[BaseMessage] = [
        HumanMessage('call:get_weather {"city": "Paris"} call:get_weather {"city": "Oslo"}')
    ]
    call = await trio.to_thread.run_sync(bound.invoke, messages)
    assert isinstance(call, AIMessage)
    assert [(c["name"], c["args"]) for c in call.tool_calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Oslo"}),
    ]
    messages.append(call)
    messages.extend(get_weather.invoke(tool_call) for tool_call in call.tool_calls)
    answer = await trio.to_thread.run_sync(bound.invoke, messages)
    assert isinstance(answer, AIMessage)
    assert answer.tool_calls == []
    assert answer.text == "Tool result: sunny in Oslo"
    return call, answer


async def test_tool_loop_sends_the_history(server: Server) -> None:
    await _tool_loop(_chat(server))


async def test_tool_loop_with_previous_response_id(server: Server) -> None:
    call, answer = await _tool_loop(_chat(server, use_previous_response_id=True))
    # The second turn continued the first one on the server.
    stored = await server.client.responses.retrieve(str(answer.id))
    assert stored.previous_response_id == call.id


async def test_stateless_tool_loop(server: Server) -> None:
    # store=False: nothing is kept; reasoning travels as encrypted_content.
    chat = _chat(server, store=False, include=["reasoning.encrypted_content"])
    call, answer = await _tool_loop(chat)
    [reasoning] = _blocks(call, "reasoning")
    assert reasoning.get("encrypted_content"), "no encrypted reasoning to send back"
    for message in (call, answer):
        with pytest.raises(openai.NotFoundError):
            await server.client.responses.retrieve(str(message.id))


async def test_stream_a_tool_call(server: Server) -> None:
    bound = _chat(server).bind_tools([get_weather])
    chunks = await trio.to_thread.run_sync(
        lambda: list(bound.stream('call:get_weather {"city": "Oslo"}'))
    )
    whole = _merge(chunks)
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == [("get_weather", {"city": "Oslo"})]
