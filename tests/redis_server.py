"""A real ``redis-server`` for the tests: started on a unix socket, stopped after.

Debian's ``redis-server`` (``.ci/run`` installs it when missing). Nothing is
persisted (``--save "" --appendonly no``).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RedisServer:
    socket: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        """The ``--store`` URL of database ``db`` 0."""
        return self.url_for(0)

    def url_for(self, db: int) -> str:
        return f"unix://{self.socket}?db={db}"

    def flush(self) -> None:
        """Empty every database (between tests)."""
        self.cli("FLUSHALL")

    def cli(self, *args: str) -> str:
        result = subprocess.run(
            ["redis-cli", "-s", str(self.socket), *args],
            capture_output=True,
            check=True,
            timeout=30,
        )
        return result.stdout.decode().strip()


@contextmanager
def running_redis(directory: Path) -> Iterator[RedisServer]:
    """Start ``redis-server`` with its socket in ``directory``; stop it on exit."""
    executable = shutil.which("redis-server")
    if executable is None:
        raise RuntimeError(
            "redis-server is not installed: apt-get install -y redis-server (.ci/run does)"
        )
    socket = directory / "redis.sock"
    process = subprocess.Popen(
        [
            executable,
            "--port",
            "0",
            "--unixsocket",
            str(socket),
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = RedisServer(socket, process)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited with status {process.returncode}")
            if socket.exists():
                try:
                    if server.cli("PING") == "PONG":
                        break
                except subprocess.CalledProcessError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start within 30 s")
            time.sleep(0.02)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
