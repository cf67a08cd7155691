"""Code interpreter calls in a warm container against a fresh sandbox per run.

    python bench/containers.py

1. Per call, one at a time: ``ContainerProcess.run`` in a container started once
   (after one warm-up call) against ``run_python``, which starts a fresh sandboxed
   process for every run (what the stateless python MCP server does per call).
2. Through the server (its own process), 32 concurrent code-interpreter responses for
   10 s, each worker on its own keep-alive connection:

   - containers: ``serve --code-interpreter``; each worker creates its own container
     once (``POST /v1/containers``) and names it in every response; one untimed
     response each first starts the containers' processes, so every timed call runs
     in a warm container;
   - fresh sandbox per run: ``serve --tool-server python=stdio:"... tool-server python
     --stdio"``, the stateless bundled MCP server.

   responses/s, p50/p99 latency and errors (a status other than 200, or an answer
   without the code's output).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence

import trio

from trio_responses.tools.container_process import ContainerProcess
from trio_responses.tools.sandbox import Limits, Sandbox, probe_sandbox, run_python

from _harness import MODEL, Connection, request_bytes, running_server

SOURCE = "print(sum(range(1000)))\n"
CODE = f"```python\n{SOURCE}```"
EXPECTED = "499500"
CALLS = 50
CONCURRENCY = 32
DURATION_S = 10.0
CONTAINER_FLAGS = (
    "--code-interpreter",
    "--max-live-containers",
    "40",
    "--max-containers",
    "40",
    # Each live container counts as one run's worst case: room for 40 of them.
    "--python-memory-budget-mb",
    "200000",
)
STATELESS_FLAGS = (
    "--tool-server",
    f"python=stdio:{sys.executable} -m trio_responses tool-server python --stdio",
)


async def warm_container_calls(sandbox: Sandbox) -> list[float]:
    times = []
    async with ContainerProcess.open(sandbox, Limits()) as container:
        for _ in range(CALLS + 1):
            start = time.perf_counter()
            run = await container.run(SOURCE)
            times.append(time.perf_counter() - start)
            assert run.ok and run.logs == f"{EXPECTED}\n", run
    return times[1:]  # the first call warms up


async def fresh_sandbox_calls(sandbox: Sandbox) -> list[float]:
    times = []
    for _ in range(CALLS + 1):
        start = time.perf_counter()
        result = await run_python(SOURCE, Limits(), sandbox=sandbox)
        times.append(time.perf_counter() - start)
        assert result.ok and result.output == f"{EXPECTED}\n", result
    return times[1:]


async def throughput(*flags: str, containers: bool) -> tuple[float, float, float, int]:
    """responses/s, p50 and p99 latency (s), errors of CONCURRENCY workers for
    DURATION_S against ``serve FLAGS``."""
    latencies: list[float] = []
    errors = 0
    async with running_server(*flags) as (host, port):
        connections = [await Connection.open(host, port) for _ in range(CONCURRENCY)]
        requests = []
        for number, connection in enumerate(connections):
            tool: dict[str, object] = {"type": "code_interpreter", "container": {"type": "auto"}}
            if containers:
                status, body = await connection.request(
                    request_bytes({"name": f"bench-{number}"}, "/v1/containers")
                )
                assert status == 200, body
                tool["container"] = json.loads(body)["id"]
            requests.append(request_bytes({"model": MODEL, "input": CODE, "tools": [tool]}))

        async def warm_up(connection: Connection, request: bytes) -> None:
            status, body = await connection.request(request)
            assert status == 200 and EXPECTED in body.decode(), body

        # One response each first (it starts the container's process), not timed.
        async with trio.open_nursery() as nursery:
            for connection, request in zip(connections, requests, strict=True):
                nursery.start_soon(warm_up, connection, request)
        deadline = time.perf_counter() + DURATION_S

        async def worker(connection: Connection, request: bytes) -> None:
            nonlocal errors
            async with connection.stream:
                while time.perf_counter() < deadline:
                    start = time.perf_counter()
                    status, body = await connection.request(request)
                    latencies.append(time.perf_counter() - start)
                    answer = json.dumps(json.loads(body)["output"][-1])
                    if status != 200 or EXPECTED not in answer:
                        errors += 1
                        if errors == 1:
                            print(f"  first error: {status} {answer[:500]}", file=sys.stderr)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for connection, request in zip(connections, requests, strict=True):
                nursery.start_soon(worker, connection, request)
        elapsed = time.perf_counter() - start
    quantiles = statistics.quantiles(latencies, n=100)
    return len(latencies) / elapsed, quantiles[49], quantiles[98], errors


def _ms(values: Sequence[float]) -> str:
    quantiles = statistics.quantiles(values, n=100)
    return f"p50 {quantiles[49] * 1000:7.1f} ms, p99 {quantiles[98] * 1000:7.1f} ms"


async def main() -> None:
    sandbox = await probe_sandbox("auto")
    warm = await warm_container_calls(sandbox)
    fresh = await fresh_sandbox_calls(sandbox)
    print(f"per call, {CALLS} one at a time:")
    print(f"  warm container (ContainerProcess.run):  {_ms(warm)}")
    print(f"  fresh sandbox per run (run_python):     {_ms(fresh)}")
    print(f"  ratio (p50): {statistics.median(fresh) / statistics.median(warm):.1f}x")
    print(f"{CONCURRENCY} concurrent responses for {DURATION_S:g} s through the server:")
    for name, flags, containers in (
        ("containers, warm", CONTAINER_FLAGS, True),
        ("fresh sandbox per run (MCP)", STATELESS_FLAGS, False),
    ):
        rate, p50, p99, errors = await throughput(*flags, containers=containers)
        print(
            f"  {name:28} {rate:6.1f} responses/s, p50 {p50 * 1000:5.0f} ms, "
            f"p99 {p99 * 1000:5.0f} ms, errors {errors}"
        )


if __name__ == "__main__":
    sys.exit(trio.run(main))
