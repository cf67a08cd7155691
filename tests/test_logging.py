"""``--log-format``: JSON lines from a real ``serve`` process, and the formatters."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
import trio
import wsproto
import wsproto.events

from tests.conftest import StartServer
from tests.processes import ServeCommand
from tests.support import MODEL
from trio_responses import Config
from trio_responses._logging import RESPONSE_ID, make_handler
from trio_responses.api.request_id import REQUEST_ID
from trio_responses.cli import build_parser, config_from_args

API_KEY = "sk-log-test-0123456789"
PROMPT = "my very private prompt about zebras"
LISTENING = rb'"message":"listening on (http://[^"]+)"'
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _lines(log: bytes) -> list[dict[str, Any]]:
    """Every line of the log, parsed (each must be one JSON object)."""
    return [json.loads(line) for line in log.decode().splitlines() if line.strip()]


async def test_json_lines_from_a_serve_process(nursery: trio.Nursery) -> None:
    server = await ServeCommand.start(
        nursery, "--log-format", "json", "--api-key", API_KEY, "--token-delay", "0", ready=False
    )
    match = await server.wait_for(LISTENING)
    url = match.group(1).decode()
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
    async with client, httpx2.AsyncClient(base_url=url, timeout=30) as http:
        created = await client.responses.with_raw_response.create(model=MODEL, input=PROMPT)
        request_id = created.headers["x-request-id"]
        response = created.parse()
        background = await client.responses.create(
            model=MODEL, input=f"{PROMPT} tokens:100000 delay:10", background=True
        )
        await client.responses.cancel(background.id)
        unauthorized = await http.post(
            "/v1/responses",
            json={"model": MODEL, "input": PROMPT},
            headers={"Authorization": "Bearer wrong-key-value"},
        )
        assert unauthorized.status_code == 401
    assert await server.stop() == 0

    lines = _lines(server.log)
    for line in lines:
        assert ISO_UTC.fullmatch(line["time"]), line
        assert line["level"] in ("debug", "info", "warning", "error", "critical"), line
        assert isinstance(line["logger"], str) and isinstance(line["message"], str)
        assert "request_id" in line and "response_id" in line
    text = server.log.decode()
    for secret in (API_KEY, "wrong-key-value", "zebras", "Bearer"):
        assert secret not in text, secret

    # The request line: its route, status and duration, its request and response ids.
    posts = [
        line
        for line in lines
        if line.get("route") == "/v1/responses" and line.get("method") == "POST"
    ]
    assert [line["status"] for line in posts] == [200, 200, 401]
    first = posts[0]
    assert first["request_id"] == request_id
    assert first["response_id"] == response.id
    assert first["path"] == "/v1/responses"
    assert isinstance(first["duration_ms"], float) and first["duration_ms"] >= 0
    cancel = next(line for line in lines if line.get("route", "").endswith("/cancel"))
    assert cancel["status"] == 200 and cancel["response_id"] == background.id

    # The job's lines: its status changes, with its ids, tokens and error code.
    mine = [line for line in lines if line["response_id"] == response.id and "route" not in line]
    assert [line["response_status"] for line in mine] == ["in_progress", "completed"]
    assert all(line["request_id"] == request_id for line in mine)
    assert all(line["logger"] == "trio_responses.jobs" for line in mine)
    final = mine[-1]
    assert final["output_tokens"] == response.usage.output_tokens  # type: ignore[union-attr]
    assert final["input_tokens"] == response.usage.input_tokens  # type: ignore[union-attr]
    assert "error_code" not in final
    changes = [
        line["response_status"]
        for line in lines
        if line["response_id"] == background.id and "response_status" in line
    ]
    assert changes[0] == "queued" and changes[-1] == "cancelled"


def test_a_json_line_carries_the_context_and_only_known_fields() -> None:
    stream = io.StringIO()
    log = logging.getLogger("tests.logging.json")
    log.propagate = False
    log.setLevel(logging.INFO)
    handler = make_handler("json", stream)
    log.addHandler(handler)
    request_token = REQUEST_ID.set("req_abc")
    response_token = RESPONSE_ID.set("resp_123")
    try:
        log.info(
            "%s done",
            "job",
            extra={"response_status": "failed", "error_code": "server_error", "secret": "x-key"},
        )
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it broke")
    finally:
        REQUEST_ID.reset(request_token)
        RESPONSE_ID.reset(response_token)
        log.removeHandler(handler)
    log.info("outside")  # no handler: nothing written
    done, broke = _lines(stream.getvalue().encode())
    assert done["message"] == "job done" and done["level"] == "info"
    assert done["logger"] == "tests.logging.json"
    assert (done["request_id"], done["response_id"]) == ("req_abc", "resp_123")
    assert done["response_status"] == "failed" and done["error_code"] == "server_error"
    assert "secret" not in done
    assert broke["level"] == "error" and "ValueError: boom" in broke["exception"]


def test_a_json_line_outside_any_request_has_null_ids() -> None:
    stream = io.StringIO()
    handler = make_handler("json", stream)
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "plain", None, None)
    assert handler.filter(record)
    handler.emit(record)
    line = json.loads(stream.getvalue())
    assert line["request_id"] is None and line["response_id"] is None
    assert line["level"] == "warning"


def test_text_lines_keep_their_format() -> None:
    stream = io.StringIO()
    handler = make_handler("text", stream)
    record = logging.LogRecord("trio_responses.api", logging.INFO, __file__, 1, "GET /", None, None)
    token = REQUEST_ID.set("req_text")
    try:
        assert handler.filter(record)
        handler.emit(record)
    finally:
        REQUEST_ID.reset(token)
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO trio_responses.api \[req_text\]: GET /\n",
        stream.getvalue(),
    )


def test_log_format_flag_and_variable() -> None:
    parser = build_parser()
    assert config_from_args(parser.parse_args(["serve"]), {}).log_format == "text"
    environ = {"TRIO_RESPONSES_LOG_FORMAT": "json"}
    assert config_from_args(parser.parse_args(["serve"]), environ).log_format == "json"
    flagged = parser.parse_args(["serve", "--log-format", "text"])
    assert config_from_args(flagged, environ).log_format == "text"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--log-format", "xml"])
    with pytest.raises(ValueError, match="log_format"):
        Config(log_format="xml")  # type: ignore[arg-type]


@pytest.fixture
def log_lines() -> Iterator[dict[str, io.StringIO]]:
    """Everything the package logs at DEBUG and above, as text and as JSON lines."""
    streams = {"text": io.StringIO(), "json": io.StringIO()}
    handlers = [make_handler(kind, stream) for kind, stream in streams.items()]  # type: ignore[arg-type]
    package = logging.getLogger("trio_responses")
    level = package.level
    package.setLevel(logging.DEBUG)
    for handler in handlers:
        package.addHandler(handler)
    try:
        yield streams
    finally:
        for handler in handlers:
            package.removeHandler(handler)
        package.setLevel(level)


def _request_lines(streams: dict[str, io.StringIO], status: int) -> tuple[str, dict[str, Any]]:
    """The one access line of a request answered ``status``: as text, and as JSON."""
    (text,) = [line for line in streams["text"].getvalue().splitlines() if f" -> {status} " in line]
    (json_line,) = [
        line for line in _lines(streams["json"].getvalue().encode()) if line.get("status") == status
    ]
    return text, json_line


async def test_a_refusal_names_its_code_and_param_never_the_value(
    start_server: StartServer, log_lines: dict[str, io.StringIO]
) -> None:
    server = await start_server()
    reply = await server.http.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", "temperature": "SECRET-VALUE"}
    )
    assert reply.status_code == 400
    text, line = _request_lines(log_lines, 400)
    assert " -> 400 invalid_type (param temperature) (" in text, text
    assert (line["error_code"], line["param"]) == ("invalid_type", "temperature")
    for stream in log_lines.values():
        assert "SECRET-VALUE" not in stream.getvalue()


async def test_a_refused_name_cannot_break_the_line(
    start_server: StartServer, log_lines: dict[str, io.StringIO]
) -> None:
    server = await start_server()
    forged = "x\n2026-01-01 00:00:00,000 INFO trio_responses.api [-]: forged"
    reply = await server.http.post("/v1/responses", json={"model": MODEL, "input": "hi", forged: 1})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == forged
    text, line = _request_lines(log_lines, 400)
    assert "unknown_parameter (param x\\n2026-01-01" in text
    assert line["param"] == forged
    assert not any(
        entry.startswith("2026-01-01") for entry in log_lines["text"].getvalue().splitlines()
    )


async def test_errors_of_every_kind_name_their_code(
    start_server: StartServer, log_lines: dict[str, io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await start_server()
    assert (await server.http.get("/v1/nowhere")).status_code == 404
    text, line = _request_lines(log_lines, 404)
    assert "-> 404 not_found (" in text and line["error_code"] == "not_found"

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(server.service, "retrieve", broken)
    assert (await server.http.get("/v1/responses/resp_1")).status_code == 500
    text, line = _request_lines(log_lines, 500)
    assert "-> 500 server_error (" in text and line["error_code"] == "server_error"
    assert line.get("param") is None


async def test_websocket_error_events_are_logged_with_their_code(
    start_server: StartServer, log_lines: dict[str, io.StringIO]
) -> None:
    server = await start_server()
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    client = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    await stream.send_all(client.send(wsproto.events.Request(host=host, target="/v1/responses")))
    accepted = False
    while not accepted:
        client.receive_data(await stream.receive_some())
        accepted = any(isinstance(e, wsproto.events.AcceptConnection) for e in client.events())
    await stream.send_all(client.send(wsproto.events.TextMessage(data="not json")))
    with trio.fail_after(30):
        while "error event" not in log_lines["text"].getvalue():
            client.receive_data(await stream.receive_some())
            list(client.events())
    await stream.aclose()
    (text,) = [line for line in log_lines["text"].getvalue().splitlines() if "error event" in line]
    assert "WebSocket /v1/responses: error event 400 invalid_json" in text


async def test_debug_logs_the_shape_of_each_create_never_its_content(
    start_server: StartServer, log_lines: dict[str, io.StringIO]
) -> None:
    server = await start_server()
    await server.client.responses.create(
        model=MODEL,
        input=[
            {"role": "developer", "content": "zebras are secret"},
            {"role": "user", "content": "tell me about zebras"},
        ],
        instructions="never mention zebras",
        tools=[{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
        max_output_tokens=500,
        stream=False,
    )
    shapes = [line for line in log_lines["text"].getvalue().splitlines() if "request: " in line]
    assert len(shapes) == 1, shapes
    (shape,) = shapes
    assert " DEBUG trio_responses.service [req_" in shape
    for part in (
        "model='gpt-oss-scripted'",
        "input=2 items (message 2)",
        "tools=1 (function 1)",
        "instructions=20 chars",
        "max_output_tokens=500",
        "flags=store,parallel_tool_calls",
    ):
        assert part in shape, shape
    for stream in log_lines.values():
        assert "zebras" not in stream.getvalue()
        assert "lookup" not in stream.getvalue()


async def test_a_path_cannot_forge_a_line_in_either_format(
    start_server: StartServer, log_lines: dict[str, io.StringIO]
) -> None:
    server = await start_server()
    forged = "2026-01-01 00:00:00,000 INFO trio_responses.api [-]: forged"
    reply = await server.http.get("/nope%0d%0a" + forged.replace(" ", "%20"))
    assert reply.status_code == 404
    text, line = _request_lines(log_lines, 404)
    assert "/nope\\r\\n2026-01-01" in text, text
    assert line["path"] == "/nope\r\n" + forged
    for stream in log_lines.values():
        assert not any(
            entry.startswith("2026-01-01") for entry in stream.getvalue().splitlines()
        ), stream.getvalue()


def test_every_text_line_escapes_what_it_quotes() -> None:
    stream = io.StringIO()
    handler = make_handler("text", stream)
    record = logging.LogRecord(
        "trio_responses.tools", logging.WARNING, __file__, 1, "tool %r failed: %s", None, None
    )
    record.args = ("a\nb", "line\r\nbreak \x1b[31mred\u2028")
    handler.handle(record)
    (line,) = stream.getvalue().splitlines()
    assert line.endswith("tool 'a\\nb' failed: line\\r\\nbreak \\x1b[31mred\\u2028"), line
