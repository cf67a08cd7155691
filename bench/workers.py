"""``serve --workers N`` on one port: small-request throughput and CPU per streamed token.

    python bench/workers.py [N ...]        (default: 1 2 4)

For each N, a ``redis-server`` of its own (unix socket, nothing persisted) and
``trio-responses serve --workers N --store unix://…`` (scripted engine) run in
child processes; the benchmark waits until every worker answers (a ``/health``
on fresh connections until N ``x-worker-id`` values are seen), then:

* ``small``: C connections (keep-alive; the kernel spreads them over the
  workers) send non-streaming ``{"input": "hi"}`` creates back to back for
  DURATION_S seconds (each one stored in Redis). Requests/s, p50, p99, and the
  CPU per request of the workers together and of redis-server.
* ``streams S``: S concurrent streamed creates of ``tokens:T``, each on its own
  connection, read by ``bench/_sse_clients.py`` in a process of its own; the
  engine paced at S / 2,000 s a token (``--token-delay``: 2,000 tokens/s offered
  in all, as in ``bench/cpu_per_token.py``) and T making each last about 4 s.
  CPU of the workers (and of the supervisor, which should be ~0) per text delta
  received, and the wall time.

CPU is utime+stime from ``/proc/PID/stat`` of each process, before and after.
The client of ``small`` runs in this process, and on a 2-core box takes most of
a core itself: there, more workers than cores only share the same CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from small_requests import send_for_a_while

from _harness import MODEL, Connection, request_bytes, server_process

HERE = Path(__file__).resolve().parent
DURATION_S = float(os.environ.get("DURATION_S", "5"))
CONCURRENCY = int(os.environ.get("CONCURRENCY", "64"))
STREAMS = (64, 256)
RATE = 2000.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (those of all its threads: trio starts
    processes from a worker thread)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listing:
            found += [int(child) for child in listing.read().split()]
    return found


def cpu_of(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


@asynccontextmanager
async def redis_server(directory: str) -> AsyncIterator[tuple[str, int]]:
    """A redis-server on a unix socket in ``directory``: yields (its URL, its pid)."""
    executable = shutil.which("redis-server")
    if executable is None:
        raise SystemExit("redis-server is not installed: apt-get install -y redis-server")
    sock = os.path.join(directory, "redis.sock")
    process = await trio.lowlevel.open_process(
        [executable, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(30):
            while True:  # nothing to wait on but the socket file
                if await trio.Path(sock).exists():
                    break
                await trio.sleep(0.02)
        yield f"unix://{sock}?db=0", process.pid
    finally:
        process.terminate()
        await process.wait()


async def wait_for_workers(host: str, port: int, count: int) -> None:
    """Until ``count`` different workers have answered ``/health``."""
    seen: set[bytes] = set()
    with trio.fail_after(120):
        while len(seen) < count:
            connection = await Connection.open(host, port)
            async with connection.stream:
                await connection.stream.send_all(
                    b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
                )
                reply = b""
                while chunk := await connection.stream.receive_some(1 << 16):
                    reply += chunk
            for line in reply.split(b"\r\n"):
                if line.lower().startswith(b"x-worker-id:"):
                    seen.add(line.split(b":", 1)[1].strip())
            if len(seen) < count:
                await trio.sleep(0.01)


async def small_requests(host: str, port: int, concurrency: int) -> tuple[int, float, list[float]]:
    return await send_for_a_while(host, port, concurrency, DURATION_S)


async def streams(host: str, port: int, count: int, tokens: int) -> tuple[int, float]:
    """``count`` streams of ``tokens:T`` read to their end: (text deltas, wall seconds)."""
    request = request_bytes({"model": MODEL, "input": f"tokens:{tokens}", "stream": True})
    request = request.replace(b"\r\n", b"\r\nConnection: close\r\n", 1)
    spec = {
        "text_tokens": tokens,
        "host": host,
        "port": port,
        "pid": os.getpid(),  # its CPU window is not used here
        "requests": [request.decode("latin-1")] * count,
        "wait_ready": False,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec_file:
        json.dump(spec, spec_file)
    start = time.perf_counter()
    result = await trio.run_process(
        [sys.executable, str(HERE / "_sse_clients.py"), spec_file.name], capture_stdout=True
    )
    elapsed = time.perf_counter() - start
    report = json.loads(result.stdout)
    deltas = sum(len(stream["arrivals"]) for stream in report["streams"])
    short = [s for s in report["streams"] if len(s["arrivals"]) != tokens]
    if short:
        print(
            f"  {len(short)} of {count} streams short of {tokens} text deltas: "
            f"{[(s['id'], len(s['arrivals'])) for s in short[:5]]}",
            flush=True,
        )
    return deltas, elapsed


async def measure(workers: int) -> list[str]:
    lines = []
    with tempfile.TemporaryDirectory() as directory:
        async with redis_server(directory) as (url, redis_pid):
            flags = ("--workers", str(workers), "--store", url, "--max-active-jobs", "1024")
            for label, extra in (("small", ()), *((f"streams {s}", (s,)) for s in STREAMS)):
                pace = extra[0] / RATE if extra else 0.0
                async with server_process(*flags, "--token-delay", f"{pace:g}") as server:
                    if workers == 1:  # the plain server: no supervisor
                        worker_pids = [server.pid]
                    else:
                        await wait_for_workers(server.host, server.port, workers)
                        worker_pids = children(server.pid)
                        assert len(worker_pids) == workers, worker_pids
                    if not extra:
                        await small_requests(server.host, server.port, 4)  # warm up
                        before = cpu_of(worker_pids), cpu_seconds(redis_pid)
                        supervisor_before = cpu_seconds(server.pid)
                        done, elapsed, latencies = await small_requests(
                            server.host, server.port, CONCURRENCY
                        )
                        workers_cpu = cpu_of(worker_pids) - before[0]
                        redis_cpu = cpu_seconds(redis_pid) - before[1]
                        supervisor_cpu = (
                            0.0 if workers == 1 else cpu_seconds(server.pid) - supervisor_before
                        )
                        q = statistics.quantiles(latencies, n=100)
                        lines.append(
                            f"workers={workers} small C={CONCURRENCY}: "
                            f"{done / elapsed:,.0f} requests/s  p50={q[49] * 1e3:.1f} ms  "
                            f"p99={q[98] * 1e3:.1f} ms  CPU/request: workers "
                            f"{workers_cpu / done * 1e6:.0f} µs, redis "
                            f"{redis_cpu / done * 1e6:.0f} µs, supervisor "
                            f"{supervisor_cpu:.2f} s in all"
                        )
                    else:
                        (count,) = extra
                        tokens = max(10, int(4.0 / pace))
                        await streams(server.host, server.port, 4, 10)  # warm up
                        before = cpu_of(worker_pids), cpu_seconds(redis_pid)
                        deltas, elapsed = await streams(server.host, server.port, count, tokens)
                        workers_cpu = cpu_of(worker_pids) - before[0]
                        redis_cpu = cpu_seconds(redis_pid) - before[1]
                        lines.append(
                            f"workers={workers} {label} x tokens:{tokens}: {deltas} text deltas "
                            f"in {elapsed:.1f} s  CPU/delta: workers "
                            f"{workers_cpu / deltas * 1e6:.0f} µs, redis "
                            f"{redis_cpu / deltas * 1e6:.0f} µs"
                        )
                    print(lines[-1], flush=True)
    return lines


async def main(counts: list[int]) -> None:
    print(f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}", flush=True)
    for workers in counts:
        await measure(workers)


if __name__ == "__main__":
    trio.run(main, [int(arg) for arg in sys.argv[1:]] or [1, 2, 4])
