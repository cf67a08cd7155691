"""Child process of bench/cpu_per_token.py and bench/vllm_compare.py: N raw SSE streams.

    python bench/_sse_clients.py SPEC_PATH

SPEC_PATH holds ``{"host", "port", "pid", "requests": [raw HTTP request, ...],
"wait_ready": bool, "text_tokens": int or null}``. Each request is sent on its
own connection (``Connection: close``: a stream ends at EOF) and read to the
end. For every stream it notes the arrival time (``time.monotonic``) of each
``response.output_text.delta`` event and the response id. It also samples the
server's CPU (``/proc/PID/stat`` utime+stime, clock ticks) when every stream has
its first text delta and when the first stream has its last one: the steady
window, with every stream running and none starting or finishing. The last is
the ``text_tokens``-th (the spec's; without it, the window ends when the first
stream ends, which takes in the end of the streams that finished before it).

With ``wait_ready`` it prints ``ready`` once every stream has its first bytes,
then waits for a line on stdin before the clock starts (fan-out: the readers
attach to a queued response, then the parent lets it run).

At the end it prints one JSON object: ``streams`` (id, arrivals), ``window``
(start, end, cpu ticks at each, text deltas inside it) or null.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import trio

DELTA = b"event: response.output_text.delta\n"
_ID = re.compile(rb'"id":\s*"(resp_[^"]+)"')


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class Streams:
    def __init__(self, count: int, pid: int, text_tokens: int | None) -> None:
        self.pid = pid
        self.text_tokens = text_tokens
        self.without_delta = count
        self.without_bytes = count
        self.ready = trio.Event()
        self.window: dict[str, float] = {}
        self.ids: list[str | None] = [None] * count
        self.arrivals: list[list[float]] = [[] for _ in range(count)]

    def first_delta(self) -> None:
        self.without_delta -= 1
        if self.without_delta == 0 and "start" not in self.window:
            self.window.update(start=time.monotonic(), start_ticks=cpu_ticks(self.pid))

    def text_deltas(self, arrived: int) -> None:
        """A stream has ``arrived`` text deltas so far."""
        if self.text_tokens is not None and arrived >= self.text_tokens:
            self.ended()

    def ended(self) -> None:
        if "start" in self.window and "end" not in self.window:
            self.window.update(end=time.monotonic(), end_ticks=cpu_ticks(self.pid))


async def read(host: str, port: int, request: bytes, index: int, streams: Streams) -> None:
    stream = await trio.open_tcp_stream(host, port)
    arrivals = streams.arrivals[index]
    async with stream:
        await stream.send_all(request)
        tail = b""
        head = b""
        while chunk := await stream.receive_some(1 << 18):
            now = time.monotonic()
            if streams.without_bytes and not head:
                streams.without_bytes -= 1
                if streams.without_bytes == 0:
                    streams.ready.set()
            data = tail + chunk
            if streams.ids[index] is None:
                head += chunk
                match = _ID.search(head)
                if match is not None:
                    streams.ids[index] = match.group(1).decode()
            count = data.count(DELTA)
            if count:
                if not arrivals:
                    streams.first_delta()
                arrivals.extend([now] * count)
                streams.text_deltas(len(arrivals))
            tail = data[-(len(DELTA) - 1) :]
    streams.ended()


async def main(spec: dict[str, object]) -> None:
    host, port, pid = str(spec["host"]), int(spec["port"]), int(spec["pid"])  # type: ignore[call-overload]
    requests = [str(request).encode("latin-1") for request in spec["requests"]]  # type: ignore[attr-defined]
    text_tokens = spec.get("text_tokens")
    streams = Streams(len(requests), pid, None if text_tokens is None else int(text_tokens))  # type: ignore[call-overload]
    async with trio.open_nursery() as nursery:
        for index, request in enumerate(requests):
            nursery.start_soon(read, host, port, request, index, streams)
        if spec.get("wait_ready"):
            await streams.ready.wait()
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
    window = streams.window if "end" in streams.window else None
    if window is not None:
        window["deltas"] = sum(
            sum(1 for t in arrivals if window["start"] < t <= window["end"])
            for arrivals in streams.arrivals
        )
    result = {
        "streams": [
            {"id": id_, "arrivals": arrivals}
            for id_, arrivals in zip(streams.ids, streams.arrivals, strict=True)
        ],
        "window": window,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    with open(sys.argv[1]) as spec_file:
        spec = json.load(spec_file)
    os.unlink(sys.argv[1])
    trio.run(main, spec)
