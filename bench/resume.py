"""Time to the first replayed event when resuming deep in a long event log.

    python bench/resume.py

A server (scripted engine, zero delay) runs in its own process. One background
response of ``tokens:20000`` (~20,000 events) finishes; then ``GET
/v1/responses/{id}?stream=true&starting_after=N`` for N at 10% and 90% of the
log, timed from sending the request to receiving the first event. Prints the
median and the worst of 20 tries per position.
"""

from __future__ import annotations

import json
import statistics
import time

import trio

from _harness import MODEL, Connection, request_bytes, running_server

TRIES = 20


async def first_event_after(host: str, port: int, response_id: str, after: int) -> float:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        request = (
            f"GET /v1/responses/{response_id}?stream=true&starting_after={after} HTTP/1.1\r\n"
            "Host: bench\r\n\r\n"
        ).encode()
        start = time.perf_counter()
        await stream.send_all(request)
        received = b""
        marker = f"\nid: {after + 1}\n".encode()
        while marker not in received:
            chunk = await stream.receive_some(1 << 16)
            if not chunk:
                raise ConnectionError("stream closed before the first event")
            received += chunk
        return time.perf_counter() - start


async def main() -> None:
    async with running_server() as (host, port):
        connection = await Connection.open(host, port)
        body = {"model": MODEL, "input": "tokens:20000", "background": True}
        status, reply = await connection.request(request_bytes(body))
        assert status == 200, reply
        response_id = json.loads(reply)["id"]
        # Wait for the end: stream the whole log once.
        total = await _count_events(host, port, response_id)
        print(f"log: {total} events")
        for fraction in (0.1, 0.9):
            after = int(total * fraction)
            times = [await first_event_after(host, port, response_id, after) for _ in range(TRIES)]
            print(
                f"starting_after={after} ({fraction:.0%}): first event in "
                f"median {statistics.median(times) * 1000:.2f} ms, "
                f"worst {max(times) * 1000:.2f} ms"
            )


async def _count_events(host: str, port: int, response_id: str) -> int:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(
            f"GET /v1/responses/{response_id}?stream=true HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
        )
        data = bytearray()
        while not data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
            chunk = await stream.receive_some(1 << 18)
            if not chunk:
                raise ConnectionError("stream closed early")
            data.extend(chunk)
    return data.count(b"\nid: ")


if __name__ == "__main__":
    trio.run(main)
