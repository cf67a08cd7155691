"""Bad input is a 4xx with the error shape, never a 500, and leaves nothing running.

Bodies are sent as bytes built here (``json.dumps`` escapes a lone surrogate as
``\\ud800``, writes ``NaN``, and keeps any nesting), exactly as a hostile or
buggy client would send them.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
import trio

from tests.conftest import StartServer
from tests.processes import ServeCommand
from tests.support import MODEL, Server
from trio_responses.protocol.json_body import MAX_JSON_DEPTH

SURROGATE = "\ud800"


def assert_shape(response: httpx2.Response, status: int) -> dict[str, Any]:
    """The error object of ``response``, checked: status, keys, a non-empty code."""
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"]
    return error


async def post_raw(http: httpx2.AsyncClient, body: Any, **headers: str) -> httpx2.Response:
    return await http.post(
        "/v1/responses",
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )


def nested(depth: int) -> Any:
    """A JSON value whose arrays and objects nest ``depth`` levels (counting itself)."""
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def function_tool(parameters: Any = None, **fields: Any) -> dict[str, Any]:
    tool: dict[str, Any] = {"type": "function", "name": "f", **fields}
    if parameters is not None:
        tool["parameters"] = parameters
    return tool


# -- lone surrogates ------------------------------------------------------------------

SURROGATE_CASES = [
    ({"user": SURROGATE}, "user"),
    ({"prompt_cache_key": "k" + SURROGATE}, "prompt_cache_key"),
    ({"safety_identifier": SURROGATE}, "safety_identifier"),
    ({"instructions": SURROGATE}, "instructions"),
    ({"input": "hi " + SURROGATE}, "input"),
    ({"input": [{"role": "user", "content": SURROGATE}]}, "input[0].content"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": SURROGATE}]}]},
        "input[0].content[0].text",
    ),
    ({"tools": [function_tool(description=SURROGATE)]}, "tools[0].description"),
    (
        {"tools": [function_tool({"type": "object", "description": "\udfff"})]},
        "tools[0].parameters.description",
    ),
    ({"metadata": {"key": SURROGATE}}, "metadata.key"),
    ({"metadata": {SURROGATE: "value"}}, "metadata.\\ud800"),
    ({"stream_options": {"extra": [SURROGATE]}}, "stream_options.extra[0]"),
    ({"frobnicate": SURROGATE}, "frobnicate"),
    ({"input": [{"role": "user", "content": "hi", "extra": SURROGATE}]}, "input[0].extra"),
]


@pytest.mark.parametrize(("fields", "param"), SURROGATE_CASES)
async def test_lone_surrogate_is_400_naming_the_param(
    server: Server, fields: dict[str, Any], param: str
) -> None:
    for mode in ({}, {"stream": True}, {"background": True}):
        body = {"model": MODEL, "input": "hi", **fields, **mode}
        error = assert_shape(await post_raw(server.http, body), 400)
        assert error["param"] == param
        assert error["code"] == "invalid_value"
        assert "surrogate" in error["message"]
    stats = server.service.statistics()
    assert (stats.running_jobs, stats.job_tasks) == (0, 0)
    assert (await server.client.responses.create(model=MODEL, input="ok")).status == "completed"


async def test_surrogate_bodies_leave_a_server_that_stops_cleanly(nursery: trio.Nursery) -> None:
    command = await ServeCommand.start(nursery)
    async with httpx2.AsyncClient(base_url=command.url, timeout=30) as http:
        for fields, _ in SURROGATE_CASES:
            for mode in ({}, {"stream": True}, {"background": True}):
                body = {"model": MODEL, "input": "hi", **fields, **mode}
                assert_shape(await post_raw(http, body), 400)
        health = (await http.get("/health")).json()
        assert health["jobs"]["running"] == 0
    assert await command.stop(timeout_s=30) == 0
    assert b"Traceback" not in command.log


# -- JSON the server does not take ----------------------------------------------------------


async def test_nesting_is_limited(server: Server) -> None:
    inside = MAX_JSON_DEPTH - 3  # the body, "tools" and the tool hold the parameters
    accepted = await post_raw(
        server.http, {"model": MODEL, "input": "hi", "tools": [function_tool(nested(inside))]}
    )
    assert accepted.status_code == 200, accepted.text[:500]

    too_deep = await post_raw(
        server.http, {"model": MODEL, "input": "hi", "tools": [function_tool(nested(inside + 1))]}
    )
    error = assert_shape(too_deep, 400)
    assert error["code"] == "invalid_json" and str(MAX_JSON_DEPTH) in error["message"]
    assert error["param"] is not None and error["param"].startswith("tools[0].parameters")

    # Far deeper than Python's own recursion limit, small and large (parsed off the loop).
    for depth in (5_000, 400_000):
        body = b'{"model": "%s", "metadata": ' % MODEL.encode() + b"[" * depth
        response = await server.http.post(
            "/v1/responses", content=body, headers={"Content-Type": "application/json"}
        )
        assert assert_shape(response, 400)["code"] == "invalid_json"


NOT_STRICT_JSON = [
    b'{"model": "M", "input": "hi", "max_output_tokens": 1' + b"0" * 5_000 + b"}",
    b'{"model": "M", "input": "hi", "metadata": {"a": "b"}, "x": -' + b"9" * 10_000 + b"}",
    b'{"model": "M", "input": "hi", "temperature": NaN}',
    b'{"model": "M", "input": "hi", "tools": [{"type": "function", "name": "f", '
    b'"parameters": {"default": Infinity}}]}',
    b'{"model": "M", "input": "hi", "stream_options": {"x": [-Infinity]}}',
    b'{"model": "M", "input": "hi"',
    b'{"model": "M", "input": "\xff"}',
    b'{"model": "M", "input": "\xed\xa0\x80"}',  # a surrogate encoded as UTF-8
    '{"model": "M", "input": "utf-16"}'.encode("utf-16"),
]


async def test_numbers_and_encodings_json_cannot_hold_are_400(server: Server) -> None:
    for raw in NOT_STRICT_JSON:
        response = await server.http.post(
            "/v1/responses",
            content=raw.replace(b'"M"', b'"%s"' % MODEL.encode()),
            headers={"Content-Type": "application/json"},
        )
        assert assert_shape(response, 400)["code"] == "invalid_json", raw[:80]


async def test_a_number_too_large_for_a_float_is_400_naming_the_param(server: Server) -> None:
    body = b'{"model": "%s", "input": "hi", "stream_options": {"n": 1e999}}' % MODEL.encode()
    response = await server.http.post(
        "/v1/responses", content=body, headers={"Content-Type": "application/json"}
    )
    error = assert_shape(response, 400)
    assert error["param"] == "stream_options.n" and error["code"] == "invalid_value"


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:99999/mcp", "http://[::1/mcp", "http://127.0.0.1:-1/", "http://[x]/"]
)
async def test_server_urls_that_do_not_parse_are_400(start_server: StartServer, url: str) -> None:
    server = await start_server(mcp_allow_hosts=("*",))
    tool = {"type": "mcp", "server_label": "remote", "server_url": url}
    response = await post_raw(server.http, {"model": MODEL, "input": "hi", "tools": [tool]})
    error = assert_shape(response, 400)
    assert error["param"] == "tools[0].server_url"


@pytest.mark.parametrize(
    "userinfo", ["user:pw-marker-1234@", "pw-marker-1234@", ":pw-marker-1234@"]
)
async def test_server_urls_with_credentials_are_400_without_echo(
    start_server: StartServer, userinfo: str
) -> None:
    server = await start_server(mcp_allow_hosts=("127.0.0.1",))
    url = f"http://{userinfo}127.0.0.1:9/mcp"
    tool = {"type": "mcp", "server_label": "remote", "server_url": url}
    response = await post_raw(server.http, {"model": MODEL, "input": "hi", "tools": [tool]})
    error = assert_shape(response, 400)
    assert error["param"] == "tools[0].server_url"
    assert "pw-marker-1234" not in response.text


# -- fields -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"role": "user", "content": "hi", "foo": 1}, "input[0].foo"),
        (
            {"role": "user", "content": [{"type": "input_text", "text": "hi", "blob": "x" * 100}]},
            "input[0].content[0].blob",
        ),
        (
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "x": 1},
            "input[0].x",
        ),
        ({"type": "reasoning", "summary": [], "padding": [0] * 1000}, "input[0].padding"),
        (
            {
                "type": "mcp_approval_response",
                "approval_request_id": "a",
                "approve": True,
                "status": "completed",
            },
            "input[0].status",
        ),
    ],
)
async def test_unknown_item_fields_are_400(
    server: Server, item: dict[str, Any], param: str
) -> None:
    error = assert_shape(await post_raw(server.http, {"model": MODEL, "input": [item]}), 400)
    assert error["param"] == param and error["code"] == "unknown_parameter"
    assert len(error["message"]) < 200


async def test_items_keep_the_fields_their_type_defines(server: Server) -> None:
    """Every field of the SDK's item types is accepted (clients echo items back
    whole), kept, and listed again; one more field is refused."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "Be brief.", "status": "completed"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "one", "prompt_cache_breakpoint": None}],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "s"}],
            "content": [{"type": "reasoning_text", "text": "thinking"}],
            "encrypted_content": None,
            "status": "completed",
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "phase": "final_answer",
            "content": [
                {"type": "output_text", "text": "ok", "annotations": [], "logprobs": []},
                {"type": "refusal", "refusal": "no"},
            ],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "f",
            "arguments": "{}",
            "status": "completed",
            "namespace": "default",
            "caller": None,
        },
        {
            "type": "function_call_output",
            "id": "fco_1",
            "call_id": "call_1",
            "output": [{"type": "input_text", "text": "42"}],
            "status": "completed",
        },
        {"role": "user", "content": "two"},
    ]
    response = await server.client.responses.create(
        model=MODEL,
        input=items,  # type: ignore[arg-type]
        tools=[function_tool()],  # type: ignore[list-item]
    )
    assert response.output_text == "You said: two"
    listed = (await server.http.get(f"/v1/responses/{response.id}/input_items?order=asc")).json()
    assert [item["type"] for item in listed["data"]] == [i.get("type", "message") for i in items]
    assert listed["data"][3]["phase"] == "final_answer"
    assert listed["data"][4]["namespace"] == "default"

    # The listing and the output, echoed back as input, are accepted again.
    again = await server.client.responses.create(
        model=MODEL,
        input=[*listed["data"], *response.output, {"role": "user", "content": "three"}],  # type: ignore[list-item]
        tools=[function_tool()],  # type: ignore[list-item]
    )
    assert again.output_text == "You said: three"

    extra = {**items[-1], "note": "x" * 1_000}
    refused = await post_raw(server.http, {"model": MODEL, "input": [*items[:-1], extra]})
    error = assert_shape(refused, 400)
    assert error["param"] == f"input[{len(items) - 1}].note"


