"""Fan-out: one background response, many SSE readers over HTTP.

    python bench/fanout.py [N ...]       (default: 1 10 100 1000)

The server runs in this process (so it can note when each event is appended);
the readers run in a child process, so each side has a core. For each N: a
response of ``tokens:5000`` waits in the queue while N readers connect, then
runs at zero token delay. Prints deliveries/s (events x readers / time from the
first event's creation to the last arrival) and the p50/p99 lag between an
event's creation and its arrival at a reader.

"Creation" is when an in-process reader of the log sees the event: at most one
scheduler pass after the append. Arrival is when a frame's ``id:`` line arrives.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial

import trio

from trio_responses import Config, open_responses_service, serve_service

MODEL = "gpt-oss-scripted"
HERE = os.path.dirname(os.path.abspath(__file__))


async def creation_times(service: object, response_id: str, out: dict[int, float]) -> None:
    subscription = await service.subscribe(response_id)  # type: ignore[attr-defined]
    with subscription:
        sequence = -1
        while frames := await subscription.receive_frames():
            now = time.monotonic()
            for _ in frames:
                sequence += 1
                out[sequence] = now


async def run(count: int) -> tuple[float, float, float]:
    config = Config(port=0, max_active_jobs=1, log_level="warning")
    async with open_responses_service(config) as service, trio.open_nursery() as nursery:
        urls = await nursery.start(partial(serve_service, service))
        host, port = urls[0].removeprefix("http://").rsplit(":", 1)
        blocker = await service.create(
            {"model": MODEL, "input": "tokens:100000 delay:10", "background": True}
        )
        job = await service.create({"model": MODEL, "input": "tokens:5000", "background": True})
        created: dict[int, float] = {}
        nursery.start_soon(creation_times, service, job.id, created)
        readers = await trio.lowlevel.open_process(
            [
                sys.executable,
                os.path.join(HERE, "_fanout_readers.py"),
                host,
                port,
                job.id,
                str(count),
            ],
            stdout=subprocess.PIPE,
        )
        assert readers.stdout is not None
        output = b""
        while b"ready\n" not in output:
            output += await readers.stdout.receive_some()
        await service.cancel(blocker.id)  # the slot frees: the response runs now
        while chunk := await readers.stdout.receive_some():
            output += chunk
        await readers.wait()
        results = json.loads(output.split(b"ready\n", 1)[1])
        nursery.cancel_scope.cancel()
    events = len(created)
    lags: list[float] = []
    last_arrival = 0.0
    for runs in results:
        for arrival, first, last in runs:
            last_arrival = max(last_arrival, arrival)
            lags.extend(arrival - created[int(i)] for i in range(int(first), int(last) + 1))
    # Events 0-1 (created, queued) were replayed before the response ran.
    start = created[2]
    rate = events * count / (last_arrival - start)
    quantiles = statistics.quantiles(lags, n=100)
    return rate, quantiles[49], quantiles[98]


async def main(counts: list[int]) -> None:
    for count in counts:
        rate, p50, p99 = await run(count)
        print(
            f"readers={count:<5} deliveries/s={rate:,.0f}  "
            f"lag p50={p50 * 1000:.1f} ms  p99={p99 * 1000:.1f} ms"
        )


if __name__ == "__main__":
    trio.run(main, [int(arg) for arg in sys.argv[1:]] or [1, 10, 100, 1000])
