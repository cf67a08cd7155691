"""Request MCP ``headers`` and ``authorization``: sent as given, checked, never repeated.

The server runs as a child process at ``--log-level debug``, so its whole log
can be searched for the credentials; the MCP server (in this process) records
the headers of every HTTP request it gets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx2
import hypercorn.trio
import pytest
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

from tests.processes import ServeCommand
from tests.support import MODEL, parse_sse
from tests.tools.servers import echo_server

SECRET = "s3cret-marker-7f1c"
TOKEN = "token-marker-93ab"


@dataclass
class RecordingMcp:
    url: str
    requests: list[dict[str, str]] = field(default_factory=list)
    """The headers of every HTTP request received (lower-case names)."""


async def serve_recording(*, task_status: trio.TaskStatus[RecordingMcp]) -> None:
    """The echo MCP server over streamable HTTP, recording request headers."""
    app = echo_server().streamable_http_app()
    recording = RecordingMcp(url="")

    async def recorder(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] == "http":
            recording.requests.append(
                {
                    name.decode("latin-1"): value.decode("latin-1")
                    for name, value in scope["headers"]
                }
            )
        await app(scope, receive, send)  # type: ignore[arg-type]

    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(hypercorn.trio.serve, recorder, config))  # type: ignore[arg-type]
        recording.url = urls[0] + "/mcp"
        task_status.started(recording)


@pytest.fixture
async def mcp(nursery: trio.Nursery) -> RecordingMcp:
    recording: RecordingMcp = await nursery.start(serve_recording)
    return recording


@pytest.fixture
async def serve(nursery: trio.Nursery) -> ServeCommand:
    return await ServeCommand.start(
        nursery, "--mcp-allow-host", "127.0.0.1", "--log-level", "debug"
    )


def mcp_tool(url: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "echo",
        "server_url": url,
        "require_approval": "never",
        **fields,
    }


async def everything_said(http: httpx2.AsyncClient, response_id: str) -> str:
    """The response and its input items as the API returns them."""
    stored = await http.get(f"/v1/responses/{response_id}")
    items = await http.get(f"/v1/responses/{response_id}/input_items")
    assert stored.status_code == 200 and items.status_code == 200
    return stored.text + items.text


async def test_headers_and_authorization_reach_the_server_and_nowhere_else(
    serve: ServeCommand, mcp: RecordingMcp
) -> None:
    tool = mcp_tool(mcp.url, headers={"X-Api-Key": f"  {SECRET}  "}, authorization=TOKEN)
    async with httpx2.AsyncClient(base_url=serve.url, timeout=30) as http:
        body = {
            "model": MODEL,
            "input": 'mcp:echo.echo {"text": "hello"}',
            "tools": [tool],
            "stream": True,
            "background": True,
        }
        async with http.stream("POST", "/v1/responses", json=body) as streamed:
            raw = b"".join([chunk async for chunk in streamed.aiter_bytes()])
        events = [event.json() for event in parse_sse(raw) if event.data != "[DONE]"]
        final = events[-1]["response"]
        assert final["status"] == "completed"
        assert final["output"][-1]["content"][0]["text"] == "Tool result: echo: hello"
        replay = await http.get(f"/v1/responses/{final['id']}?stream=true")
        said = raw.decode() + replay.text + await everything_said(http, final["id"])

        # A server that cannot be reached: its failure is reported, the credentials are not.
        unreachable = mcp_tool(
            "http://127.0.0.1:9/mcp", headers={"X-Api-Key": SECRET}, authorization=TOKEN
        )
        failed = await http.post(
            "/v1/responses",
            json={"model": MODEL, "input": 'mcp:echo.echo {"text": "x"}', "tools": [unreachable]},
        )
        assert failed.status_code == 200
        listing = failed.json()["output"][0]
        assert listing["type"] == "mcp_list_tools" and listing["error"]
        said += failed.text + await everything_said(http, failed.json()["id"])
    assert mcp.requests, "the MCP server was not called"
    for headers in mcp.requests:
        assert headers["x-api-key"] == SECRET
        assert headers["authorization"] == f"Bearer {TOKEN}"
    assert await serve.stop() == 0
    for marker in (SECRET, TOKEN):
        assert marker not in said
        assert marker.encode() not in serve.log


BAD_VALUES = [
    f"{SECRET}\r\nX-Injected: yes",
    f"{SECRET}\n",
    f"{SECRET}\r",
    f"{SECRET}\x00",
    f"{SECRET}\x7f",
    f"{SECRET}é",
    SECRET * 2_000,
]


REFUSED = [
    *(({"headers": {"X-Key": value}}, "tools[0].headers.X-Key") for value in BAD_VALUES),
    *(({"authorization": value}, "tools[0].authorization") for value in BAD_VALUES),
    *(
        ({"headers": {name: SECRET}}, f"tools[0].headers.{name}")
        for name in (
            "Connection",
            "keep-alive",
            "Proxy-Authorization",
            "Proxy-Connection",
            "TE",
            "Trailer",
            "Transfer-Encoding",
            "Upgrade",
            "Host",
            "Content-Length",
        )
    ),
    ({"headers": {"X Bad": SECRET}}, "tools[0].headers"),
    ({"headers": {"X-Key\r\nInjected": SECRET}}, "tools[0].headers"),
    ({"headers": {"": SECRET}}, "tools[0].headers"),
    ({"headers": {"X-Key": SECRET, "x-key": SECRET}}, "tools[0].headers.x-key"),
    ({"headers": {"Authorization": SECRET}, "authorization": TOKEN}, "tools[0].authorization"),
    ({"headers": {f"X-{n}": SECRET for n in range(65)}}, "tools[0].headers"),
]


async def test_headers_that_cannot_be_sent_are_400_without_the_value(
    serve: ServeCommand, mcp: RecordingMcp
) -> None:
    async with httpx2.AsyncClient(base_url=serve.url, timeout=30) as http:
        for fields, param in REFUSED:
            response = await http.post(
                "/v1/responses",
                content=json.dumps(
                    {"model": MODEL, "input": "hi", "tools": [mcp_tool(mcp.url, **fields)]}
                ).encode(),
                headers={"Content-Type": "application/json"},
            )
            assert response.status_code == 400, (fields, response.text[:300])
            error = response.json()["error"]
            assert (error["param"], error["code"]) == (param, "invalid_value"), fields
            assert error["type"] == "invalid_request_error"
            assert SECRET not in response.text and TOKEN not in response.text
        health = (await http.get("/health")).json()
        assert health["jobs"]["running"] == 0
    assert mcp.requests == []
    assert await serve.stop() == 0
    assert SECRET.encode() not in serve.log and TOKEN.encode() not in serve.log
