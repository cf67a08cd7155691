"""Events per second of one long streamed response, end to end.

    python bench/stream_events.py [N ...]        (default: 2000 20000)

A server (scripted engine, zero token delay) runs in its own process; a raw
HTTP/1.1 client streams ``tokens:N`` and counts SSE events until ``[DONE]``.
Prints one line per N: events, seconds, events/s. Then the ratio of the last
rate to the first (no per-token cost that grows with length: close to 1).
"""

from __future__ import annotations

import sys

import trio

from _harness import MODEL, read_to_done, request_bytes, running_server


async def stream_once(host: str, port: int, tokens: int) -> tuple[int, float]:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        request = request_bytes({"model": MODEL, "input": f"tokens:{tokens}", "stream": True})
        data, elapsed = await read_to_done(stream, request)
    events = data.count(b"\nevent: ") + 1  # the first follows the headers
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
