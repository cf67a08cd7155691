"""No request freezes the event loop: ``/health`` stays fast while large requests
are parsed, validated, rendered and truncated."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import pytest
import trio

from tests.processes import ServeCommand
from tests.support import MODEL

MAX_MODEL_LEN = 8192
SENTENCE = "The quick brown fox jumps over the lazy dog while the cat sleeps. "


def _huge_message() -> bytes:
    """~15 MB: one message of English text."""
    return json.dumps({"model": MODEL, "input": SENTENCE * (15_000_000 // len(SENTENCE))}).encode()


def _many_items() -> bytes:
    """~15 MB: 2,000 messages of ~7.4 KB."""
    text = SENTENCE * (7_400 // len(SENTENCE))
    return json.dumps(
        {"model": MODEL, "input": [{"role": "user", "content": text} for _ in range(2_000)]}
    ).encode()


def _long_conversation() -> bytes:
    """2,000 items, ~60 tokens each: far more than the context window."""
    items = [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"Turn {n}. " + SENTENCE * 4}
        for n in range(1_999)
    ]
    items.append({"role": "user", "content": "And now?"})
    return json.dumps({"model": MODEL, "input": items, "truncation": "auto"}).encode()


async def _sample_health(
    http: httpx2.AsyncClient, done: trio.Event, latencies: list[float]
) -> None:
    """``GET /health`` on one keep-alive connection, one request after another, until
    ``done``: each latency on this test's clock."""
    while not done.is_set():
        start = time.perf_counter()
        response = await http.get("/health")
        latencies.append(time.perf_counter() - start)
        assert response.status_code == 200


async def _latencies_during(
    url: str, work: Callable[[httpx2.AsyncClient], Awaitable[None]], timeout_s: float
) -> list[float]:
    """``/health`` latencies (`_sample_health`) while ``work`` runs with a client of its own."""
    latencies: list[float] = []
    done = trio.Event()
    with trio.fail_after(timeout_s):
        async with httpx2.AsyncClient(base_url=url, timeout=120) as sampler:
            await sampler.get("/health")  # connected and warm
            async with trio.open_nursery() as inner:
                inner.start_soon(_sample_health, sampler, done, latencies)
                async with httpx2.AsyncClient(base_url=url, timeout=120) as http:
                    await work(http)
                done.set()
    return latencies


async def test_health_stays_fast_while_large_requests_are_processed(
    nursery: trio.Nursery,
) -> None:
    server = await ServeCommand.start(nursery, "--max-model-len", str(MAX_MODEL_LEN))
    huge, many, conversation = _huge_message(), _many_items(), _long_conversation()
    assert len(huge) > 14_000_000 and len(many) > 14_000_000
    latencies: list[float] = []
    done = trio.Event()
    headers = {"Content-Type": "application/json"}

    async def post_too_long(body: bytes) -> None:
        async with httpx2.AsyncClient(base_url=server.url, timeout=120) as http:
            for _ in range(5):
                response = await http.post("/v1/responses", content=body, headers=headers)
                assert response.status_code == 400, response.text[:300]
                assert response.json()["error"]["code"] == "context_length_exceeded"

    truncated: dict[str, object] = {}

    async def post_truncated() -> None:
        async with httpx2.AsyncClient(base_url=server.url, timeout=120) as http:
            started = time.perf_counter()
            response = await http.post("/v1/responses", content=conversation, headers=headers)
            truncated["seconds"] = time.perf_counter() - started
            assert response.status_code == 200, response.text[:300]
            truncated.update(response.json())

    with trio.fail_after(300):
        async with httpx2.AsyncClient(base_url=server.url, timeout=120) as sampler:
            await sampler.get("/health")  # connected and warm
            async with trio.open_nursery() as inner:
                inner.start_soon(_sample_health, sampler, done, latencies)
                async with trio.open_nursery() as clients:
                    clients.start_soon(post_too_long, huge)
                    clients.start_soon(post_too_long, many)
                await post_truncated()
                done.set()

    # The conversation was cut to fit the window and answered (for as long as the
    # room left allows: "incomplete" when the prompt fills the window).
    assert truncated["status"] in ("completed", "incomplete"), truncated
    usage = truncated["usage"]
    assert isinstance(usage, dict) and MAX_MODEL_LEN / 2 < usage["input_tokens"] < MAX_MODEL_LEN
    assert len(latencies) >= 100
    p50, p99 = (statistics.quantiles(latencies, n=100)[q] for q in (49, 98))
    # Generous (a loaded 2-core machine): processing these on the loop stalls it for
    # seconds. The figures of a quiet machine are bench/event_loop.py's.
    assert p99 < 0.5, f"/health p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"


