"""Server CPU per request: what a request costs before and after its tokens.

    python bench/request_cost.py [CONCURRENCY ...]     (default: 8 64)

A server (``trio-responses serve``, scripted engine, memory store) runs in its own
process. For each concurrency N:

* ``stream``: rounds of N concurrent ``POST /v1/responses`` streams of ``tokens:1``
  (three events of text in all), each on its own connection, as
  `cpu_per_token.py` and `vllm_compare.py` send them (the SSE clients,
  `_sse_clients.py`, run in another process);
* ``health``: N keep-alive connections sending ``GET /health`` back to back: what
  the HTTP stack (hypercorn, Quart, our hooks) costs a request that does nothing.

The figure is the server's utime+stime (``/proc/PID/stat``) over the requests.
``PY_SPY_RAW=PATH`` records the stream rounds with py-spy (GIL samples; read
them with `profile_summary.py`).
"""

from __future__ import annotations

import os
import signal
import sys

import trio
from cpu_per_token import cpu_seconds, load, read_all, run_clients

from _harness import MODEL, server_process, start_profiler

STREAM_REQUESTS = 768
HEALTH_REQUESTS = 3200
HEALTH = b"GET /health HTTP/1.1\r\nHost: bench\r\n\r\n"


async def streamed(host: str, port: int, pid: int, concurrency: int) -> float:
    """CPU seconds per streamed request, over rounds of ``concurrency`` at once."""
    request = b"POST /v1/responses HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    body = b'{"model": "%s", "input": "tokens:1", "stream": true}' % MODEL.encode()
    request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    await read_all(await run_clients(host, port, pid, [request] * concurrency))  # warm-up
    rounds = max(1, STREAM_REQUESTS // concurrency)
    spy = await start_profiler(pid)
    try:
        before = cpu_seconds(pid)
        for _ in range(rounds):
            await read_all(await run_clients(host, port, pid, [request] * concurrency))
        return (cpu_seconds(pid) - before) / (rounds * concurrency)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            await spy.wait()


async def health(host: str, port: int, pid: int, concurrency: int) -> float:
    """CPU seconds per ``GET /health`` on ``concurrency`` keep-alive connections."""
    each = max(1, HEALTH_REQUESTS // concurrency)

    async def worker() -> None:
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            for _ in range(each):
                await stream.send_all(HEALTH)
                reply = b""
                while True:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        raise ConnectionError("the server closed a keep-alive connection")
                    reply += chunk
                    head, found, body = reply.partition(b"\r\n\r\n")
                    if found and len(body) >= _content_length(head):
                        break

    before = cpu_seconds(pid)
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return (cpu_seconds(pid) - before) / (each * concurrency)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise ValueError("a reply without Content-Length")


async def main(levels: list[int]) -> None:
    print(f"{os.cpu_count()} cores, {load()}; server CPU per request")
    async with server_process() as server:
        for concurrency in levels:
            stream_s = await streamed(server.host, server.port, server.pid, concurrency)
            health_s = await health(server.host, server.port, server.pid, concurrency)
            print(
                f"concurrency={concurrency:<4} stream (tokens:1, own connection) "
                f"{stream_s * 1e6:6.0f} µs   GET /health (keep-alive) {health_s * 1e6:5.0f} µs"
                f"   ({load()})"
            )


if __name__ == "__main__":
    trio.run(main, [int(arg) for arg in sys.argv[1:]] or [8, 64])
