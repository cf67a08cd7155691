"""Bad input gets an OpenAI-shaped error with the right status, and breaks nothing."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import StartServer
from tests.support import MODEL, Server


def assert_error(body: dict[str, Any], *, type_: str, param: str | None, code: str | None) -> str:
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == type_
    assert error["param"] == param
    assert error["code"] == code
    message: str = error["message"]
    assert message and "Traceback" not in message
    return message


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": "hi"}, "model", "missing_required_parameter"),
        ({"model": MODEL, "input": 5}, "input", "invalid_type"),
        ({"model": MODEL, "max_output_tokens": "5"}, "max_output_tokens", "invalid_type"),
        ({"model": MODEL, "stream": "yes"}, "stream", "invalid_type"),
        (
            {"model": MODEL, "input": [{"role": "user", "content": 5}]},
            "input[0].content",
            "invalid_type",
        ),
        (
            {"model": MODEL, "input": [{"role": "robot", "content": "x"}]},
            "input[0].role",
            "invalid_value",
        ),
        ({"model": MODEL, "input": [{"type": "nope"}]}, "input[0].type", "invalid_value"),
        ({"model": MODEL, "temperature": 5}, "temperature", "invalid_value"),
        ({"model": MODEL, "frobnicate": True}, "frobnicate", "unknown_parameter"),
        (
            {"model": MODEL, "tools": [{"type": "function", "name": "f", "extra": 1}]},
            "tools[0].extra",
            "unknown_parameter",
        ),
        (
            {"model": MODEL, "tools": [{"type": "file_search"}]},
            "tools[0].type",
            "unsupported_value",
        ),
        (
            {"model": MODEL, "conversation": "conv_1", "previous_response_id": "resp_1"},
            "conversation",
            "mutually_exclusive_parameters",
        ),
        ({"model": MODEL, "top_logprobs": 3}, "top_logprobs", "invalid_value"),
        (
            {"model": MODEL, "include": ["message.output_text.logprobs"]},
            "include[0]",
            "unsupported_value",
        ),
        ({"model": MODEL, "background": True, "store": False}, "background", "invalid_request"),
        (
            {
                "model": MODEL,
                "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}],
            },
            "input[0].call_id",
            "invalid_request",
        ),
    ],
)
async def test_invalid_requests_get_400_naming_the_param(
    server: Server, body: dict[str, Any], param: str, code: str | None
) -> None:
    response = await server.http.post("/v1/responses", json=body)
    assert response.status_code == 400
    assert_error(response.json(), type_="invalid_request_error", param=param, code=code)


async def test_unparseable_json_is_400(server: Server) -> None:
    response = await server.http.post(
        "/v1/responses", content=b'{"model": ', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    message = assert_error(
        response.json(), type_="invalid_request_error", param=None, code="invalid_json"
    )
    assert "JSON" in message

    array = await server.http.post("/v1/responses", json=["not", "an", "object"])
    assert array.status_code == 400
    assert_error(array.json(), type_="invalid_request_error", param=None, code="invalid_type")


async def test_unknown_model_is_404(server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        await server.client.responses.create(model="gpt-4o", input="hi")
    body = raised.value.body
    assert isinstance(body, dict)
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert MODEL in body["message"]


async def test_unknown_response_and_route_are_404(server: Server) -> None:
    missing = await server.http.get("/v1/responses/resp_doesnotexist")
    assert missing.status_code == 404
    assert_error(
        missing.json(), type_="invalid_request_error", param="response_id", code="not_found"
    )
    route = await server.http.get("/v1/nowhere")
    assert route.status_code == 404
    assert_error(route.json(), type_="invalid_request_error", param=None, code="not_found")


async def test_oversized_body_is_413(start_server: StartServer) -> None:
    server = await start_server(max_body_bytes=2_000)
    response = await server.http.post("/v1/responses", json={"model": MODEL, "input": "x" * 5_000})
    assert response.status_code == 413
    assert_error(
        response.json(), type_="invalid_request_error", param=None, code="request_too_large"
    )
    small = await server.client.responses.create(model=MODEL, input="still fine")
    assert small.output_text == "You said: still fine"


async def test_errors_do_not_break_the_server(server: Server) -> None:
    for body in ({}, {"model": 1}, {"model": MODEL, "input": [None]}):
        assert (await server.http.post("/v1/responses", json=body)).status_code == 400
    response = await server.client.responses.create(model=MODEL, input="after errors")
    assert response.output_text == "You said: after errors"
    assert server.service.statistics().running_jobs == 0


async def test_sdk_sees_bad_request_with_param(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        await server.client.responses.create(model=MODEL, input="x", max_output_tokens=0)
    body = raised.value.body
    assert isinstance(body, dict) and body["param"] == "max_output_tokens"


async def test_internal_errors_are_500_without_details(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(server.service, "create", broken)
    response = await server.http.post("/v1/responses", json={"model": MODEL, "input": "x"})
    assert response.status_code == 500
    message = assert_error(response.json(), type_="server_error", param=None, code="server_error")
    assert "secret" not in message


async def test_api_key_is_required_when_configured(start_server: StartServer) -> None:
    server = await start_server(api_keys=("key-one", "key-two"))
    anonymous = await server.http.post("/v1/responses", json={"model": MODEL, "input": "x"})
    assert anonymous.status_code == 401
    assert_error(anonymous.json(), type_="authentication_error", param=None, code="invalid_api_key")
    wrong = await server.http.get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert (await server.http.get("/health")).status_code == 200

    # server.client carries key-one.
    response = await server.client.responses.create(model=MODEL, input="authorised")
    assert response.output_text == "You said: authorised"
    mine = await server.http.get(
        f"/v1/responses/{response.id}", headers={"Authorization": "Bearer key-one"}
    )
    assert mine.status_code == 200
    theirs = await server.http.get(
        f"/v1/responses/{response.id}", headers={"Authorization": "Bearer key-two"}
    )
    assert theirs.status_code == 404
