"""Child process of bench/fanout.py: N raw SSE readers of one response.

    python bench/_fanout_readers.py HOST PORT RESPONSE_ID N

Prints "ready" once every reader has its stream open, then, at the end, one JSON
object: for each reader, the arrival times (time.monotonic) of each event id,
as a list of [time, first_id, last_id] runs.
"""

from __future__ import annotations

import json
import re
import sys
import time

import trio

_ID = re.compile(rb"\nid: (\d+)\n")
_END = b"data: [DONE]\n\n\r\n0\r\n\r\n"


def _last_id(data: bytes) -> int:
    """The last complete ``id:`` line in ``data`` (there is at least one)."""
    position = len(data)
    while True:
        position = data.rfind(b"\nid: ", 0, position)
        match = _ID.match(data, position)
        if match is not None:
            return int(match.group(1))


class Ready:
    """Counts readers with an open stream; `all` is set when every one has."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.all = trio.Event()

    def one(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.all.set()


async def read(host: str, port: int, path: str, ready: Ready, runs: list[list[float]]) -> None:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        tail = b""
        counted = False
        while True:
            chunk = await stream.receive_some(1 << 18)
            now = time.monotonic()
            if not chunk:
                raise ConnectionError("stream closed early")
            data = tail + chunk if tail else chunk
            first = _ID.search(data)
            if first is not None:
                runs.append([now, int(first.group(1)), _last_id(data)])
                if not counted:
                    counted = True
                    ready.one()
            if data.endswith(_END):
                return
            tail = data[-64:]


async def main(host: str, port: int, response_id: str, count: int) -> None:
    path = f"/v1/responses/{response_id}?stream=true"
    ready = Ready(count)
    results: list[list[list[float]]] = [[] for _ in range(count)]
    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(read, host, port, path, ready, results[index])
        await ready.all.wait()
        print("ready", flush=True)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
