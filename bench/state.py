"""The state backends under load: memory://, sqlite:///PATH and Redis.

    python bench/state.py [memory] [sqlite] [redis]       (default: all three)

Each server runs in its own process (scripted engine, zero token delay) with
``--store`` naming the backend; the SQLite files and a throwaway ``redis-server``
(unix socket, nothing persisted) live in a temporary directory, removed after.
One figure a line, per backend:

1. stream: events/s of one ``tokens:20000`` response created with ``background``
   and ``stream`` (the path that writes the event log to the backend), read raw
   to ``[DONE]``, best of 3; then the ratio to memory (targets: sqlite >= 0.9x,
   redis >= 0.5x). One server per backend (and always one on memory, the
   baseline); the runs alternate between them so that a busy box weighs on all.
2. resume: time to the first replayed event of ``GET ?stream=true&starting_after=
   10000`` on that finished log, median and max of 20 (target < 50 ms).
3. replica lag (redis only): two servers on one Redis; A (one job slot, held by a
   blocker) queues a ``tokens:2000 delay:2`` response; readers on A and on B
   catch up with its queued events, the blocker is cancelled, and per sequence
   number arrival on B - arrival on A gives p50/p99/max (target p99 < 50 ms).
4. memory: 10,000 short background responses (8 keep-alive connections) under
   ``--max-stored-responses 1000 --max-retained-streams 200``: the server's RSS
   at the start and after 1,000, 5,000 and 10,000 (flat once the limits are
   reached), the ``/health`` jobs figures, the SQLite files' size or Redis
   ``used_memory`` and key count, and whether the first response is still
   stored. The backends run this side by side (their throughput is shown, not
   compared), which keeps the whole script within ~5 minutes on two cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from _harness import (
    MODEL,
    Connection,
    Server,
    get_bytes,
    read_to_done,
    request_bytes,
    server_process,
    stop_process,
)

BACKENDS = ("memory", "sqlite", "redis")
STREAM_TOKENS = 20_000
STREAM_RUNS = 3
RESUME_AFTER = 10_000
RESUME_TRIES = 20
LAG_INPUT = "tokens:2000 delay:2"
MEMORY_TOTAL = 10_000
MEMORY_CHECKPOINTS = (1_000, 5_000, MEMORY_TOTAL)
MEMORY_CONNECTIONS = 8
MEMORY_LIMITS = ("--max-stored-responses", "1000", "--max-retained-streams", "200")
TERMINAL = {"completed", "failed", "cancelled", "incomplete"}
MIB = 1 << 20


def say(backend: str, figure: str) -> None:
    print(f"{backend:<7} {figure}", flush=True)


# -- backends ------------------------------------------------------------------------------


class Redis:
    """A throwaway ``redis-server`` on a unix socket; ``redis-cli`` for commands."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def url(self, db: int = 0) -> str:
        return f"unix://{self.socket}?db={db}"

    async def cli(self, *args: str) -> str:
        result = await trio.run_process(
            ["redis-cli", "-s", str(self.socket), *args], capture_stdout=True, capture_stderr=True
        )
        return bytes(result.stdout).decode().strip()

    async def info(self, field_name: str) -> int:
        match = re.search(rf"(?m)^{field_name}:(\d+)", await self.cli("INFO", "memory"))
        assert match, field_name
        return int(match.group(1))