# -- every 4xx has a code, on every route ------------------------------------------------------


BAD_PATHS = [
    ("GET", "/v1/responses/resp_missing", 404),
    ("GET", "/v1/responses/" + "r" * 5_000, 404),
    ("GET", "/v1/responses/resp%00x", 404),
    ("GET", "/v1/responses/resp:log:x", 404),
    ("GET", "/v1/responses/%F0%9F%98%80", 404),
    ("GET", "/v1/responses/%ED%A0%80", 404),
    ("POST", "/v1/responses/..%2F..%2Fx/cancel", 404),
    ("DELETE", "/v1/responses/" + "%25" * 200, 404),
    ("GET", "/v1/responses/resp_missing/input_items?limit=abc", 400),
    ("GET", "/v1/responses/resp_missing/input_items?limit=0", 400),
    ("GET", "/v1/responses/resp_missing/input_items?limit=" + "9" * 5_000, 400),
    ("GET", "/v1/responses/resp_missing/input_items?order=sideways", 400),
    ("GET", "/v1/responses/resp_missing/input_items?include=nothing.here", 400),
    ("GET", "/v1/responses/resp_missing?stream=maybe", 400),
    ("GET", "/v1/responses/resp_missing?stream=true&starting_after=x", 400),
    ("GET", "/v1/responses/resp_missing?stream=true&starting_after=-7", 400),
    ("GET", "/v1/nowhere", 404),
    ("PATCH", "/v1/responses", 405),
    ("POST", "/v1/models", 405),
]


