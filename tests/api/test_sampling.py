"""Sampling options: penalties and ``reasoning.summary`` are accepted, used and echoed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.test_errors import assert_error
from tests.support import MODEL, Server, read_sse, validate_response
from trio_responses.engine.base import SamplingSettings, sampling_kwargs


async def test_penalties_and_summary_are_echoed_and_stored(server: Server) -> None:
    # The installed SDK's create() has no penalty arguments, so they go in extra_body
    # and come back as fields the SDK's Response type does not declare.
    created = await server.client.responses.create(
        model=MODEL,
        input="hi",
        reasoning={"effort": "low", "summary": "detailed"},
        extra_body={"presence_penalty": 0.5, "frequency_penalty": -1.5},
    )
    assert created.status == "completed"
    assert created.output_text == "You said: hi"
    assert created.model_extra is not None
    assert created.model_extra["presence_penalty"] == 0.5
    assert created.model_extra["frequency_penalty"] == -1.5
    assert created.reasoning is not None
    assert created.reasoning.summary == "detailed" and created.reasoning.effort == "low"
    reasoning = created.output[0]
    assert reasoning.type == "reasoning" and reasoning.summary == []

    retrieved = await server.http.get(f"/v1/responses/{created.id}")
    body = retrieved.json()
    validate_response(body)
    assert body["presence_penalty"] == 0.5 and body["frequency_penalty"] == -1.5
    assert body["reasoning"] == {"effort": "low", "summary": "detailed"}


async def test_penalties_default_to_zero_in_every_event(server: Server) -> None:
    status, events, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={"model": MODEL, "input": "hi", "stream": True, "presence_penalty": 2},
    )
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    snapshots = [payload["response"] for payload in payloads if "response" in payload]
    assert [payload["type"] for payload in payloads if "response" in payload] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    for snapshot in snapshots:
        assert snapshot["presence_penalty"] == 2 and snapshot["frequency_penalty"] == 0.0


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty", "invalid_value"),
        ({"presence_penalty": -2.01}, "presence_penalty", "invalid_value"),
        ({"frequency_penalty": -3}, "frequency_penalty", "invalid_value"),
        ({"frequency_penalty": "high"}, "frequency_penalty", "invalid_type"),
        ({"presence_penalty": True}, "presence_penalty", "invalid_type"),
        ({"reasoning": {"summary": "long"}}, "reasoning.summary", "invalid_value"),
    ],
)
async def test_bad_sampling_values_get_400_naming_the_param(
    server: Server, body: dict[str, Any], param: str, code: str
) -> None:
    response = await server.http.post("/v1/responses", json={"model": MODEL, **body})
    assert response.status_code == 400
    assert_error(response.json(), type_="invalid_request_error", param=param, code=code)


def test_vllm_sampling_arguments_carry_the_penalties() -> None:
    given = SamplingSettings(
        max_tokens=64, temperature=0.2, presence_penalty=1.25, frequency_penalty=-0.5, seed=7
    )
    assert sampling_kwargs(given) == {
        "max_tokens": 64,
        "temperature": 0.2,
        "top_p": 1.0,
        "presence_penalty": 1.25,
        "frequency_penalty": -0.5,
        "seed": 7,
        "stop_token_ids": [],
    }
    defaults = sampling_kwargs(SamplingSettings(max_tokens=1, stop_token_ids=(3, 4)))
    assert defaults["presence_penalty"] == 0.0 and defaults["frequency_penalty"] == 0.0
    assert defaults["temperature"] == 1.0 and defaults["stop_token_ids"] == [3, 4]


@pytest.mark.parametrize(
    ("asked", "used"),
    [("none", "low"), ("minimal", "low"), ("low", "low"), ("xhigh", "high"), ("max", "high")],
)
async def test_reasoning_effort_runs_at_the_nearest_gpt_oss_level(
    server: Server, asked: str, used: str
) -> None:
    created = await server.client.responses.create(
        model=MODEL,
        input="hi",
        reasoning={"effort": asked},  # type: ignore[typeddict-item]
    )
    assert created.status == "completed"
    assert created.reasoning is not None and created.reasoning.effort == used
    stored = await server.http.get(f"/v1/responses/{created.id}")
    assert stored.json()["reasoning"]["effort"] == used


async def test_an_effort_the_sdk_does_not_know_is_400(server: Server) -> None:
    response = await server.http.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", "reasoning": {"effort": "extreme"}}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "reasoning.effort"
