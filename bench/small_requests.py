"""Requests per second and latency of small non-streaming requests.

    python bench/small_requests.py [CONCURRENCY ...]     (default: 1 8 64)

A server (scripted engine, zero token delay) runs in its own process. Each of
C workers keeps one HTTP/1.1 connection and sends ``{"input": "hi"}`` requests
back to back for a fixed time. Prints requests/s, p50 and p99 latency per C.
"""

from __future__ import annotations

import statistics
import sys
import time

import trio

from _harness import MODEL, Connection, request_bytes, running_server

DURATION_S = 5.0


async def send_for_a_while(
    host: str, port: int, concurrency: int, duration_s: float = DURATION_S
) -> tuple[int, float, list[float]]:
    """``concurrency`` clients sending small requests back to back for ``duration_s``:
    the requests answered, the seconds taken, each request's latency."""
    latencies: list[float] = []
    request = request_bytes({"model": MODEL, "input": "hi"})
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        while time.perf_counter() < deadline:
            connection = await Connection.open(host, port)
            async with connection.stream:
                while time.perf_counter() < deadline:
                    start = time.perf_counter()
                    try:
                        status, _ = await connection.request(request)
                    except ConnectionError:
                        break  # keep-alive limit reached: reconnect, like any client
                    assert status == 200, status
                    latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return len(latencies), time.perf_counter() - start, latencies


async def run_level(host: str, port: int, concurrency: int) -> tuple[float, float, float]:
    count, elapsed, latencies = await send_for_a_while(host, port, concurrency)
    quantiles = statistics.quantiles(latencies, n=100)
    return count / elapsed, quantiles[49], quantiles[98]


async def main(levels: list[int]) -> None:
    async with running_server() as (host, port):
        await run_level(host, port, 2)  # warm up
        for concurrency in levels:
            rate, p50, p99 = await run_level(host, port, concurrency)
            print(
                f"concurrency={concurrency:<3} requests/s={rate:,.0f}  "
                f"p50={p50 * 1000:.1f} ms  p99={p99 * 1000:.1f} ms"
            )


if __name__ == "__main__":
    trio.run(main, [int(arg) for arg in sys.argv[1:]] or [1, 8, 64])
