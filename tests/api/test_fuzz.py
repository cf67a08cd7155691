"""Fuzzing the HTTP API: whatever arrives, the answer is never a 5xx.

One ``trio-responses serve`` child for the whole test. Hypothesis (fixed seed)
builds Responses-shaped bodies, valid and broken: odd Unicode and lone
surrogates, unknown fields, deep nesting, huge and non-finite numbers, bytes
that are not JSON; and ids, query strings and headers. Every reply must be a
success or an error in the OpenAI shape with a code, every JSON body strict
JSON. At the end nothing runs, the server's memory has not grown with the
requests, and it stops cleanly.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
import trio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from tests.processes import ServeCommand
from tests.support import MODEL, parse_sse

pytestmark = pytest.mark.slow  # thousands of generated requests

EXAMPLES = 800
"""Each example sends two requests: about 20 s on a quiet 2-core box, 45 s on a busy one."""

MEMORY_GROWTH_BYTES = 64 * 1024 * 1024
"""How much the server's RSS may grow over the examples (it stores 20 responses at most)."""

ODD = [
    "",
    "\ud800",
    "x\udfff",
    "\udc00\ud800",
    "\x00",
    "\r\n",
    "\u2028",
    "\ufeff",
    "😀",
    "e\u0301",
    "resp_",
    "../",
    "%00",
    "NaN",
    "' OR 1=1",
    "\\u0000",
]

TEXT = st.one_of(
    *[st.text(max_size=12)] * 10,
    st.sampled_from(ODD),
    st.tuples(st.text(max_size=6), st.sampled_from(ODD), st.text(max_size=6)).map("".join),
)
NUMBER = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**63, 10**20, 1e308, -0.0, 5e-324]),
)
SCALAR = st.one_of(st.none(), st.booleans(), NUMBER, TEXT)
JSON_VALUE = st.recursive(
    SCALAR,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=10,
)


LONG_TEXT = st.one_of(
    TEXT,
    TEXT,
    st.builds(  # runs that byte-pair encoding handles in quadratic time
        lambda part, count: part * count,
        st.sampled_from(["x", " ", "日", "\u0301", ".", "1", "é", "ab", "\n"]),
        st.integers(0, 120_000),
    ),
)
"""Text for instructions and tool descriptions: short, or a long run of one piece."""

