"""Tool-call overhead and code-interpreter throughput.

    python bench/tools.py

1. Overhead: for a code-interpreter response in a warm container (created once,
   its process started by a first, untimed response), the time from the end of the
   turn in which the model wrote the call (``<|call|>``) to the start of the next
   turn (the tool's output is in the prompt), against running the same code in a
   warm container's process directly (``ContainerProcess.run``, no server). The
   difference is what the server adds: the container read from and written to the
   store, its files synced, the call's items and events.
2. Throughput: requests/s and p50/p99 latency for 32 concurrent code-interpreter
   responses over HTTP (server in its own process, ``--code-interpreter``), each
   with ``"container": {"type": "auto"}``: a new container, so a process started,
   per response (``--max-containers`` raised to allow them all; at most
   ``--max-live-containers`` processes are kept, the least recently used closed).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence

import trio

from trio_responses import Config, open_responses_service
from trio_responses.engine.base import GenerationRequest, GenerationResult, TokenSink
from trio_responses.tools.container_process import ContainerProcess
from trio_responses.tools.sandbox import Limits, probe_sandbox

from _harness import MODEL, Connection, request_bytes, running_server

SOURCE = "print(sum(range(1000)))\n"
CODE = f"```python\n{SOURCE}```"
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
        container = await service.files.create_container({"name": "bench"}, owner=None)
        tools = [{"type": "code_interpreter", "container": container["id"]}]
        gaps = []
        for _ in range(RUNS + 1):
            job = await service.create({"model": MODEL, "input": CODE, "tools": tools})
            response = await service.wait(job.id)
            assert response["output"][-1]["content"][0]["text"].startswith("Tool result: 499500")
            first_end = timed.turns[f"{job.id}-0"][1]
            second_start = timed.turns[f"{job.id}-1"][0]
            gaps.append(second_start - first_end)
        return gaps[1:]  # the first run starts the container's process, warms up the server


async def direct_calls() -> list[float]:
    config = Config(code_interpreter=True)
    sandbox = await probe_sandbox(config.python_sandbox)
    limits = Limits(
        cpu_s=config.python_cpu_s,
        memory_bytes=config.python_memory_mb * 1024 * 1024,
        wall_s=config.python_wall_s,
        processes=config.python_processes,
        disk_bytes=config.python_disk_mb * 1024 * 1024,
    )
    async with ContainerProcess.open(sandbox, limits) as container:
        times = []
        for _ in range(RUNS + 1):
            start = time.perf_counter()
            run = await container.run(SOURCE)
            times.append(time.perf_counter() - start)
            assert run.ok and run.logs == "499500\n", run
        return times[1:]


async def throughput() -> tuple[float, float, float, int]:
    latencies: list[float] = []
    errors = 0
    request = request_bytes({"model": MODEL, "input": CODE, "tools": TOOLS})
    # A new container per response: room for every one of them (16 by default).
    async with running_server("--code-interpreter", "--max-containers", "1000000") as (host, port):
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
                        if errors == 1:
                            said = json.dumps(answer)[:500]
                            print(f"first error: {status} {said}", file=sys.stderr)

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
    print(f"same code in a warm container directly (ContainerProcess.run): {_ms(direct)}")
    print(f"ratio (median): {statistics.median(through_server) / statistics.median(direct):.2f}")
    rate, p50, p99, errors = await throughput()
    print(
        f"{CONCURRENCY} concurrent code-interpreter responses: {rate:.1f} requests/s, "
        f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, errors {errors}"
    )


if __name__ == "__main__":
    sys.exit(trio.run(main))
