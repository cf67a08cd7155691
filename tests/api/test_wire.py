"""Wire details every client sees: ``x-request-id`` on each response and its log lines, CORS."""

from __future__ import annotations

import logging
import re

import httpx2
import pytest
import trio

from tests.conftest import StartServer
from tests.processes import ServeCommand
from tests.support import MODEL, Server
from trio_responses import Config
from trio_responses.api.request_id import RequestIdFilter

GENERATED_ID = re.compile(r"req_[0-9a-f]{32}")
ORIGIN = "https://app.example"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
}


@pytest.fixture
def request_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """caplog at info, its handler stamping records as the CLI's handler does."""
    caplog.set_level(logging.INFO, logger="trio_responses")
    caplog.handler.addFilter(RequestIdFilter())
    return caplog


async def test_sdk_sees_the_request_id_and_the_log_lines_carry_it(
    server: Server, request_log: pytest.LogCaptureFixture
) -> None:
    raw = await server.client.responses.with_raw_response.create(model=MODEL, input="hi")
    request_id = raw.headers["x-request-id"]
    assert GENERATED_ID.fullmatch(request_id)
    response = raw.parse()
    assert response._request_id == request_id  # what the SDK reports for support requests

    lines = [record for record in request_log.records if record.request_id == request_id]
    messages = [record.getMessage() for record in lines]
    assert any(m.startswith("POST /v1/responses -> 200") for m in messages), messages
    # The job the request created logs under the request's id too.
    assert any(m == f"{response.id} completed" for m in messages), messages

    again = await server.client.responses.with_raw_response.create(model=MODEL, input="hi")
    assert again.headers["x-request-id"] != request_id


async def test_every_kind_of_response_has_a_request_id(start_server: StartServer) -> None:
    server = await start_server(api_keys=("key",))
    stream = {"model": MODEL, "input": "hi", "stream": True}
    replies = [
        await server.http.get("/health"),
        await server.http.get("/nope"),
        await server.http.get("/v1/models"),  # 401: no key
        await server.http.post(
            "/v1/responses", json={"input": "hi"}, headers={"Authorization": "Bearer key"}
        ),
        await server.http.post(
            "/v1/responses", json=stream, headers={"Authorization": "Bearer key"}
        ),
    ]
    assert [reply.status_code for reply in replies] == [200, 404, 401, 400, 200]
    assert replies[-1].headers["content-type"].startswith("text/event-stream")
    ids = [reply.headers["x-request-id"] for reply in replies]
    assert all(GENERATED_ID.fullmatch(request_id) for request_id in ids), ids
    assert len(set(ids)) == len(ids)


async def test_a_sane_client_request_id_is_kept(
    server: Server, request_log: pytest.LogCaptureFixture
) -> None:
    sent = "trace-7.a_B-9"
    reply = await server.http.get("/v1/models", headers={"X-Request-Id": sent})
    assert reply.headers["x-request-id"] == sent
    assert any(
        record.request_id == sent and record.getMessage().startswith("GET /v1/models -> 200")
        for record in request_log.records
    )
    for insane in ("x" * 129, "two words", "line\tbreak", "a/b"):
        reply = await server.http.get("/v1/models", headers={"X-Request-Id": insane})
        assert GENERATED_ID.fullmatch(reply.headers["x-request-id"]), insane


async def test_cors_preflight_needs_no_key_and_names_what_is_allowed(
    start_server: StartServer,
) -> None:
    server = await start_server(api_keys=("key",), cors_allow_origins=(ORIGIN,))
    for path in ("/v1/responses", "/v1/responses/resp_1/cancel", "/v1/models"):
        reply = await server.http.options(path, headers=PREFLIGHT)
        assert reply.status_code == 204, (path, reply.text)
        headers = reply.headers
        assert headers["access-control-allow-origin"] == ORIGIN
        assert "Origin" in headers["vary"]
        assert set(headers["access-control-allow-methods"].split(", ")) >= {"GET", "POST", "DELETE"}
        assert (
            headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"
        )
        assert int(headers["access-control-max-age"]) > 0
        assert GENERATED_ID.fullmatch(headers["x-request-id"])

    # A preflight naming no headers gets a list with what the openai SDKs send.
    bare = {"Origin": ORIGIN, "Access-Control-Request-Method": "GET"}
    allowed = (await server.http.options("/v1/models", headers=bare)).headers[
        "access-control-allow-headers"
    ]
    assert {"authorization", "content-type", "openai-organization", "openai-project"} <= {
        name.strip().lower() for name in allowed.split(",")
    }


