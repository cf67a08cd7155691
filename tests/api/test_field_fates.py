"""Every field the openai SDK can send to ``responses.create`` has a fate here.

The lists are read from the installed SDK's own types (``ResponseCreateParams``, the
WebSocket ``response.create`` event, ``Reasoning``, ``ResponseTextConfigParam``), so a
field a new SDK adds fails `test_every_sdk_field_has_a_fate` until it is placed:
honoured (a field of `CreateRequest` the server acts on), accepted and ignored
(`IGNORED_FIELDS`, documented in docs/api.md) or refused with a 400 that says why
(`UNSUPPORTED_FIELDS`).
"""

from __future__ import annotations

import typing
from typing import Any

import pytest
from openai.types.responses import response_create_params, responses_client_event_param
from openai.types.responses.response_text_config_param import ResponseTextConfigParam
from openai.types.shared_params.reasoning import Reasoning as SdkReasoning

from tests.support import MODEL, Server
from trio_responses.protocol.request import (
    IGNORED_FIELDS,
    UNSUPPORTED_FIELDS,
    CreateRequest,
    Reasoning,
    TextConfig,
)

WEBSOCKET_ONLY = {"type", "generate", "stream_id"}
"""Fields of the WebSocket event alone: its ``type``; ``generate: false`` prepares a
response without output; ``stream_id`` is refused (one response at a time)."""


def _keys(*typed_dicts: Any) -> set[str]:
    return {key for cls in typed_dicts for key in typing.get_type_hints(cls)}


def _fields(model: Any) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()} | set(
        model.model_fields
    )


SDK_FIELDS = _keys(
    response_create_params.ResponseCreateParamsNonStreaming,
    response_create_params.ResponseCreateParamsStreaming,
)
HONOURED = _fields(CreateRequest) - IGNORED_FIELDS


def test_every_sdk_field_has_a_fate() -> None:
    placed = HONOURED | IGNORED_FIELDS | set(UNSUPPORTED_FIELDS)
    assert SDK_FIELDS - placed == set()
    assert not set(UNSUPPORTED_FIELDS) & _fields(CreateRequest)


def test_every_websocket_field_has_a_fate() -> None:
    event = _keys(responses_client_event_param.ResponseCreate)
    placed = HONOURED | IGNORED_FIELDS | set(UNSUPPORTED_FIELDS) | WEBSOCKET_ONLY
    assert event - placed == set()


def test_every_nested_reasoning_and_text_field_has_a_fate() -> None:
    assert _keys(SdkReasoning) - _fields(Reasoning) == set()
    assert _keys(ResponseTextConfigParam) - _fields(TextConfig) == set()


IGNORED_VALUES: dict[str, Any] = {
    "service_tier": "auto",
    "prompt_cache_key": "key-1",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit"},
    "safety_identifier": "user-1",
    "stream_options": {"include_obfuscation": False},
    "access_programs": {"cyber": "standard"},
    "background_options": {"completion_window": "soonest"},
    "client_metadata": {"session_id": "s-1", "turn_id": "t-1"},
}

REFUSED_VALUES: dict[str, Any] = {
    "prompt": {"id": "pmpt_1"},
    "context_management": [{"type": "compaction", "compact_threshold": 1000}],
    "moderation": {"model": "omni-moderation-latest"},
    "image": {"context_compression": "auto"},
}


def test_the_value_lists_cover_the_fates() -> None:
    assert set(IGNORED_VALUES) == IGNORED_FIELDS
    assert set(REFUSED_VALUES) == set(UNSUPPORTED_FIELDS)


@pytest.mark.parametrize("field", sorted(IGNORED_VALUES))
async def test_an_ignored_field_is_accepted(server: Server, field: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "input": "hi", field: IGNORED_VALUES[field]}
    if field == "stream_options":
        body["stream"] = True
    response = await server.http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    if field != "stream_options":
        assert response.json()["output"][-1]["content"][0]["text"] == "You said: hi"


@pytest.mark.parametrize("field", sorted(REFUSED_VALUES))
async def test_a_refused_field_is_400_saying_why(server: Server, field: str) -> None:
    body = {"model": MODEL, "input": "hi", field: REFUSED_VALUES[field]}
    response = await server.http.post("/v1/responses", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field and error["code"] == "unsupported_parameter"
    assert "not supported" in error["message"]


async def test_a_field_no_sdk_sends_is_an_unknown_parameter(server: Server) -> None:
    body = {"model": MODEL, "input": "hi", "temperature_schedule": [1, 0]}
    response = await server.http.post("/v1/responses", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "temperature_schedule"


async def test_reasoning_context_and_mode_that_gpt_oss_runs_are_accepted(server: Server) -> None:
    created = await server.client.responses.create(
        model=MODEL, input="hi", reasoning={"context": "current_turn", "mode": "standard"}
    )
    assert created.status == "completed"


@pytest.mark.parametrize(("field", "value"), [("context", "all_turns"), ("mode", "pro")])
async def test_reasoning_context_and_mode_it_cannot_run_are_400(
    server: Server, field: str, value: str
) -> None:
    body = {"model": MODEL, "input": "hi", "reasoning": {field: value}}
    response = await server.http.post("/v1/responses", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == f"reasoning.{field}"
