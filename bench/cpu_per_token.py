"""Server CPU per output token, and added latency per event, at one token per wake-up.

    python bench/cpu_per_token.py [scripted N ...] [stepped N ...] [fanout N ...]
        (default: scripted 8 64 256, stepped 8 64 256, fanout 20 1000)

    FLUSH_MS=X: run the server with ``--stream-flush-ms X`` (default: the server's).
    DURATION_S=S: make each stream last about S seconds (default 4; longer runs
    make a profile mostly the steady state).

The server (``bench/_paced_server.py``: the real server, scripted engine) runs in
its own process and the SSE clients (``bench/_sse_clients.py``) in another, so
neither's CPU counts against the other. The engine is paced: it sleeps between
tokens (``token_delay_s``), so every token reaches the server on its own wake-up,
as with a real engine, where a decode step yields one token per running request.

``scripted N``: N concurrent ``POST /v1/responses`` streams of ``tokens:T``. The
pace is N / RATE seconds per token (RATE = 2,000 tokens/s offered in all, so the
box is not saturated at any N) and T makes each stream last about 4 s.

``stepped N``: the same, with the engine paced like a GPU's decode steps
(``--token-steps``): one clock tick per pace gives every running stream its next
token at once, so all N tokens of a step reach the server in one wake-up.

``fanout N``: one background response of ``tokens:1000`` at 5 ms a token, queued
behind a blocker while N readers attach (``GET /v1/responses/{id}?stream=true``),
then let run.

Figures:

* CPU/token (run): the server's utime+stime (``/proc/PID/stat``) from before the
  first request to after the last stream ends, over the output tokens generated
  (the engine's count); request setup included.
* CPU/token (steady): the same over the window in which every stream is running
  (each has its first text delta, none has its last yet), over the text deltas
  that arrived inside it; request setup and teardown excluded. (Before commit
  838d0e8 the window ended when the first stream ended: by then the server had
  finished most of the others too, ~0.1 s of CPU at 256 streams, so figures
  from before then count some teardown.)
* added latency: for each ``response.output_text.delta``, its arrival at the
  client minus the moment the engine handed its token to the server (the server
  process notes ``time.monotonic()`` per token; the clock is system-wide). The
  k-th text delta of a stream is the k-th of the final answer's T tokens, the
  tokens just before ``<|return|>``. Fan-out: per reader, the same ("lag").
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import trio

from _harness import MODEL, _free_port, _wait_healthy, get_bytes, request_bytes, stop_process

HERE = os.path.dirname(os.path.abspath(__file__))
RATE = 2000.0
DURATION_S = float(os.environ.get("DURATION_S", "4"))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}"


def closing(request: bytes) -> bytes:
    """``request`` with ``Connection: close`` (the stream ends at EOF)."""
    return request.replace(b"\r\n", b"\r\nConnection: close\r\n", 1)


@dataclass
class Figures:
    label: str
    tokens: int
    cpu_run_s: float
    steady_us: float | None
    latencies: list[float]
    wall_s: float

    def line(self) -> str:
        per_token = self.cpu_run_s / self.tokens * 1e6
        steady = f"{self.steady_us:.0f} µs" if self.steady_us is not None else "n/a"
        if self.latencies:
            q = statistics.quantiles(self.latencies, n=100)
            latency = f"p50 {q[49] * 1e3:.2f} ms  p99 {q[98] * 1e3:.2f} ms"
        else:
            latency = "n/a"
        return (
            f"{self.label:<12} tokens={self.tokens:<7} cpu={self.cpu_run_s:.2f} s  "
            f"cpu/token run={per_token:.0f} µs steady={steady}  added latency {latency}  "
            f"wall={self.wall_s:.1f} s  ({load()})"
        )


class PacedServer:
    def __init__(
        self, process: trio.Process, pid: int, host: str, port: int, times_path: str
    ) -> None:
        self.process, self.pid, self.host, self.port = process, pid, host, port
        self.times_path = times_path

    async def stop(self) -> dict[str, list[float]]:
        if self.pid != self.process.pid:  # under py-spy: end the server, py-spy follows
            os.kill(self.pid, signal.SIGTERM)
            with trio.move_on_after(30):
                await self.process.wait()
        await stop_process(self.process)
        with open(self.times_path) as times:  # noqa: ASYNC230 (outside the measured window)
            result: dict[str, list[float]] = json.load(times)
        return result


async def start_server(**fields: object) -> PacedServer:
    if os.environ.get("FLUSH_MS"):
        fields["stream_flush_ms"] = float(os.environ["FLUSH_MS"])
    host, port = "127.0.0.1", _free_port()
    times_path = tempfile.mktemp(prefix="cpu-per-token-", suffix=".json")
    # PY_SPY_RAW=PATH: record the server with py-spy (collapsed stacks to PATH), only
    # samples holding the GIL: a socket write is off the CPU while the kernel wakes
    # the reader and hands it ours, and would otherwise count as ours.
    profile = os.environ.get("PY_SPY_RAW")
    spy = (
        []
        if not profile
        else [
            os.path.join(os.path.dirname(sys.executable), "py-spy"),
            "record",
            "--format",
            "raw",
            "--rate",
            "250",
            "--gil",
            "--output",
            f"{profile}.{len(os.listdir(os.path.dirname(profile)))}",
            "--",
        ]
    )
    process = await trio.lowlevel.open_process(
        [
            *spy,
            sys.executable,
            os.path.join(HERE, "_paced_server.py"),
            host,
            str(port),
            times_path,
            *(f"{name}={json.dumps(value)}" for name, value in fields.items()),
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    await _wait_healthy(host, port, process)
    pid = process.pid
    if spy:
        with open(f"/proc/{pid}/task/{pid}/children") as children:  # noqa: ASYNC230 (outside the measured window)
            pid = int(children.read().split()[0])
    return PacedServer(process, pid, host, port, times_path)


async def run_clients(
    host: str,
    port: int,
    pid: int,
    requests: list[bytes],
    *,
    wait_ready: bool = False,
    text_tokens: int | None = None,
) -> tuple[trio.Process, dict[str, object]] | trio.Process:
    spec = {
        "text_tokens": text_tokens,
        "host": host,
        "port": port,
        "pid": pid,
        "requests": [closing(request).decode("latin-1") for request in requests],
        "wait_ready": wait_ready,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec_file:
        json.dump(spec, spec_file)
    return await trio.lowlevel.open_process(
        [sys.executable, os.path.join(HERE, "_sse_clients.py"), spec_file.name],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE if wait_ready else None,
    )


async def read_all(process: trio.Process) -> bytes:
    assert process.stdout is not None
    output = b""
    while chunk := await process.stdout.receive_some():
        output += chunk
    await process.wait()
    if process.returncode:
        raise RuntimeError(f"the SSE clients exited with status {process.returncode}")
    return output


def added_latencies(
    result: dict[str, object], times: dict[str, list[float]], text_tokens: int
) -> list[float]:
    """Arrival of each text delta minus the emission of its token (see the docstring)."""
    lags: list[float] = []
    for stream in result["streams"]:  # type: ignore[attr-defined]
        emitted = times.get(stream["id"])
        arrivals = stream["arrivals"]
        if emitted is None or len(arrivals) != text_tokens:
            raise RuntimeError(
                f"stream {stream['id']}: {len(arrivals)} text deltas, expected {text_tokens}"
            )
        text = emitted[-1 - text_tokens : -1]  # the answer's tokens, before <|return|>
        lags.extend(arrival - made for arrival, made in zip(arrivals, text, strict=True))
    return lags


async def scripted(count: int, *, stepped: bool = False) -> Figures:
    delay = count / RATE
    text_tokens = max(50, round(DURATION_S / delay))
    server = await start_server(
        token_delay_s=delay, token_steps=stepped, max_active_jobs=max(64, count)
    )
    try:
        body = {"model": MODEL, "input": f"tokens:{text_tokens}", "stream": True}
        request = request_bytes(body)
        # Warm up: imports, encodings, the first request's caches.
        warm = await run_clients(
            server.host,
            server.port,
            server.pid,
            [request_bytes({"model": MODEL, "input": "tokens:20", "stream": True})],
        )
        await read_all(warm)  # type: ignore[arg-type]
        before, start = cpu_seconds(server.pid), time.monotonic()
        clients = await run_clients(
            server.host, server.port, server.pid, [request] * count, text_tokens=text_tokens
        )
        result = json.loads(await read_all(clients))  # type: ignore[arg-type]
        cpu, wall = cpu_seconds(server.pid) - before, time.monotonic() - start
    finally:
        times = await server.stop()
    ids = {stream["id"] for stream in result["streams"]}
    tokens = sum(len(times[id_]) for id_ in ids)
    window = result["window"]
    steady = None
    if window and window["deltas"]:
        steady = (window["end_ticks"] - window["start_ticks"]) / CLK_TCK / window["deltas"] * 1e6
    return Figures(
        f"{'stepped' if stepped else 'scripted'} {count}",
        tokens,
        cpu,
        steady,
        added_latencies(result, times, text_tokens),
        wall,
    )


async def fanout(count: int, text_tokens: int = 1000, delay: float = 0.005) -> Figures:
    server = await start_server(max_active_jobs=1, max_retained_streams=16)
    try:
        from _harness import Connection

        connection = await Connection.open(server.host, server.port)
        _, blocker = await connection.request(
            request_bytes({"model": MODEL, "input": "tokens:100000 delay:10", "background": True})
        )
        _, job = await connection.request(
            request_bytes(
                {
                    "model": MODEL,
                    "input": f"tokens:{text_tokens} delay:{delay * 1000:g}",
                    "background": True,
                    "stream": False,
                }
            )
        )
        job_id, blocker_id = json.loads(job)["id"], json.loads(blocker)["id"]
        readers = await run_clients(
            server.host,
            server.port,
            server.pid,
            [get_bytes(f"/v1/responses/{job_id}?stream=true")] * count,
            wait_ready=True,
        )
        assert isinstance(readers, trio.Process) and readers.stdout is not None
        output = b""
        while b"ready\n" not in output:
            output += await readers.stdout.receive_some()
        before, start = cpu_seconds(server.pid), time.monotonic()
        await connection.stream.aclose()  # idle past hypercorn's keep-alive by now
        connection = await Connection.open(server.host, server.port)
        cancel = get_bytes(f"/v1/responses/{blocker_id}/cancel").replace(b"GET", b"POST", 1)
        await connection.request(cancel)
        assert readers.stdin is not None
        await readers.stdin.send_all(b"go\n")
        output += await read_all(readers)
        cpu, wall = cpu_seconds(server.pid) - before, time.monotonic() - start
        await connection.stream.aclose()
    finally:
        times = await server.stop()
    result = json.loads(output.split(b"ready\n", 1)[1])
    tokens = len(times[job_id])
    return Figures(
        f"fanout {count}", tokens, cpu, None, added_latencies(result, times, text_tokens), wall
    )


def parse(argv: list[str]) -> list[tuple[str, int]]:
    plan: list[tuple[str, int]] = []
    mode = "scripted"
    for arg in argv:
        if arg in ("scripted", "stepped", "fanout"):
            mode = arg
        else:
            plan.append((mode, int(arg)))
    return plan or [
        ("scripted", 8),
        ("scripted", 64),
        ("scripted", 256),
        ("stepped", 8),
        ("stepped", 64),
        ("stepped", 256),
        ("fanout", 20),
        ("fanout", 1000),
    ]


async def main(argv: list[str]) -> None:
    print(f"{os.cpu_count()} cores, {load()}, {RATE:,.0f} tokens/s offered (scripted)")
    for mode, count in parse(argv):
        if mode == "fanout":
            figures = await fanout(count)
        else:
            figures = await scripted(count, stepped=mode == "stepped")
        print(figures.line(), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