async def test_bad_paths_and_queries_are_4xx_with_a_code(server: Server) -> None:
    for method, path, status in BAD_PATHS:
        response = await server.http.request(method, path)
        error = assert_shape(response, status)
        # Nothing is echoed whole: a client cannot make an error carry kilobytes of it.
        assert len(error["message"]) < 400, path[:80]


async def test_every_body_error_has_a_code(server: Server) -> None:
    bodies: list[Any] = [
        {"model": MODEL, "background": True, "store": False},
        {"model": MODEL, "input": [{"type": "function_call_output", "call_id": "c", "output": ""}]},
        {"model": MODEL, "previous_response_id": "resp_missing"},
        {"model": MODEL, "previous_response_id": "../etc"},
        {"model": MODEL, "tools": [function_tool(), function_tool()]},
        {"model": MODEL, "tools": [{"type": "code_interpreter"}]},
        {"model": MODEL, "tools": [{"type": "mcp", "server_label": "x"}]},
        {"model": "m" * 10_000},
        {"model": MODEL, "k" * 100_000: 1},
        {"model": MODEL, "input": [{"role": "user", "content": "x", "k" * 100_000: 1}]},
        [],
        "text",
        None,
    ]
    for body in bodies:
        response = await post_raw(server.http, body)
        assert 400 <= response.status_code < 500
        error = assert_shape(response, response.status_code)
        assert len(error["message"]) < 1_000


# -- early replies and keep-alive -----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "key", "status"),
    [
        ("POST", "/v1/responses", "wrong", 401),
        ("POST", "/v1/nowhere", "right", 404),
        ("PUT", "/v1/responses", "right", 405),
        ("POST", "/v1/responses", "right", 413),
    ],
)
async def test_early_replies_close_the_connection(
    start_server: StartServer, method: str, path: str, key: str, status: int
) -> None:
    """A reply sent before the body is read says ``Connection: close``, so a
    keep-alive client opens a new connection for its next request instead of
    writing into one the server is closing."""
    server = await start_server(api_keys=("right",), max_body_bytes=200_000)
    body = json.dumps({"model": MODEL, "input": "x" * 500_000}).encode()
    async with httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        for _ in range(3):
            early = await http.request(
                method,
                path,
                content=body,
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            assert_shape(early, status)
            assert early.headers.get("connection") == "close"
            models = await http.get("/v1/models", headers={"Authorization": "Bearer right"})
            assert models.status_code == 200
            assert "connection" not in models.headers  # the next one is kept alive
        # An error about a body that was read keeps the connection.
        bad = await post_raw(http, {"model": MODEL, "input": 5}, Authorization="Bearer right")
        assert_shape(bad, 400)
        assert "connection" not in bad.headers