PATTERN = st.sampled_from(
    [
        "a*a*a*a*a*a*a*b",  # repeats one after another: polynomial backtracking
        "^(a+)+$",  # nested repeats: exponential backtracking
        "(a|aa)*c",
        "^(\\w+\\s?)*$",
        "(",  # not a regular expression
        "^[a-z]{2,4}-\\d+$",
        "\\p{L}+",
    ]
)
SCHEMA_FORMAT = st.builds(
    lambda pattern, kind: {
        "type": "json_schema",
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {"p": {"type": kind, "pattern": pattern}},
            "required": ["p"],
            "additionalProperties": False,
        },
    },
    PATTERN,
    st.sampled_from(["string", "string", "integer"]),
)
HINT = st.builds(lambda count: json.dumps({"p": "a" * count}), st.integers(0, 200))
"""Input the scripted model takes as the value to answer with (a pattern's worst case)."""


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``strategy`` most of the time, else any JSON value (the wrong type)."""
    return st.one_of(*[strategy] * 9, JSON_VALUE)


def item_dict(
    required: dict[str, st.SearchStrategy[Any]], optional: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[dict[str, Any]]:
    """A dictionary with ``required`` keys, some ``optional`` ones, rarely an unknown one."""
    extra = st.one_of(
        *[st.just({})] * 9,
        st.dictionaries(st.sampled_from(["foo", "extra", "\ud800", "type"]), JSON_VALUE),
    )
    return st.tuples(st.fixed_dictionaries(required, optional=optional), extra).map(
        lambda pair: {**pair[1], **pair[0]}
    )


PART = st.one_of(
    item_dict({"type": st.just("input_text"), "text": maybe(TEXT)}, {}),
    item_dict(
        {"type": st.just("output_text"), "text": maybe(TEXT)},
        {"annotations": st.just([]), "logprobs": maybe(st.just([]))},
    ),
    item_dict({"type": st.sampled_from(["refusal", "input_image", "nope"])}, {"refusal": TEXT}),
)
ITEM = st.one_of(
    item_dict(
        {
            "role": st.sampled_from(["user", "assistant", "system", "developer", "robot"]),
            "content": maybe(st.one_of(TEXT, st.lists(PART, max_size=3))),
        },
        {"type": st.just("message"), "id": TEXT, "status": TEXT, "phase": TEXT},
    ),
    item_dict(
        {
            "type": st.just("function_call"),
            "call_id": maybe(TEXT),
            "name": maybe(TEXT),
            "arguments": maybe(TEXT),
        },
        {"id": TEXT, "status": st.just("completed")},
    ),
    item_dict(
        {"type": st.just("function_call_output"), "call_id": maybe(TEXT), "output": maybe(TEXT)},
        {},
    ),
    item_dict(
        {"type": st.just("reasoning")},
        {"summary": st.lists(PART, max_size=2), "content": JSON_VALUE, "encrypted_content": TEXT},
    ),
    item_dict(
        {
            "type": st.sampled_from(["mcp_approval_response", "mcp_call", "mcp_list_tools"]),
            "id": TEXT,
        },
        {
            "approval_request_id": TEXT,
            "approve": maybe(st.booleans()),
            "server_label": TEXT,
            "name": TEXT,
            "arguments": TEXT,
            "tools": JSON_VALUE,
        },
    ),
    st.dictionaries(TEXT, JSON_VALUE, max_size=3),
)
TOOL = st.one_of(
    item_dict(
        {"type": st.just("function"), "name": maybe(st.sampled_from(["f", "g_1", "", "bad name"]))},
        {"description": LONG_TEXT, "parameters": JSON_VALUE, "strict": maybe(st.booleans())},
    ),
    item_dict(
        {
            "type": st.just("mcp"),
            "server_label": maybe(st.sampled_from(["remote", "python", "x" * 70])),
        },
        {
            "server_url": st.sampled_from(
                [
                    "http://127.0.0.1:9/mcp",  # allowed, nothing listens: the listing fails
                    "http://127.0.0.1:99999/mcp",
                    "http://[::1/mcp",
                    "ftp://127.0.0.1/",
                    "http://example.com/mcp",
                    "",
                ]
            ),
            "headers": maybe(st.dictionaries(TEXT, TEXT, max_size=3)),
            "authorization": maybe(TEXT),
            "require_approval": maybe(st.sampled_from(["never", "always"])),
            "allowed_tools": JSON_VALUE,
        },
    ),
    item_dict({"type": st.sampled_from(["code_interpreter", "web_search", "file_search"])}, {}),
    JSON_VALUE,
)
BODY = item_dict(
    {"model": st.one_of(st.just(MODEL), st.just(MODEL), TEXT)},
    {
        "input": maybe(st.one_of(TEXT, HINT, st.lists(ITEM, max_size=4))),
        "instructions": maybe(LONG_TEXT),
        "tools": maybe(st.lists(TOOL, max_size=3)),
        "tool_choice": JSON_VALUE,
        "max_output_tokens": maybe(st.integers(-5, 64)),
        "max_tool_calls": NUMBER,
        "temperature": NUMBER,
        "top_p": NUMBER,
        "reasoning": maybe(st.fixed_dictionaries({"effort": st.sampled_from(["low", "x"])})),
        "text": st.one_of(JSON_VALUE, st.fixed_dictionaries({"format": SCHEMA_FORMAT})),
        "store": maybe(st.booleans()),
        "stream": maybe(st.booleans()),
        "background": maybe(st.booleans()),
        "previous_response_id": TEXT,
        "metadata": maybe(st.dictionaries(TEXT, TEXT, max_size=3)),
        "user": TEXT,
        "prompt_cache_key": TEXT,
        "safety_identifier": TEXT,
        "truncation": maybe(st.sampled_from(["auto", "disabled"])),
        "include": maybe(st.lists(TEXT, max_size=2)),
        "service_tier": TEXT,
        "stream_options": JSON_VALUE,
    },
)


def encode(body: dict[str, Any], how: str, size: int) -> bytes:
    """A body as bytes: plain JSON, or broken (or merely unusual) in one way."""
    if how == "large":  # past the inline size: parsed in a worker thread
        body = {**body, "prompt_cache_key": "large " * (size * 2)}
    raw = json.dumps(body).encode()
    more = b", " if body else b""
    if how == "deep":
        depth = size % 3_000
        raw = raw[:-1] + more + b'"stream_options": {"x": ' + b"[" * depth + b"0" + b"]" * depth
        raw += b"}}"
    elif how == "bigint":
        raw = raw[:-1] + more + b'"max_tool_calls": 1' + b"0" * (4_000 + size) + b"}"
    elif how == "truncated":
        raw = raw[: size % max(len(raw), 1)]
    elif how == "not-utf8":
        raw = raw.replace(b"{", b"{\xff", 1)
    elif how == "array":
        raw = b"[" + raw + b"]"
    return raw


BODY_BYTES = st.builds(
    encode,
    BODY,
    st.sampled_from(
        ["plain", "plain", "plain", "deep", "large", "bigint", "truncated", "not-utf8", "array"]
    ),
    st.integers(0, 20_000),
)


def quoted(text: str) -> str:
    """Percent-encoded bytes of ``text`` (lone surrogates as their raw code units)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