async def test_health_stays_fast_while_references_to_large_items_are_rendered(
    nursery: trio.Nursery,
) -> None:
    """A small body can stand for megabytes: ``item_reference`` items resolve to
    stored ones, and the resolved request is what is validated and rendered."""
    server = await ServeCommand.start(nursery, "--max-model-len", "32768")
    headers = {"Content-Type": "application/json"}
    text = SENTENCE * (40_000 // len(SENTENCE))
    ids: list[str] = []
    async with httpx2.AsyncClient(base_url=server.url, timeout=120) as http:
        for _ in range(6):  # 600 stored items of ~40 KB
            seed = {
                "model": MODEL,
                "input": [{"role": "user", "content": text}] * 100,
                "truncation": "auto",
            }
            response = await http.post("/v1/responses", json=seed)
            assert response.status_code == 200, response.text[:300]
            items = await http.get(
                f"/v1/responses/{response.json()['id']}/input_items", params={"limit": 100}
            )
            ids += [item["id"] for item in items.json()["data"]]
    body = json.dumps(
        {
            "model": MODEL,
            "input": [{"type": "item_reference", "id": item_id} for item_id in ids],
            "truncation": "auto",
        }
    ).encode()
    assert len(ids) == 600 and len(body) < 64 * 1024  # small enough to decode inline

    async def post_references(http: httpx2.AsyncClient) -> None:
        for _ in range(2):
            response = await http.post("/v1/responses", content=body, headers=headers)
            assert response.status_code == 200, response.text[:300]
            assert response.json()["status"] in ("completed", "incomplete")

    latencies = await _latencies_during(server.url, post_references, 120)
    # Rendered on the loop, each of these stalls it for about a second (more on a
    # loaded machine); in a worker thread, /health answers within a few ms.
    assert max(latencies) < 0.5, f"/health took up to {max(latencies) * 1000:.0f} ms"


def _hostile_requests() -> dict[str, tuple[str, dict[str, Any], int]]:
    """Small requests whose text is the worst case for tokenizing or matching:
    (route, body, expected status)."""
    function = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    pattern = {
        "type": "json_schema",
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {"p": {"type": "string", "pattern": "a*a*a*a*a*a*a*b"}},
            "required": ["p"],
            "additionalProperties": False,
        },
    }
    create = "/v1/responses"
    return {
        "one letter as input": (create, {"model": MODEL, "input": "x" * 60_000}, 200),
        "one ideogram as input": (create, {"model": MODEL, "input": "日" * 60_000}, 200),
        "one letter as instructions": (
            create,
            {"model": MODEL, "input": "hi", "instructions": "x" * 300_000},
            200,
        ),
        "counted instructions": (
            "/v1/responses/input_tokens",
            {"model": MODEL, "input": "hi", "instructions": "x" * 150_000},
            200,
        ),
        "a long tool description": (
            create,
            {"model": MODEL, "input": "hi", "tools": [{**function, "description": "x" * 100_000}]},
            400,
        ),
        "many tool descriptions": (
            create,
            {
                "model": MODEL,
                "input": "hi",
                "tools": [
                    {**function, "name": f"tool_{n}", "description": SENTENCE * 400}
                    for n in range(20)
                ],
            },
            200,
        ),
        "a backtracking pattern": (
            create,
            {"model": MODEL, "input": json.dumps({"p": "a" * 60}), "text": {"format": pattern}},
            200,
        ),
    }


HOSTILE = _hostile_requests()


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_health_stays_fast_while_hostile_text_is_handled(
    nursery: trio.Nursery, name: str
) -> None:
    route, body, status = HOSTILE[name]
    server = await ServeCommand.start(nursery, "--max-model-len", "131072")

    async def post_hostile(http: httpx2.AsyncClient) -> None:
        sent, started = 0, time.perf_counter()
        while sent < 3 or time.perf_counter() - started < 2:  # quick ones again
            reply = await http.post(route, json=body)
            assert reply.status_code == status, reply.text[:300]
            sent += 1

    latencies = await _latencies_during(server.url, post_hostile, 300)
    assert len(latencies) >= 20
    p50, p99 = (statistics.quantiles(latencies, n=100)[q] for q in (49, 98))
    # Held on the loop, each of these froze it for seconds to minutes; the target is
    # p99 < 50 ms (bench/event_loop.py), bounded generously here for a loaded machine.
    assert p99 < 0.5, f"{name}: /health p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
    assert await server.stop(timeout_s=60) == 0
