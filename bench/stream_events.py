"""Events per second of one long streamed response, end to end.

    python bench/stream_events.py [N ...]        (default: 2000 20000)

A server (scripted engine, zero token delay) runs in its own process; a raw
HTTP/1.1 client streams ``tokens:N`` and counts SSE events until ``[DONE]``.
Prints one line per N: events, seconds, events/s. Then the ratio of the last
rate to the first (no per-token cost that grows with length: close to 1).
"""

from __future__ import annotations

import sys
import time

import trio

from _harness import MODEL, request_bytes, running_server


async def stream_once(host: str, port: int, tokens: int) -> tuple[int, float]:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        request = request_bytes({"model": MODEL, "input": f"tokens:{tokens}", "stream": True})
        chunks: list[bytes] = []
        tail = b""
        start = time.perf_counter()
        await stream.send_all(request)
        while not tail.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
            chunk = await stream.receive_some(1 << 18)
            if not chunk:
                raise ConnectionError("stream ended before [DONE]")
            chunks.append(chunk)
            tail = (tail + chunk)[-64:]
        elapsed = time.perf_counter() - start
    events = b"".join(chunks).count(b"\nevent: ") + 1  # the first follows the headers
    return events, elapsed


async def main(sizes: list[int]) -> None:
    async with running_server() as (host, port):
        await stream_once(host, port, 100)  # warm up: encoding, imports, connections
        rates = []
        for tokens in sizes:
            events, elapsed = await stream_once(host, port, tokens)
            rate = events / elapsed
            rates.append(rate)
            print(f"tokens:{tokens}  events={events}  seconds={elapsed:.3f}  events/s={rate:,.0f}")
        if len(rates) > 1:
            print(f"rate ratio (last/first) = {rates[-1] / rates[0]:.2f}")


if __name__ == "__main__":
    trio.run(main, [int(arg) for arg in sys.argv[1:]] or [2000, 20000])
