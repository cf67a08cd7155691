"""Request bodies: their deadline, their size bound, a client leaving halfway, and the
method a route takes, on ``POST /v1/responses`` (served by the pipeline itself) and on
the app's other routes alike."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import h11
import httpx2
import hypercorn.config
import hypercorn.trio
import pytest
import trio
import trio.testing

from tests.conftest import StartServer
from tests.support import (
    MODEL,
    Server,
    assert_nothing_left,
    count_tasks,
    open_socket,
    parse_sse,
    read_reply,
)
from trio_responses import Config
from trio_responses._opening import open_responses_service
from trio_responses.api.app import create_asgi_app
from trio_responses.metrics import PREFIX

ROUTES = ["/v1/responses", "/v1/responses/input_tokens"]
"""The create route, and a route of the Quart app that reads a JSON body."""


def _head(path: str, length: int, method: str = "POST") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def _read_reply(stream: trio.SocketStream) -> tuple[h11.Response, bytes]:
    """The reply's head and whole body (the server may close after it)."""
    parser = h11.Connection(h11.CLIENT)
    parser.send(h11.Request(method="GET", target="/", headers=[("Host", "test")]))
    return await read_reply(stream, parser)


def _created(server: Server) -> float:
    """Responses the server has created, as its metrics count them."""
    metrics = server.service.metrics
    return sum(
        metrics.registry.get_sample_value(f"{PREFIX}_responses_created_total", {"background": b})
        or 0.0
        for b in ("true", "false")
    )


def _tasks() -> int:
    """Tasks alive in this Trio run (the test's, the server's, its connections')."""
    return count_tasks()


def _header(head: h11.Response, name: bytes) -> bytes | None:
    return next((value for key, value in head.headers if key == name), None)


@pytest.mark.parametrize("path", ROUTES)
async def test_a_body_that_does_not_arrive_in_time_gets_408(
    start_server: StartServer, path: str
) -> None:
    server = await start_server(body_timeout_s=0.5)
    body = json.dumps({"model": MODEL, "input": "hi"}).encode()
    stream = await open_socket(server)
    async with stream:
        await stream.send_all(_head(path, len(body)) + body[:5])  # and the rest never
        with trio.fail_after(10):
            head, reply = await _read_reply(stream)
    assert head.status_code == 408
    assert json.loads(reply) == {
        "error": {
            "message": "The request body did not arrive within 0.5 seconds (--body-timeout). "
            "Send the whole body at once.",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_timeout",
        }
    }
    assert _header(head, b"x-request-id") is not None
    assert _header(head, b"connection") == b"close"  # the rest of the body is unread
    assert _created(server) == 0


async def test_a_client_that_leaves_halfway_through_its_body_creates_nothing(
    start_server: StartServer, store_url: str
) -> None:
    server = await start_server(store_url=store_url)
    body = json.dumps({"model": MODEL, "input": "tokens:50", "stream": True}).encode()
    await server.client.responses.create(model=MODEL, input="tokens:3")  # connections warm
    await trio.testing.wait_all_tasks_blocked()
    before = _tasks()
    # A whole, valid body in the first chunk of a chunked body that never ends, and
    # half of one announced by its length: the client leaves before either is done.
    chunked = (
        b"POST /v1/responses HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(body), body)
    )
    halves = _head("/v1/responses", len(body)) + body[: len(body) // 2]
    for request in [chunked, halves] * 3:
        stream = await open_socket(server)
        async with stream:
            await stream.send_all(request)
            await trio.testing.wait_all_tasks_blocked()  # the server has read it all
    await assert_nothing_left(server)  # also waits until every task is blocked
    assert _tasks() == before  # their connections' tasks have ended
    assert _created(server) == 1
    # The server still answers, on a new connection.
    created = await server.client.responses.create(model=MODEL, input="tokens:3")
    assert created.status == "completed"
    assert _created(server) == 2


@pytest.mark.parametrize("path", ROUTES)
async def test_a_body_over_the_bound_gets_413_however_it_is_sent(
    start_server: StartServer, path: str
) -> None:
    server = await start_server(max_body_bytes=1_000)
    body = json.dumps({"model": MODEL, "input": "x" * 2_000}).encode()
    chunked = (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode() + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:600], body[600:]))
    for request in (_head(path, len(body)) + body, chunked + b"0\r\n\r\n"):
        stream = await open_socket(server)
        async with stream:
            await stream.send_all(request)
            with trio.fail_after(10):
                head, reply = await _read_reply(stream)
        assert head.status_code == 413
        assert json.loads(reply)["error"]["code"] == "request_too_large"
        assert _header(head, b"connection") == b"close"  # the rest of the body is unread
    assert _created(server) == 0


