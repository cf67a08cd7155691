"""Webhook delivery under load: latency, completeness and the server's CPU per delivery.

    python bench/webhooks.py [memory] [sqlite] [ROUNDS]     (default: memory 2)

The server runs in its own process (scripted engine, zero token delay,
``--webhook-allow-host 127.0.0.1``) with ``--store memory://`` or a fresh
``sqlite:///`` file. Per round, two runs, in turn:

- **endpoint**: one webhook endpoint (``response.completed``) pointing at a receiver in
  this process (h11 on Trio, keep-alive, answers 200 ``ok``; it notes the arrival of
  each ``webhook-id`` and the body's ``data.id``); then 10,000 background responses
  (``{"input": "hello", "background": true}``) created by 32 keep-alive clients. Until
  every response's event has arrived (or none arrives for 30 s).
- **none**: the same 10,000 responses without any endpoint, until ``/health`` shows
  no job running or waiting.

Prints, per endpoint run: deliveries received (distinct responses), duplicates (a
``webhook-id`` received more than once), missing; latency p50/p99/max as arrival at
the receiver minus the return of the create request (the response's work included);
the server's ``trio_responses_webhook_delivery_latency_seconds`` p50/p99 from
``/metrics`` (from the response's end; interpolated within a bucket as Prometheus
does, and the bucket, since those above 10 s are wide; the 20 warm-up responses
each run starts with are in it, and nowhere else); the time from the first create
to the last delivery. Per run: the server's CPU
(utime+stime of ``/proc/PID/stat``) from before the first create to the end; then
(endpoint - none) / 10,000 as µs of server CPU per delivery, for each round.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial

import h11
import trio

from _harness import MODEL, Connection, Server, get_bytes, request_bytes, server_process

TOTAL = 10_000
CLIENTS = 32
QUIET_S = 30.0
"""Give up waiting for deliveries once none has arrived for this long."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
FLAGS = ("--webhook-allow-host", "127.0.0.1")
LATENCY_METRIC = "trio_responses_webhook_delivery_latency_seconds"


# -- the receiver --------------------------------------------------------------------------


@dataclass
class Receiver:
    """Arrivals by ``webhook-id`` and by the body's ``data.id`` (perf_counter times)."""

    by_webhook_id: dict[str, int] = field(default_factory=dict)
    arrivals: dict[str, float] = field(default_factory=dict)
    last: float = 0.0
    changed: trio.Event = field(default_factory=trio.Event)

    async def serve(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        async with stream:
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(1 << 16)
                    connection.receive_data(data)
                    if not data:
                        return
                    continue
                if isinstance(event, h11.Request):
                    headers = dict(event.headers)
                    body = bytearray()
                    while True:
                        part = connection.next_event()
                        if part is h11.NEED_DATA:
                            data = await stream.receive_some(1 << 16)
                            if not data:
                                return
                            connection.receive_data(data)
                        elif isinstance(part, h11.Data):
                            body += part.data
                        elif isinstance(part, h11.EndOfMessage):
                            break
                    self.note(headers[b"webhook-id"].decode(), bytes(body))
                    answer = [
                        h11.Response(status_code=200, headers=[("content-length", "2")]),
                        h11.Data(data=b"ok"),
                        h11.EndOfMessage(),
                    ]
                    await stream.send_all(b"".join(connection.send(e) or b"" for e in answer))
                    if connection.our_state is h11.MUST_CLOSE:
                        return
                    connection.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed):
                    return

    async def wait_for(self, count: int, quiet_s: float) -> None:
        """Until ``count`` responses' events have arrived, or none for ``quiet_s``."""
        while len(self.arrivals) < count:
            self.changed = trio.Event()
            with trio.move_on_after(quiet_s) as quiet:
                await self.changed.wait()
            if quiet.cancelled_caught:
                return

    def reset(self) -> None:
        self.by_webhook_id.clear()
        self.arrivals.clear()
        self.last = 0.0

    def note(self, webhook_id: str, body: bytes) -> None:
        now = time.perf_counter()
        self.by_webhook_id[webhook_id] = self.by_webhook_id.get(webhook_id, 0) + 1
        self.arrivals.setdefault(json.loads(body)["data"]["id"], now)
        self.last = now
        self.changed.set()