PATH_ID = st.one_of(st.none(), TEXT, st.integers(1, 300).map(lambda n: "r" * n))
QUERY = st.dictionaries(
    st.sampled_from(
        ["limit", "after", "order", "include", "include[]", "stream", "starting_after"]
    ),
    st.one_of(TEXT, st.integers(-3, 200).map(str), st.sampled_from(["true", "asc", "9" * 5000])),
    max_size=3,
)
ROUTE = st.sampled_from(
    [
        ("GET", "/v1/responses/{id}"),
        ("GET", "/v1/responses/{id}/input_items"),
        ("POST", "/v1/responses/{id}/cancel"),
        ("DELETE", "/v1/responses/{id}"),
        ("GET", "/v1/models/{id}"),
        ("PUT", "/v1/responses"),
        ("GET", "/v1/{id}"),
    ]
)
HEADER_VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20).map(
    str.strip  # what an HTTP client can send
)
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "Authorization": HEADER_VALUE,
        "Last-Event-ID": HEADER_VALUE,
        "Content-Type": st.sampled_from(["application/json", "text/plain", "", "x/y; charset=xx"]),
        "Accept": HEADER_VALUE,
    },
)


def strict_json(raw: bytes | str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"non-strict JSON from the server: {name}")

    return json.loads(raw, parse_constant=refuse)


def check_reply(response: httpx2.Response, *, what: str) -> None:
    status = response.status_code
    assert status < 500, f"{what}: {status} {response.text[:300]}"
    kind = response.headers.get("content-type", "")
    if status >= 400:
        body = strict_json(response.content)
        assert set(body) == {"error"}, what
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"}, what
        assert isinstance(error["code"], str) and error["code"], f"{what}: {error}"
        assert isinstance(error["message"], str) and error["message"], what
    elif kind.startswith("application/json"):
        strict_json(response.content)
    elif kind.startswith("text/event-stream"):
        for event in parse_sse(response.content):
            if event.data != "[DONE]":
                strict_json(event.data)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fuzz(url: str) -> int:
    """Run the examples against ``url`` (in a worker thread); returns requests sent."""
    sent = 0
    known: list[str] = []
    with httpx2.Client(base_url=url, timeout=60) as http:

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        )
        @given(
            body=BODY_BYTES,
            headers=HEADERS,
            route=ROUTE,
            path_id=PATH_ID,
            query=QUERY,
        )
        def one(
            body: bytes,
            headers: dict[str, str],
            route: tuple[str, str],
            path_id: str | None,
            query: dict[str, str],
        ) -> None:
            nonlocal sent
            created = http.post("/v1/responses", content=body, headers=headers)
            check_reply(created, what=f"POST {body[:200]!r} {headers}")
            if created.status_code == 200 and created.headers["content-type"].startswith(
                "application/json"
            ):
                known.append(created.json()["id"])
            method, template = route
            identifier = known[-1] if path_id is None and known else (path_id or "")
            path = template.format(id=quoted(identifier))
            if query:
                path += "?" + "&".join(f"{quoted(k)}={quoted(v)}" for k, v in query.items())
            replied = http.request(method, path, headers=headers)
            check_reply(replied, what=f"{method} {path[:200]} {headers}")
            sent += 2

        one()
    return sent


