"""``/health`` latency while large requests are processed, and the cost of truncation.

    python bench/event_loop.py [--skip-truncation] [--skip-hostile]

A server (scripted engine, ``--max-model-len 8192``) runs in its own process.
One client samples ``GET /health`` back to back over a keep-alive connection
and reports p50/p99/max latency for each phase:

- idle;
- two clients each posting a ~15 MB body three times: one message of ~15 MB
  of English text, and 2,000 items of ~7.5 KB each (both too long for the
  context window, so each ends as a 400);
- one ``truncation: "auto"`` request of 2,000 items (~120k tokens) that must be
  cut to fit 8,192 tokens; also prints how long that request took;
- small hostile requests, three times each, on a server with
  ``--max-model-len 131072``: a run of one letter (60,000) or one ideogram as
  input, 300,000 letters of instructions, 150,000 counted by ``input_tokens``, a
  100,000-letter tool description (a 400), twenty tools of 26 KB of prose, and
  a JSON-schema ``pattern`` that backtracks (``a*a*a*a*a*a*a*b``) against 60
  letters. Each once froze the loop for seconds to minutes; the target is
  ``/health`` p99 < 50 ms.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import trio

from _harness import MODEL, Connection, get_bytes, request_bytes, running_server

MAX_MODEL_LEN = 8192
IDLE_S = 2.0
POSTS_PER_CLIENT = 3
SENTENCE = "The quick brown fox jumps over the lazy dog while the cat sleeps. "


def huge_message() -> bytes:
    text = SENTENCE * (15_000_000 // len(SENTENCE))
    return request_bytes({"model": MODEL, "input": text})


def many_items() -> bytes:
    text = SENTENCE * (7_400 // len(SENTENCE))
    items = [{"role": "user", "content": text} for _ in range(2_000)]
    return request_bytes({"model": MODEL, "input": items})


def truncated_conversation() -> bytes:
    items: list[dict[str, str]] = []
    for index in range(1_999):
        role = "user" if index % 2 == 0 else "assistant"
        items.append({"role": role, "content": f"Turn {index}. " + SENTENCE * 4})
    items.append({"role": "user", "content": "And now?"})
    return request_bytes({"model": MODEL, "input": items, "truncation": "auto"})


def hostile_requests() -> dict[str, bytes]:
    function = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    schema = {
        "type": "object",
        "properties": {"p": {"type": "string", "pattern": "a*a*a*a*a*a*a*b"}},
        "required": ["p"],
        "additionalProperties": False,
    }
    tools = [{**function, "name": f"tool_{n}", "description": SENTENCE * 400} for n in range(20)]
    bodies: dict[str, tuple[str, dict[str, object]]] = {
        "letter-input": ("/v1/responses", {"input": "x" * 60_000}),
        "ideogram-in": ("/v1/responses", {"input": "日" * 60_000}),
        "instructions": ("/v1/responses", {"input": "hi", "instructions": "x" * 300_000}),
        "input-tokens": (
            "/v1/responses/input_tokens",
            {"input": "hi", "instructions": "x" * 150_000},
        ),
        "tool-400": (
            "/v1/responses",
            {"input": "hi", "tools": [{**function, "description": "x" * 100_000}]},
        ),
        "many-tools": ("/v1/responses", {"input": "hi", "tools": tools}),
        "pattern": (
            "/v1/responses",
            {
                "input": json.dumps({"p": "a" * 60}),
                "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema}},
            },
        ),
    }
    return {
        name: request_bytes({"model": MODEL, **body}, path=path)
        for name, (path, body) in bodies.items()
    }


async def sample_health(host: str, port: int, latencies: list[float], done: trio.Event) -> None:
    request = get_bytes("/health")
    while not done.is_set():
        connection = await Connection.open(host, port)
        async with connection.stream:
            while not done.is_set():
                start = time.perf_counter()
                try:
                    status, _ = await connection.request(request)
                except ConnectionError:
                    break  # keep-alive limit reached: reconnect, like any client
                latencies.append(time.perf_counter() - start)
                if status != 200:
                    raise RuntimeError(f"/health answered {status}")


async def post(host: str, port: int, body: bytes, times: int, statuses: list[int]) -> None:
    connection = await Connection.open(host, port)
    async with connection.stream:
        for _ in range(times):
            status, _ = await connection.request(body)
            statuses.append(status)


def report(phase: str, latencies: list[float], extra: str = "") -> None:
    quantiles = statistics.quantiles(latencies, n=100)
    print(
        f"{phase:<12} /health n={len(latencies):<6} p50={quantiles[49] * 1000:.1f} ms  "
        f"p99={quantiles[98] * 1000:.1f} ms  max={max(latencies) * 1000:.1f} ms{extra}",
        flush=True,
    )


async def phase(host: str, port: int, name: str, *loads: tuple[bytes, int]) -> None:
    latencies: list[float] = []
    statuses: list[int] = []
    done = trio.Event()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample_health, host, port, latencies, done)
        if loads:
            async with trio.open_nursery() as clients:
                for body, times in loads:
                    clients.start_soon(post, host, port, body, times, statuses)
        else:
            await trio.sleep(IDLE_S)
        done.set()
    elapsed = time.perf_counter() - start
    extra = f"  statuses={sorted(set(statuses))} took={elapsed:.2f} s" if loads else ""
    report(name, latencies, extra)


async def main(truncation: bool, hostile: bool) -> None:
    bodies = (huge_message(), many_items())
    conversation = truncated_conversation()
    print(
        f"bodies: {len(bodies[0]) / 1e6:.1f} MB, {len(bodies[1]) / 1e6:.1f} MB; "
        f"truncation body {len(conversation) / 1e6:.2f} MB",
        flush=True,
    )
    async with running_server("--max-model-len", str(MAX_MODEL_LEN)) as (host, port):
        await phase(host, port, "idle")
        await phase(
            host, port, "large-bodies", (bodies[0], POSTS_PER_CLIENT), (bodies[1], POSTS_PER_CLIENT)
        )
        if truncation:
            await phase(host, port, "truncation", (conversation, 1))
    if hostile:
        async with running_server("--max-model-len", "131072") as (host, port):
            for name, body in hostile_requests().items():
                await phase(host, port, name, (body, 3))


if __name__ == "__main__":
    flags = sys.argv[1:]
    trio.run(main, "--skip-truncation" not in flags, "--skip-hostile" not in flags)