# -- the server's figures ------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def get(server: Server, path: str) -> bytes:
    connection = await Connection.open(server.host, server.port)
    async with connection.stream:
        status, body = await connection.request(get_bytes(path))
    assert status == 200, body
    return body


async def wait_idle(server: Server) -> None:
    """Poll ``/health`` until no job runs or waits."""
    with trio.fail_after(300):
        while True:
            jobs = json.loads(await get(server, "/health"))["jobs"]
            if jobs["running"] == jobs["active"] == jobs["queued"] == 0:
                return
            await trio.sleep(0.05)


def histogram_quantiles(
    metrics: str, name: str, qs: tuple[float, ...]
) -> tuple[list[tuple[float, float, float]], int]:
    """Quantiles of a Prometheus histogram, each as (interpolated value, linear
    within its bucket like ``histogram_quantile``; the bucket's bounds), and its
    count."""
    buckets = []
    for match in re.finditer(rf'^{name}_bucket\{{le="([^"]+)"\}} (\S+)$', metrics, re.M):
        buckets.append((float(match.group(1)), float(match.group(2))))
    total = buckets[-1][1] if buckets else 0.0
    result = []
    for q in qs:
        rank, lower, below = q * total, 0.0, 0.0
        value, bounds = float("nan"), (float("nan"), float("nan"))
        for upper, count in buckets:
            if count >= rank and total:
                if upper == float("inf"):
                    value = lower
                else:
                    inside = count - below
                    value = lower + (upper - lower) * ((rank - below) / inside if inside else 1)
                bounds = (lower, upper)
                break
            lower, below = upper, count
        result.append((value, *bounds))
    return result, int(total)


# -- one run -------------------------------------------------------------------------------


@dataclass
class Run:
    cpu_s: float
    elapsed_s: float
    returned: dict[str, float]
    receiver: Receiver | None = None
    metrics: str = ""
    retries: int = 0


async def create_all(server: Server, returned: dict[str, float]) -> int:
    """Create `TOTAL` background responses over `CLIENTS` connections; notes when each
    create returned; returns the 429 retries."""
    remaining = TOTAL
    retries = 0
    request = request_bytes({"model": MODEL, "input": "hello", "background": True})

    async def client() -> None:
        nonlocal remaining, retries
        connection = await Connection.open(server.host, server.port)
        try:
            while remaining > 0:
                remaining -= 1
                while True:
                    try:
                        status, reply = await connection.request(request)
                    except ConnectionError:  # hypercorn closes one after 1,000 requests
                        await connection.stream.aclose()
                        connection = await Connection.open(server.host, server.port)
                        continue
                    if status != 429:
                        break
                    retries += 1
                    await trio.sleep(0.05)
                assert status == 200, reply
                returned[json.loads(reply)["id"]] = time.perf_counter()
        finally:
            await connection.stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(CLIENTS):
            nursery.start_soon(client)
    return retries


async def one_run(store: str, *, endpoint: bool) -> Run:
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, host="127.0.0.1"), receiver.serve, 0
        )
        port = listeners[0].socket.getsockname()[1]
        async with server_process("--store", store, *FLAGS) as server:
            if endpoint:
                body: dict[str, object] = {
                    "name": "bench",
                    "url": f"http://127.0.0.1:{port}/hook",
                    "event_types": ["response.completed"],
                }
                connection = await Connection.open(server.host, server.port)
                async with connection.stream:
                    status, reply = await connection.request(
                        request_bytes(body, "/v1/webhook_endpoints")
                    )
                assert status == 200, reply
            # warm up (imports, encoding, the first delivery's client): not counted
            warm: dict[str, float] = {}
            connection = await Connection.open(server.host, server.port)
            async with connection.stream:
                for _ in range(20):
                    status, reply = await connection.request(
                        request_bytes({"model": MODEL, "input": "hello", "background": True})
                    )
                    warm[json.loads(reply)["id"]] = time.perf_counter()
            await wait_idle(server)
            if endpoint:
                await receiver.wait_for(len(warm), QUIET_S)
            receiver.reset()
            returned: dict[str, float] = {}
            cpu = cpu_seconds(server.pid)
            start = time.perf_counter()
            retries = await create_all(server, returned)
            await wait_idle(server)
            end = time.perf_counter()
            if endpoint:
                await receiver.wait_for(len(returned), QUIET_S)
                end = receiver.last
            cpu = cpu_seconds(server.pid) - cpu
            metrics = (await get(server, "/metrics")).decode() if endpoint else ""
        nursery.cancel_scope.cancel()
    return Run(cpu, end - start, returned, receiver if endpoint else None, metrics, retries)


