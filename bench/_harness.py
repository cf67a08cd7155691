"""Shared benchmark plumbing: a server in its own process, a raw HTTP/1.1 client.

The server runs as ``python -m trio_responses serve`` in a child process so the
client does not share its CPU; on a 2-core box each gets one core.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

MODEL = "gpt-oss-scripted"
_REPOSITORY = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Server:
    """A server child process: where it listens and its pid."""

    host: str
    port: int
    pid: int

    def rss_bytes(self) -> int:
        """Resident set size now (``VmRSS`` of ``/proc/PID/status``)."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for pid {self.pid}")


@asynccontextmanager
async def running_server(*flags: str) -> AsyncIterator[tuple[str, int]]:
    """Start ``trio-responses serve FLAGS`` on a free port; yields (host, port)."""
    async with server_process(*flags) as server:
        yield server.host, server.port


@asynccontextmanager
async def server_process(*flags: str) -> AsyncIterator[Server]:
    """Start ``trio-responses serve FLAGS`` on a free port; yields the `Server`.

    Several may run at once (each picks its own port).
    """
    host, port = "127.0.0.1", _free_port()
    process = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "trio_responses",
            "serve",
            "--host",
            host,
            "--port",
            str(port),
            "--log-level",
            "warning",
            *flags,
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        await _wait_healthy(host, port, process)
        yield Server(host, port, process.pid)
    finally:
        await stop_process(process)


async def read_to_done(stream: trio.SocketStream, request: bytes) -> tuple[bytes, float]:
    """Send ``request`` and read its SSE response to the final chunk after ``[DONE]``;
    returns the raw bytes and the seconds it took."""
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
    return b"".join(chunks), time.perf_counter() - start


async def stop_process(process: trio.Process) -> None:
    """SIGTERM, 10 s to exit, then SIGKILL."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    with trio.move_on_after(10):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _wait_healthy(host: str, port: int, process: trio.Process) -> None:
    with trio.fail_after(60):
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with status {process.returncode}")
            try:
                stream = await trio.open_tcp_stream(host, port)
            except OSError:
                await trio.sleep(0.1)
                continue
            async with stream:
                await stream.send_all(b"GET /health HTTP/1.1\r\nHost: bench\r\n\r\n")
                if (await stream.receive_some(1024)).startswith(b"HTTP/1.1 200"):
                    return


def get_bytes(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()


def request_bytes(body: dict[str, object], path: str = "/v1/responses") -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


class Connection:
    """A keep-alive HTTP/1.1 connection that reads Content-Length responses."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        return cls(await trio.open_tcp_stream(host, port))

    async def request(self, data: bytes) -> tuple[int, bytes]:
        await self.stream.send_all(data)
        while b"\r\n\r\n" not in self.buffer:
            await self._fill()
        head, _, rest = bytes(self.buffer).partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        match = re.search(rb"(?i)content-length: (\d+)", head)
        assert match, head
        length = int(match.group(1))
        self.buffer = bytearray(rest)
        while len(self.buffer) < length:
            await self._fill()
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return status, body

    async def _fill(self) -> None:
        chunk = await self.stream.receive_some(1 << 16)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buffer.extend(chunk)


async def start_profiler(pid: int) -> trio.Process | None:
    """py-spy attached to ``pid`` when ``PY_SPY_RAW`` names an output file (raw
    collapsed stacks, GIL samples only; ``PY_SPY_RATE`` samples a second, default 250;
    ``PY_SPY_BLOCKING=1`` pauses the process for each sample: whole stacks, but the
    pauses change what is measured); stop it with SIGINT, then wait for it."""
    output = os.environ.get("PY_SPY_RAW")
    if not output:
        return None
    py_spy = Path(sys.executable).parent / "py-spy"
    if not py_spy.exists():
        py_spy = _REPOSITORY / ".venv" / "bin" / "py-spy"
    rate = os.environ.get("PY_SPY_RATE", "250")
    argv = [str(py_spy), "record", "--pid", str(pid), "--format", "raw", "--rate", rate, "--gil"]
    if not os.environ.get("PY_SPY_BLOCKING"):  # whole stacks, but the process pauses
        argv.append("--nonblocking")
    return await trio.lowlevel.open_process([*argv, "--output", output])