async def test_cors_headers_on_actual_requests_from_allowed_origins_only(
    start_server: StartServer,
) -> None:
    server = await start_server(cors_allow_origins=(ORIGIN, "http://localhost:5173"))
    body = {"model": MODEL, "input": "hi"}
    reply = await server.http.post("/v1/responses", json=body, headers={"Origin": ORIGIN})
    assert reply.status_code == 200
    assert reply.headers["access-control-allow-origin"] == ORIGIN
    assert reply.headers["access-control-expose-headers"] == "x-request-id"
    assert "Origin" in reply.headers["vary"]

    error = await server.http.post(
        "/v1/responses", json={"input": "hi"}, headers={"Origin": "http://localhost:5173"}
    )
    assert error.status_code == 400  # errors are readable by the page too
    assert error.headers["access-control-allow-origin"] == "http://localhost:5173"

    for origin in ("https://evil.example", "https://app.example.evil", "null"):
        other = await server.http.post("/v1/responses", json=body, headers={"Origin": origin})
        assert other.status_code == 200
        assert not [name for name in other.headers if name.lower().startswith("access-control-")]
        preflight = await server.http.options(
            "/v1/responses", headers={**PREFLIGHT, "Origin": origin}
        )
        assert not [
            name for name in preflight.headers if name.lower().startswith("access-control-")
        ]


async def test_cors_any_origin(start_server: StartServer) -> None:
    server = await start_server(api_keys=("key",), cors_allow_origins=("*",))
    origin = "https://anywhere.example"
    preflight = await server.http.options("/v1/responses", headers={**PREFLIGHT, "Origin": origin})
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == origin
    refused = await server.http.get("/v1/models", headers={"Origin": origin})
    assert refused.status_code == 401  # CORS lets the page read the answer, not skip the key
    assert refused.headers["access-control-allow-origin"] == origin


async def test_without_cors_no_cors_headers_and_options_as_before(
    start_server: StartServer,
) -> None:
    server = await start_server(api_keys=("key",))
    preflight = await server.http.options("/v1/responses", headers=PREFLIGHT)
    assert preflight.status_code == 401
    assert preflight.json()["error"]["code"] == "invalid_api_key"
    reply = await server.http.get(
        "/v1/models", headers={"Origin": ORIGIN, "Authorization": "Bearer key"}
    )
    assert reply.status_code == 200
    assert not [name for name in reply.headers if name.lower().startswith("access-control-")]
    assert "vary" not in reply.headers


def test_cors_origins_are_checked() -> None:
    for bad in ("app.example", "https://app.example/", "https://app.example/path", ""):
        with pytest.raises(ValueError, match="CORS origin"):
            Config(cors_allow_origins=(bad,))
    Config(cors_allow_origins=("*", "http://localhost:5173", "https://[::1]:8443"))


async def test_cli_log_lines_carry_the_request_id(nursery: trio.Nursery) -> None:
    command = await ServeCommand.start(
        nursery, "--cors-allow-origin", ORIGIN, "--cors-allow-origin", "http://localhost:3000"
    )
    async with httpx2.AsyncClient(base_url=command.url, timeout=30) as http:
        reply = await http.post(
            "/v1/responses", json={"model": MODEL, "input": "hi"}, headers={"Origin": ORIGIN}
        )
    assert reply.headers["access-control-allow-origin"] == ORIGIN
    request_id = reply.headers["x-request-id"]
    response_id = reply.json()["id"]
    assert await command.stop() == 0, command.log.decode()
    lines = [line for line in command.log.decode().splitlines() if f"[{request_id}]" in line]
    assert any("POST /v1/responses -> 200" in line for line in lines), command.log.decode()
    assert any(f"{response_id} completed" in line for line in lines), command.log.decode()