# -- the report ----------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def _bucketed(quantile: tuple[float, float, float]) -> str:
    value, lower, upper = quantile
    return f"{_ms(value)} (bucket {lower:g}-{upper:g} s)"


def report(name: str, run: Run) -> None:
    receiver = run.receiver
    assert receiver is not None
    duplicates = sum(count - 1 for count in receiver.by_webhook_id.values() if count > 1)
    missing = [key for key in run.returned if key not in receiver.arrivals]
    latencies = sorted(
        receiver.arrivals[key] - run.returned[key]
        for key in run.returned
        if key in receiver.arrivals
    )
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    (p50, p99), count = histogram_quantiles(run.metrics, LATENCY_METRIC, (0.5, 0.99))
    delivered = re.search(
        r'^trio_responses_webhook_deliveries_total\{event_type="response.completed",'
        r'outcome="delivered"\} (\S+)$',
        run.metrics,
        re.M,
    )
    print(
        f"  {name}: received {len(receiver.arrivals):,} of {len(run.returned):,} "
        f"(webhook-ids {len(receiver.by_webhook_id):,}, duplicates {duplicates}, "
        f"missing {len(missing)}), 429 retries {run.retries}",
        flush=True,
    )
    print(
        f"    latency from the create's return: p50 {_ms(quantiles[49])}, "
        f"p99 {_ms(quantiles[98])}, max {_ms(latencies[-1] if latencies else 0.0)}; "
        f"server histogram (from the end) p50 {_bucketed(p50)}, p99 {_bucketed(p99)} "
        f"of {count:,} (deliveries_total delivered "
        f"{delivered.group(1) if delivered else '?'})",
        flush=True,
    )
    print(
        f"    first create to last delivery {run.elapsed_s:.2f} s "
        f"({len(run.returned) / run.elapsed_s:,.0f} deliveries/s); server CPU {run.cpu_s:.2f} s",
        flush=True,
    )


async def main(stores: list[str], rounds: int) -> None:
    print(
        f"{TOTAL:,} background responses, {CLIENTS} keep-alive clients, "
        f"one endpoint on a receiver in this process; {rounds} rounds",
        flush=True,
    )
    for kind in stores:
        print(f"--store {kind}", flush=True)
        per_delivery = []
        with tempfile.TemporaryDirectory() as directory:
            for number in range(rounds):
                urls = [
                    "memory://" if kind == "memory" else f"sqlite:///{directory}/{number}-{n}.db"
                    for n in range(2)
                ]
                with_endpoint = await one_run(urls[0], endpoint=True)
                report(f"round {number + 1}, endpoint", with_endpoint)
                without = await one_run(urls[1], endpoint=False)
                print(
                    f"  round {number + 1}, none: all done in {without.elapsed_s:.2f} s; "
                    f"server CPU {without.cpu_s:.2f} s",
                    flush=True,
                )
                cost = (with_endpoint.cpu_s - without.cpu_s) / TOTAL
                per_delivery.append(cost)
                print(
                    f"  round {number + 1}: server CPU per delivery {cost * 1e6:,.0f} µs",
                    flush=True,
                )
        print(
            f"  {kind}: server CPU per delivery "
            + " / ".join(f"{cost * 1e6:,.0f}" for cost in per_delivery)
            + " µs",
            flush=True,
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    chosen = [arg for arg in args if arg in ("memory", "sqlite")] or ["memory"]
    count = next((int(arg) for arg in args if arg.isdigit()), 2)
    trio.run(main, chosen, count)
