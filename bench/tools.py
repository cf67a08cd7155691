"""Tool-call overhead and code-interpreter throughput.

    python bench/tools.py

1. Overhead: for a code-interpreter response, the time from the end of the turn
   in which the model wrote the call (``<|call|>``) to the start of the next turn
   (the tool's output is in the prompt), against calling the same bundled python
   MCP server directly with the SDK (``ClientSession.call_tool``). Both include
   running the code in a fresh sandboxed process, which dominates.
2. Throughput: requests/s and p50/p99 latency for 32 concurrent code-interpreter
   responses over HTTP (server in its own process, ``--code-interpreter``).
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import time
from collections.abc import Sequence

import trio
from mcp import ClientSession, StdioServerParameters, stdio_client

from trio_responses import Config, open_responses_service
from trio_responses.engine.base import GenerationRequest, GenerationResult, TokenSink

from _harness import MODEL, Connection, request_bytes, running_server

CODE = "```python\nprint(sum(range(1000)))\n```"
TOOLS = [{"type": "code_interpreter", "container": {"type": "auto"}}]
RUNS = 30
CONCURRENCY = 32
DURATION_S = 10.0


class TimedEngine:
    """Wraps the engine and notes when each generation turn starts and ends."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.turns: dict[str, tuple[float, float]] = {}

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def generate(self, request: GenerationRequest, sink: TokenSink) -> GenerationResult:
        start = time.perf_counter()
        result: GenerationResult = await self.inner.generate(request, sink)  # type: ignore[attr-defined]
        self.turns[request.request_id] = (start, time.perf_counter())
        return result


async def overhead_through_server() -> list[float]:
    config = Config(code_interpreter=True, log_level="warning")
    async with open_responses_service(config) as service:
        timed = TimedEngine(service.engine)
        # The job runner holds the engine its jobs generate with: time that one.
        service._runner._engine = timed  # type: ignore[assignment]
        gaps = []
        for _ in range(RUNS + 1):
            job = await service.create({"model": MODEL, "input": CODE, "tools": TOOLS})
            response = await service.wait(job.id)
            assert response["output"][-1]["content"][0]["text"].startswith("Tool result: 499500")
            first_end = timed.turns[f"{job.id}-0"][1]
            second_start = timed.turns[f"{job.id}-1"][0]
            gaps.append(second_start - first_end)
        return gaps[1:]  # the first run warms up imports and the server


async def direct_calls() -> list[float]:
    command = shlex.split(Config(code_interpreter=True).all_tool_servers[0].split("stdio:", 1)[1])
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        times = []
        for _ in range(RUNS + 1):
            start = time.perf_counter()
            result = await session.call_tool("python", {"code": "print(sum(range(1000)))\n"})
            times.append(time.perf_counter() - start)
            assert not result.is_error
        return times[1:]


async def throughput() -> tuple[float, float, float, int]:
    latencies: list[float] = []
    errors = 0
    request = request_bytes({"model": MODEL, "input": CODE, "tools": TOOLS})
    async with running_server("--code-interpreter") as (host, port):
        deadline = time.perf_counter() + DURATION_S

        async def worker() -> None:
            nonlocal errors
            connection = await Connection.open(host, port)
            async with connection.stream:
                while time.perf_counter() < deadline:
                    start = time.perf_counter()
                    status, body = await connection.request(request)
                    latencies.append(time.perf_counter() - start)
                    answer = json.loads(body)["output"][-1]
                    if status != 200 or "499500" not in json.dumps(answer):
                        errors += 1

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(worker)
        elapsed = time.perf_counter() - start
    quantiles = statistics.quantiles(latencies, n=100)
    return len(latencies) / elapsed, quantiles[49], quantiles[98], errors


def _ms(values: Sequence[float]) -> str:
    median = statistics.median(values) * 1000
    p90 = statistics.quantiles(values, n=10)[8] * 1000
    return f"median {median:.1f} ms, p90 {p90:.1f} ms"


async def main() -> None:
    through_server = await overhead_through_server()
    direct = await direct_calls()
    print(f"tool call through the server (call token -> output in prompt): {_ms(through_server)}")
    print(f"same MCP call made directly with the SDK:                     {_ms(direct)}")
    print(f"ratio (median): {statistics.median(through_server) / statistics.median(direct):.2f}")
    rate, p50, p99, errors = await throughput()
    print(
        f"{CONCURRENCY} concurrent code-interpreter responses: {rate:.1f} requests/s, "
        f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, errors {errors}"
    )


if __name__ == "__main__":
    sys.exit(trio.run(main))
