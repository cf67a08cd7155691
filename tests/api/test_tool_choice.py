"""``tool_choice`` is enforced: ``required`` and a named function always give a call.

The scripted model answers plain text ("You said: ...") unless the text has a
directive, so a call in these tests comes from the server's steering: the call
header is prefilled and the arguments constrained to the tool's parameters.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import openai
import trio
from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool

from tests.conftest import StartServer
from tests.support import MODEL, Server, check_stream, read_sse

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
TIME = {
    "type": "function",
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string"}},
        "required": ["zone"],
    },
}


def _calls(output: list[Any]) -> list[Any]:
    return [item for item in output if item.type == "function_call"]


async def test_required_without_a_directive_still_calls(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL, input="What's the weather?", tools=[WEATHER], tool_choice="required"
    )
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    call = response.output[-1]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert response.tool_choice == "required"


async def test_named_function_is_the_one_called(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input='Weather? call:get_weather {"city": "Oslo", "unit": "celsius"}',
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "name": "get_time"},
    )
    (call,) = _calls(response.output)
    assert call.name == "get_time"
    jsonschema.validate(json.loads(call.arguments), TIME["parameters"])


async def test_named_function_uses_the_arguments_the_user_gave(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input='call:get_weather {"city": "Oslo", "unit": "celsius"}',
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    (call,) = _calls(response.output)
    assert json.loads(call.arguments) == {"city": "Oslo", "unit": "celsius"}


async def test_required_chooses_among_several_tools(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input='Which time is it? call:get_time {"zone": "UTC"} (not a known directive order)',
        tools=[WEATHER, TIME],
        tool_choice="required",
    )
    (call,) = _calls(response.output)
    assert call.name == "get_time" and json.loads(call.arguments) == {"zone": "UTC"}

    plain = await server.client.responses.create(
        model=MODEL, input="Just chat.", tools=[WEATHER, TIME], tool_choice="required"
    )
    (call,) = _calls(plain.output)
    assert call.name in ("get_weather", "get_time")


async def test_forced_call_streams_like_a_generated_one(server: Server) -> None:
    body = {
        "model": MODEL,
        "input": "hello",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "stream": True,
    }
    status, events, _ = await read_sse(server.http, "POST", "/v1/responses", json=body)
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    check_stream(payloads)
    types = [payload["type"] for payload in payloads]
    assert "response.function_call_arguments.delta" in types
    assert "response.output_text.delta" not in types
    done = next(p for p in payloads if p["type"] == "response.function_call_arguments.done")
    final = payloads[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"][-1]["arguments"] == done["arguments"]
    assert final["usage"]["output_tokens"] > 0


async def test_the_turn_after_the_output_is_not_forced_again(server: Server) -> None:
    first = await server.client.responses.create(
        model=MODEL, input="weather please", tools=[WEATHER], tool_choice="auto"
    )
    assert not _calls(first.output)  # auto: the scripted model just answers
    forced = await server.client.responses.create(
        model=MODEL, input="weather please", tools=[WEATHER], tool_choice="required"
    )
    (call,) = _calls(forced.output)
    answered = await server.client.responses.create(
        model=MODEL,
        previous_response_id=forced.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
        tool_choice="auto",
    )
    assert answered.output_text == "Tool result: sunny"


async def test_none_never_calls(server: Server) -> None:
    response = await server.client.responses.create(
        model=MODEL,
        input='call:get_weather {"city": "Paris", "unit": "celsius"}',
        tools=[WEATHER],
        tool_choice="none",
    )
    assert not _calls(response.output)
    assert response.output_text.startswith("You said: call:get_weather")


async def test_hosted_code_interpreter_choice_runs_code(start_server: StartServer) -> None:
    python_server = await start_server(
        code_interpreter=True, python_cpu_s=2, python_wall_s=10, python_memory_mb=256
    )
    response = await python_server.client.responses.create(
        model=MODEL,
        input="no code block here",
        tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
        tool_choice={"type": "code_interpreter"},
    )
    types = [item.type for item in response.output]
    assert types[:2] == ["reasoning", "code_interpreter_call"], types
    assert response.output_text.startswith("Tool result: You said: no code block here")


async def test_agents_sdk_forced_tool_then_final_output(server: Server) -> None:
    """The SDK resets tool_choice after a call (reset_tool_choice): no endless loop."""
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        seen.append(city)
        return "sunny"

    async def scenario() -> object:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        agent = Agent(
            name="weather",
            instructions="Answer questions about the weather.",
            tools=[get_weather],
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            model_settings=ModelSettings(tool_choice="required"),
        )
        try:
            async with asyncio.timeout(60):
                result = await Runner.run(
                    agent,
                    "How is it outside?",
                    max_turns=4,
                    run_config=RunConfig(tracing_disabled=True),
                )
        finally:
            await client.close()
        return result.final_output

    final_output = await trio.to_thread.run_sync(lambda: asyncio.run(scenario()))
    assert len(seen) == 1
    assert final_output == "Tool result: sunny"


async def test_the_choice_among_tools_continues_the_turn_so_far(
    server: Server, monkeypatch: Any
) -> None:
    from trio_responses.harmony.encoding import get_encoding

    engine = server.service.engine
    original = engine.generate
    prompts: list[tuple[str, str]] = []

    async def generate(request: Any, sink: Any) -> Any:
        prompts.append((type(request.constraint).__name__, request.prompt_token_ids))
        return await original(request, sink)

    monkeypatch.setattr(engine, "generate", generate)
    response = await server.client.responses.create(
        model=MODEL, input="Just chat.", tools=[WEATHER, TIME], tool_choice="required"
    )
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    encoding = get_encoding()
    (choice,) = [encoding.decode(list(p)) for kind, p in prompts if kind == "ChoiceConstraint"]
    turn = choice[choice.rindex("<|start|>user") :]
    # The choice sees the reasoning already written, then one new message header.
    assert turn.endswith(
        "<|start|>assistant<|channel|>analysis<|message|>Thinking about: Just chat.<|end|>"
        "<|start|>assistant<|channel|>"
    ), turn
    assert "<|start|>assistant<|start|>assistant" not in choice


async def test_forced_calls_stay_within_max_output_tokens(server: Server) -> None:
    for tools in ([WEATHER], [WEATHER, TIME]):
        for limit in (16, 20):
            response = await server.client.responses.create(
                model=MODEL,
                input="What now?",
                tools=tools,
                tool_choice="required",
                max_output_tokens=limit,
            )
            assert response.status == "incomplete"
            assert response.incomplete_details is not None
            assert response.incomplete_details.reason == "max_output_tokens"
            assert response.usage is not None and response.usage.output_tokens <= limit
    # With room enough, the call is made and its tokens (the choice's too) are counted.
    roomy = await server.client.responses.create(
        model=MODEL, input="What now?", tools=[WEATHER, TIME], tool_choice="required"
    )
    (call,) = _calls(roomy.output)
    assert call.name in ("get_weather", "get_time")
    assert roomy.usage is not None and roomy.usage.output_tokens > 20


async def test_invalid_function_parameters_are_a_400(server: Server) -> None:
    for parameters, fragment in (
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "does not resolve"),
        ({"type": "object", "properties": {"a": {"minLength": "5"}}}, "is not of type"),
    ):
        tool = {"type": "function", "name": "f", "parameters": parameters}
        body = {"model": MODEL, "input": "go", "tools": [WEATHER, tool], "tool_choice": "required"}
        reply = await server.http.post("/v1/responses", json=body)
        assert reply.status_code == 400, parameters
        error = reply.json()["error"]
        assert error["param"] == "tools[1].parameters"
        assert error["code"] == "invalid_json_schema"
        assert fragment in error["message"] and "'f'" in error["message"]
    # No parameters, or {}, are fine (any arguments).
    for tool in (
        {"type": "function", "name": "f"},
        {"type": "function", "name": "f", "parameters": {}},
    ):
        body = {"model": MODEL, "input": "go", "tools": [tool], "tool_choice": "required"}
        reply = await server.http.post("/v1/responses", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["output"][-1]["type"] == "function_call"