async def test_fuzzed_requests_never_get_a_5xx(nursery: trio.Nursery) -> None:
    command = await ServeCommand.start(
        nursery,
        "--mcp-allow-host",
        "127.0.0.1",
        "--max-stored-responses",
        "20",
        "--max-retained-streams",
        "20",
        "--tool-timeout",
        "5",
    )
    pid = command.process.pid
    async with httpx2.AsyncClient(base_url=command.url, timeout=60) as http:
        # Warm up: the allocator, the caches and the store's 20 places are filled first.
        for index in range(40):
            warm = await http.post("/v1/responses", json={"model": MODEL, "input": f"warm {index}"})
            assert warm.status_code == 200
        before = rss_bytes(pid)
        started = time.monotonic()
        sent = await trio.to_thread.run_sync(partial(fuzz, command.url))
        elapsed = time.monotonic() - started

        for _ in range(600):  # background responses the fuzzer started finish (60 s)
            health = (await http.get("/health")).json()
            if not health["jobs"]["running"]:
                break
            await trio.sleep(0.1)
        assert health["jobs"] == {**health["jobs"], "running": 0, "active": 0, "queued": 0}
        grown = rss_bytes(pid) - before
    assert sent >= EXAMPLES
    assert grown < MEMORY_GROWTH_BYTES, f"RSS grew {grown / 2**20:.0f} MiB over {sent} requests"
    assert await command.stop(timeout_s=30) == 0
    assert b"Traceback" not in command.log, command.log.decode(errors="replace")[-3000:]
    print(f"{sent} requests in {elapsed:.1f} s; RSS {grown / 2**20:+.1f} MiB")


WS_EXAMPLES = 150
"""WebSocket messages sent, one after another on one connection."""

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}

FRAME = st.one_of(
    BODY.map(lambda body: json.dumps({"type": "response.create", **body})),
    BODY.map(lambda body: json.dumps({"type": "response.create", "generate": False, **body})),
    st.builds(
        lambda body, kind: json.dumps({**body, "type": kind}),
        BODY,
        st.one_of(TEXT, st.none(), st.just("response.create")),
    ),
    BODY_BYTES,  # binary frames
    st.sampled_from(["", b"", "{", "[]", "null"]),
    TEXT,
).map(
    # A text message is UTF-8: lone surrogates cannot go out as they are.
    lambda frame: (
        frame.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        if isinstance(frame, str)
        else frame
    )
)


def fuzz_websocket(url: str) -> int:
    """Send the examples as WebSocket messages on one connection (in a worker thread);
    each must be answered by an ``error`` event or a response's events up to its
    terminal one, none of them a server error. Returns messages sent."""
    sent = 0
    address = url.replace("http", "ws", 1) + "/v1/responses"
    with connect(address, max_size=None, open_timeout=30) as connection:

        @settings(
            max_examples=WS_EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(frame=FRAME)
        def one(frame: str | bytes) -> None:
            nonlocal sent
            connection.send(frame)
            sent += 1
            while True:
                event = strict_json(connection.recv(timeout=60))
                if event["type"] == "error":
                    error = event["error"]
                    assert event["status"] < 500, f"{frame[:200]!r}: {event}"
                    assert isinstance(error["code"], str) and error["code"], event
                    return
                if event["type"] in TERMINAL:
                    failure = event["response"].get("error") or {}
                    assert failure.get("code") != "server_error", f"{frame[:200]!r}: {event}"
                    return

        one()
    return sent


async def test_fuzzed_websocket_messages_never_get_a_server_error(nursery: trio.Nursery) -> None:
    command = await ServeCommand.start(
        nursery, "--mcp-allow-host", "127.0.0.1", "--tool-timeout", "5"
    )
    sent = await trio.to_thread.run_sync(partial(fuzz_websocket, command.url))
    assert sent >= WS_EXAMPLES
    async with httpx2.AsyncClient(base_url=command.url, timeout=60) as http:
        assert (await http.get("/health")).status_code == 200
    assert await command.stop(timeout_s=30) == 0
    assert b"Traceback" not in command.log, command.log.decode(errors="replace")[-3000:]