async def test_a_method_the_create_route_does_not_take_gets_405(server: Server) -> None:
    for method in ("GET", "PUT", "DELETE"):
        reply = await server.http.request(method, "/v1/responses")
        assert reply.status_code == 405, method
        assert reply.json() == {
            "error": {
                "message": f"Method {method} is not allowed on /v1/responses.",
                "type": "invalid_request_error",
                "param": None,
                "code": "method_not_allowed",
            }
        }
    head = await server.http.head("/v1/responses")
    assert head.status_code == 405
    # The same answer as the app's own routes give.
    other = await server.http.put("/v1/models")
    assert other.status_code == 405
    assert other.json()["error"]["code"] == "method_not_allowed"
    assert other.json()["error"]["message"] == "Method PUT is not allowed on /v1/models."


async def test_without_a_key_every_method_gets_401_before_405(
    start_server: StartServer,
) -> None:
    # As on the app's routes: authentication comes before routing.
    server = await start_server(api_keys=("right",))
    for method in ("GET", "PUT", "POST"):
        reply = await server.http.request(method, "/v1/responses", content=b"{}")
        assert reply.status_code == 401, method
        assert reply.json()["error"]["code"] == "invalid_api_key"
        assert reply.headers["connection"] == "close"  # the body was left unread
    keyed = await server.http.get("/v1/responses", headers={"Authorization": "Bearer right"})
    assert keyed.status_code == 405
    other = await server.http.put("/v1/models")
    assert other.status_code == 401


async def test_the_api_under_another_asgi_server_serves_every_route_alike() -> None:
    # Served by plain hypercorn (no direct socket writes) and mounted under a prefix
    # (so the app's own create view serves the route), the pipeline still
    # authenticates, bounds, ids and logs every request, and creates responses as
    # our server does.
    config = Config(port=0, api_keys=("right",), max_body_bytes=10_000)
    async with open_responses_service(config) as service, trio.open_nursery() as nursery:
        asgi = create_asgi_app(service)

        async def mounted(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] in ("http", "websocket"):
                scope = {**scope, "root_path": "/api", "path": "/api" + scope["path"]}
            await asgi(scope, receive, send)

        for app in (asgi, mounted):
            hconfig = hypercorn.config.Config()
            hconfig.bind = ["127.0.0.1:0"]
            binds = await nursery.start(partial(hypercorn.trio.serve, app, hconfig, mode="asgi"))
            async with httpx2.AsyncClient(
                base_url=binds[0], headers={"Authorization": "Bearer right"}
            ) as client:
                reply = await client.post(
                    "/v1/responses", json={"model": MODEL, "input": "tokens:3"}
                )
                assert reply.status_code == 200
                created = reply.json()
                assert created["status"] == "completed"
                assert created["output"][-1]["content"][0]["text"]
                assert reply.headers["x-request-id"].startswith("req_")
                bad = await client.post("/v1/responses", content=b'{"model":')
                assert bad.status_code == 400
                assert bad.json()["error"]["code"] == "invalid_json"
                streamed = await client.post(
                    "/v1/responses", json={"model": MODEL, "input": "tokens:3", "stream": True}
                )
                events = parse_sse(streamed.content)
                assert events[-2].event == "response.completed"
                assert events[-1].data == "[DONE]"
                options = await client.options("/v1/responses")
                assert options.headers["Allow"] == "POST, OPTIONS"
                unkeyed = await client.get("/v1/models", headers={"Authorization": "Bearer no"})
                assert unkeyed.status_code == 401
                large = await client.post("/v1/responses/input_tokens", content=b"x" * 20_000)
                assert large.status_code == 413
                assert large.json()["error"]["code"] == "request_too_large"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ("/v1/responses", "GET"),
        ("/v1/responses", "PUT"),
        ("/v1/responses/resp_1", "PUT"),
        ("/v1/responses/resp_1/cancel", "GET"),
        ("/v1/models", "POST"),
        ("/health", "DELETE"),
    ],
)
async def test_a_405_says_what_is_allowed_and_options_tells_the_truth(
    server: Server, path: str, refused: str
) -> None:
    reply = await server.http.request(refused, path)
    assert reply.status_code == 405
    options = await server.http.options(path)
    assert options.status_code == 200
    allowed = [method.strip() for method in options.headers["allow"].split(",")]
    assert [method.strip() for method in reply.headers["allow"].split(",")] == allowed
    assert refused not in allowed and "OPTIONS" in allowed
    for method in allowed:  # each one it names is taken (none of them is a 405)
        if method != "OPTIONS":
            answered = await server.http.request(method, path, json={"model": MODEL})
            assert answered.status_code != 405, (method, path)