@asynccontextmanager
async def running_redis(directory: Path) -> AsyncIterator[Redis]:
    executable = shutil.which("redis-server")
    if executable is None:
        raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
    redis = Redis(directory / "redis.sock")
    process = await trio.lowlevel.open_process(
        [
            executable,
            *("--port", "0", "--unixsocket", str(redis.socket), "--unixsocketperm", "700"),
            *("--save", "", "--appendonly", "no", "--dir", str(directory)),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(30):
            while not redis.socket.exists() or await _ping(redis) != "PONG":
                if process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with status {process.returncode}")
                await trio.sleep(0.02)
        yield redis
    finally:
        await stop_process(process)


async def _ping(redis: Redis) -> str:
    try:
        return await redis.cli("PING")
    except Exception:
        return ""


@dataclass
class Backend:
    """A ``--store`` backend: a fresh URL per phase, and the size of what it holds."""

    name: str
    directory: Path
    redis: Redis | None = None
    files: list[Path] = field(default_factory=list)

    async def fresh_url(self) -> str:
        if self.name == "memory":
            return "memory://"
        if self.name == "sqlite":
            path = self.directory / f"state-{len(self.files)}.db"
            self.files.append(path)
            return f"sqlite:///{path}"
        assert self.redis is not None
        await self.redis.cli("FLUSHALL")
        return self.redis.url()

    async def size(self) -> str:
        """What the backend holds now, as words (empty for memory)."""
        if self.name == "sqlite":
            return f"DB files {_files_size(self.files[-1]) / MIB:.1f} MiB"
        if self.name == "redis":
            assert self.redis is not None
            used = await self.redis.info("used_memory")
            keys = await self.redis.cli("DBSIZE")
            return f"redis used_memory {used / MIB:.1f} MiB, {keys} keys"
        return ""


def _files_size(path: Path) -> int:
    """Bytes of an SQLite database with its WAL and shared-memory files."""
    names = [f"{path}{suffix}" for suffix in ("", "-wal", "-shm")]
    return sum(os.path.getsize(name) for name in names if os.path.exists(name))


# -- HTTP helpers --------------------------------------------------------------------------


async def get_json(server: Server, path: str) -> tuple[int, dict[str, object]]:
    connection = await Connection.open(server.host, server.port)
    async with connection.stream:
        status, body = await connection.request(get_bytes(path))
    return status, json.loads(body)


async def post_json(server: Server, body: dict[str, object], path: str = "/v1/responses") -> str:
    connection = await Connection.open(server.host, server.port)
    async with connection.stream:
        status, reply = await connection.request(request_bytes(body, path))
    assert status == 200, reply
    response_id: str = json.loads(reply)["id"]
    return response_id


async def wait_finished(server: Server, response_id: str) -> str:
    with trio.fail_after(120):
        while True:
            status, body = await get_json(server, f"/v1/responses/{response_id}")
            assert status == 200, body
            state = str(body["status"])
            if state in TERMINAL:
                return state
            await trio.sleep(0.02)


async def wait_idle(server: Server) -> dict[str, int]:
    """Poll ``/health`` until no job runs or waits; return its ``jobs`` figures."""
    with trio.fail_after(300):
        while True:
            _, health = await get_json(server, "/health")
            jobs: dict[str, int] = health["jobs"]  # type: ignore[assignment]
            if jobs["running"] == jobs["active"] == jobs["queued"] == 0:
                return jobs
            await trio.sleep(0.05)


# -- 1. stream -----------------------------------------------------------------------------


async def stream_create(server: Server, tokens: int) -> tuple[int, float, str]:
    """Create a background+stream response of ``tokens:N``; read it to ``[DONE]``."""
    stream = await trio.open_tcp_stream(server.host, server.port)
    async with stream:
        body = {"model": MODEL, "input": f"tokens:{tokens}", "background": True, "stream": True}
        data, elapsed = await read_to_done(stream, request_bytes(body))
    match = re.search(rb'"id":"(resp_[0-9a-f]+)"', data)
    assert match, data[:500]
    events = data.count(b"\nevent: ") + 1  # the first follows the headers
    return events, elapsed, match.group(1).decode()


async def stream_phase(servers: dict[str, Server]) -> dict[str, str]:
    """Best events/s of `STREAM_RUNS` per backend, runs interleaved so that a busy box
    weighs on every backend alike; returns the last response's id per backend."""
    for server in servers.values():
        await stream_create(server, 100)  # warm up
    rates: dict[str, list[float]] = {name: [] for name in servers}
    last: dict[str, str] = {}
    events = 0
    for _ in range(STREAM_RUNS):
        for name, server in servers.items():
            events, elapsed, last[name] = await stream_create(server, STREAM_TOKENS)
            rates[name].append(events / elapsed)
    baseline = max(rates["memory"])
    for name, runs in rates.items():
        listed = ", ".join(f"{rate / 1000:.0f}k" for rate in runs)
        say(
            name,
            f"stream: tokens:{STREAM_TOKENS} ({events:,} events) with background+stream, "
            f"best of {STREAM_RUNS} {max(runs):,.0f} events/s (runs {listed})",
        )
        if name != "memory":
            target = 0.9 if name == "sqlite" else 0.5
            ratio = max(runs) / baseline
            verdict = "ok" if ratio >= target else "MISSED"
            say(name, f"stream: {ratio:.2f}x memory (target >= {target}x: {verdict})")
    return last


# -- 2. resume -----------------------------------------------------------------------------


async def first_event_after(server: Server, response_id: str, after: int) -> float:
    stream = await trio.open_tcp_stream(server.host, server.port)
    async with stream:
        request = get_bytes(f"/v1/responses/{response_id}?stream=true&starting_after={after}")
        marker = f"\nid: {after + 1}\n".encode()
        received = b""
        start = time.perf_counter()
        await stream.send_all(request)
        while marker not in received:
            chunk = await stream.receive_some(1 << 16)
            if not chunk:
                raise ConnectionError(f"stream closed before the first event: {received[:300]!r}")
            received += chunk
        return time.perf_counter() - start


async def resume_phase(server: Server, backend: str, response_id: str) -> None:
    state = await wait_finished(server, response_id)
    assert state == "completed", state
    times = [
        await first_event_after(server, response_id, RESUME_AFTER) for _ in range(RESUME_TRIES)
    ]
    median, worst = statistics.median(times) * 1000, max(times) * 1000
    verdict = "ok" if worst < 50 else "MISSED"
    say(
        backend,
        f"resume: starting_after={RESUME_AFTER} of a finished {STREAM_TOKENS}-token log: "
        f"first event median {median:.2f} ms, max {worst:.2f} ms of {RESUME_TRIES} "
        f"(target < 50 ms: {verdict})",
    )


# -- 3. replica lag ------------------------------------------------------------------------


async def read_arrivals(
    server: Server, response_id: str, arrivals: dict[int, float], queued: trio.Event
) -> None:
    """``GET ?stream=true``; note when each ``id:`` arrives; set ``queued`` at ``id: 1``."""
    stream = await trio.open_tcp_stream(server.host, server.port)
    async with stream:
        await stream.send_all(get_bytes(f"/v1/responses/{response_id}?stream=true"))
        pending = bytearray()
        while b"\r\n\r\n" not in pending:
            pending += await stream.receive_some(1 << 16)
        head, _, rest = bytes(pending).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        pending = bytearray(rest)
        body = bytearray()
        now = time.perf_counter()
        ended = False
        while True:
            # De-chunk what has arrived, then take the complete SSE frames.
            while not ended and (line_end := pending.find(b"\r\n")) >= 0:
                size = int(bytes(pending[:line_end]).split(b";")[0], 16)
                if len(pending) < line_end + 2 + size + 2:
                    break
                body += pending[line_end + 2 : line_end + 2 + size]
                del pending[: line_end + 2 + size + 2]
                ended = size == 0
            while (frame_end := body.find(b"\n\n")) >= 0:
                frame = bytes(body[:frame_end])
                del body[: frame_end + 2]
                if match := re.search(rb"(?m)^id: (\d+)$", frame):
                    sequence = int(match.group(1))
                    arrivals.setdefault(sequence, now)
                    if sequence == 1:  # response.queued: caught up with the queued job
                        queued.set()
            if ended:
                assert body.strip() == b"", body[:300]
                return
            chunk = await stream.receive_some(1 << 16)
            now = time.perf_counter()
            if not chunk:
                raise ConnectionError("stream closed before its end")
            pending += chunk


async def replica_lag_phase(backend: Backend) -> None:
    url = await backend.fresh_url()
    async with (
        server_process("--store", url, "--max-active-jobs", "1") as a,
        server_process("--store", url) as b,
    ):
        # A blocker holds A's only slot while both readers connect and catch up.
        blocker = await post_json(
            a, {"model": MODEL, "input": "tokens:100000 delay:10", "background": True}
        )
        job = await post_json(a, {"model": MODEL, "input": LAG_INPUT, "background": True})
        on_a: dict[int, float] = {}
        on_b: dict[int, float] = {}
        async with trio.open_nursery() as nursery:
            ready_a, ready_b = trio.Event(), trio.Event()
            nursery.start_soon(read_arrivals, a, job, on_a, ready_a)
            nursery.start_soon(read_arrivals, b, job, on_b, ready_b)
            with trio.fail_after(30):
                await ready_a.wait()
                await ready_b.wait()
            before = max(max(on_a), max(on_b))
            await post_json(a, {}, f"/v1/responses/{blocker}/cancel")
        state = await wait_finished(a, job)
    assert state == "completed", state
    missing = set(on_a) ^ set(on_b)
    assert not missing, f"sequence numbers seen on one replica only: {sorted(missing)[:10]}"
    lags = [(on_b[seq] - on_a[seq]) * 1000 for seq in sorted(on_a) if seq > before]
    quantiles = statistics.quantiles(lags, n=100)
    verdict = "ok" if quantiles[98] < 50 else "MISSED"
    say(
        backend.name,
        f"replica lag: {LAG_INPUT!r} on A, read on A and B, {len(lags):,} events: "
        f"B - A p50 {quantiles[49]:.2f} ms, p99 {quantiles[98]:.2f} ms, max {max(lags):.2f} ms "
        f"(min {min(lags):.2f} ms; target p99 < 50 ms: {verdict})",
    )


# -- 4. memory -----------------------------------------------------------------------------


async def create_many(server: Server, count: int, first: list[str]) -> int:
    """Create ``count`` short background responses over `MEMORY_CONNECTIONS`; 429 retries."""
    remaining = count
    retries = 0

    async def worker() -> None:
        nonlocal remaining, retries
        request = request_bytes({"model": MODEL, "input": "hi", "background": True})
        connection = await Connection.open(server.host, server.port)
        try:
            while remaining > 0:
                remaining -= 1
                while True:
                    try:
                        status, reply = await connection.request(request)
                    except ConnectionError:
                        # hypercorn closes a keep-alive connection after 1,000 requests.
                        await connection.stream.aclose()
                        connection = await Connection.open(server.host, server.port)
                        continue
                    if status != 429:
                        break
                    retries += 1
                    await trio.sleep(0.05)
                assert status == 200, reply
                if not first:
                    first.append(json.loads(reply)["id"])
        finally:
            await connection.stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(MEMORY_CONNECTIONS):
            nursery.start_soon(worker)
    return retries


async def memory_phase(backend: Backend, alongside: int, lines: list[str]) -> None:
    """Appends its figures to ``lines``; ``alongside`` backends run this at once."""
    url = await backend.fresh_url()
    name = backend.name
    together = "alone" if alongside == 1 else f"{alongside} backends at once"

    def say(backend: str, figure: str) -> None:  # collected, printed when all are done
        lines.append(f"{backend:<7} {figure}")

    async with server_process("--store", url, *MEMORY_LIMITS) as server:
        first: list[str] = []
        await create_many(server, 20, first)  # warm up: imports, encoding, connections
        await wait_idle(server)
        rss = [server.rss_bytes()]
        done, retries, sizes, rates = 20, 0, [], []
        start = time.perf_counter()
        for checkpoint in MEMORY_CHECKPOINTS:
            began = time.perf_counter()
            retries += await create_many(server, checkpoint - done, [])
            jobs = await wait_idle(server)
            rates.append((checkpoint - done) / (time.perf_counter() - began))
            done = checkpoint
            rss.append(server.rss_bytes())
            sizes.append(await backend.size())
        elapsed = time.perf_counter() - start
        status, _ = await get_json(server, f"/v1/responses/{first[0]}")
    points = ", ".join(f"{count:,}" for count in MEMORY_CHECKPOINTS)
    say(
        name,
        f"memory: {MEMORY_TOTAL:,} short background responses ({MEMORY_CONNECTIONS} "
        f"connections, {' '.join(MEMORY_LIMITS)}; {together}) in {elapsed:.1f} s "
        f"({MEMORY_TOTAL / elapsed:,.0f}/s; per stretch up to {points}: "
        f"{', '.join(f'{rate:,.0f}/s' for rate in rates)}), {retries} retries after 429",
    )
    say(
        name,
        f"memory: RSS {rss[0] / MIB:.1f} MiB at start; after {points}: "
        + ", ".join(f"{value / MIB:.1f}" for value in rss[1:])
        + f" MiB ({(rss[-1] - rss[1]) / MIB:+.1f} MiB after the first {MEMORY_CHECKPOINTS[0]:,})",
    )
    say(name, "memory: /health jobs " + " ".join(f"{key}={value}" for key, value in jobs.items()))
    if sizes[-1]:
        say(name, f"memory: after {points}: " + "; ".join(sizes))
    say(name, f"memory: GET of the first response: HTTP {status}")


# -- main ----------------------------------------------------------------------------------


async def main(names: list[str]) -> None:
    unknown = set(names) - set(BACKENDS)
    if unknown:
        raise SystemExit(f"unknown backend(s): {', '.join(sorted(unknown))}; pick {BACKENDS}")
    names = [name for name in BACKENDS if name in (names or BACKENDS)]
    with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
        directory = Path(tmp)
        async with AsyncExitStack() as stack:
            redis = (
                await stack.enter_async_context(running_redis(directory))
                if ("redis" in names)
                else None
            )
            backends = {name: Backend(name, directory, redis) for name in names}
            # 1, 2: one server per backend (memory always: the stream baseline).
            async with AsyncExitStack() as servers_stack:
                servers: dict[str, Server] = {}
                for name in ("memory", *names):
                    if name not in servers:
                        url = await backends[name].fresh_url() if name in backends else "memory://"
                        servers[name] = await servers_stack.enter_async_context(
                            server_process("--store", url)
                        )
                last = await stream_phase(servers)
                for name in names:
                    await resume_phase(servers[name], name, last[name])
            # 3: replicas.
            if "redis" in backends:
                await replica_lag_phase(backends["redis"])
            # 4: memory bounded by the limits; the backends side by side (two cores).
            lines: dict[str, list[str]] = {name: [] for name in names}
            async with trio.open_nursery() as nursery:
                for name, backend in backends.items():
                    nursery.start_soon(memory_phase, backend, len(backends), lines[name])
            for name in names:
                print("\n".join(lines[name]), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
