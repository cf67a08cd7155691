"""``trio-responses serve`` as a real child process, for end-to-end tests.

`ServeCommand.start` runs ``python -m trio_responses serve --port 0 FLAGS`` in a
task of the caller's nursery (the pytest-trio ``nursery`` fixture, typically).
That task drains the child's stderr continuously, so a chatty server never
blocks on a full pipe, and kills the child (SIGKILL) when the nursery ends,
whether the test passed or failed::

    async def test_it(nursery: trio.Nursery) -> None:
        server = await ServeCommand.start(nursery, "--store", "sqlite:///x.db")
        ...                                   # talk to server.url
        assert await server.stop() == 0       # graceful (SIGTERM), or:
        await server.kill()                   # kill -9: no shutdown at all
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from typing import final

import trio

READY = re.compile(rb"listening on (http://\S+)")


@final
class ServeCommand:
    """One ``trio-responses serve`` child process and what it printed."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.log = b""
        """Everything the child wrote to stderr so far (its log)."""
        self.url = ""
        """``http://127.0.0.1:PORT`` once it listens (see `wait_ready`)."""
        self._terminated = False
        self._grew = trio.Event()
        self._drained = trio.Event()

    @classmethod
    async def start(
        cls, nursery: trio.Nursery, *flags: str, ready: bool = True, timeout_s: float = 30
    ) -> ServeCommand:
        """Start the child; with ``ready``, return once it listens (`url` is set).

        The child lives until it exits, `kill`, or the end of ``nursery``.

        Raises:
            AssertionError: with ``ready``, it exited before listening.
            trio.TooSlowError: with ``ready``, it did not listen within ``timeout_s``.
        """
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "trio_responses", "serve", "--port", "0", *flags],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        command = cls(process)
        try:
            await nursery.start(command._drain)
        except BaseException:
            process.kill()
            raise
        if ready:
            await command.wait_ready(timeout_s)
        return command

    async def _drain(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Read stderr to its end, then reap the child; kill it when cancelled."""
        stderr = self.process.stderr
        assert stderr is not None
        try:
            task_status.started()
            while chunk := await stderr.receive_some():
                self.log += chunk
                self._wake()
            self._drained.set()
            self._wake()
            await self.process.wait()
        finally:
            self._drained.set()
            self._wake()
            with trio.CancelScope(shield=True):
                if self.process.returncode is None:
                    self.process.kill()
                await self.process.wait()
                await stderr.aclose()

    def _wake(self) -> None:
        self._grew.set()
        self._grew = trio.Event()

    async def wait_for(self, pattern: bytes, timeout_s: float = 30) -> re.Match[bytes]:
        """Wait until the log matches ``pattern`` (a regular expression).

        Raises:
            AssertionError: the child closed its stderr (exited) without printing it.
            trio.TooSlowError: not within ``timeout_s``.
        """
        with trio.fail_after(timeout_s):
            while not (match := re.search(pattern, self.log)):
                if self._drained.is_set():
                    raise AssertionError(
                        f"the server exited without printing {pattern!r}:\n{self.log.decode()}"
                    )
                await self._grew.wait()
        return match

    async def wait_ready(self, timeout_s: float = 30) -> str:
        """Wait until the child listens; returns (and sets) `url`."""
        match = await self.wait_for(READY.pattern, timeout_s)
        self.url = match.group(1).decode()
        return self.url

    def terminate(self) -> None:
        """SIGTERM, once (a second one during shutdown would not be graceful)."""
        if not self._terminated and self.process.returncode is None:
            self._terminated = True
            self.process.send_signal(signal.SIGTERM)

    async def wait(self, timeout_s: float = 15) -> int:
        """Wait for the child to exit, its log read to the end; returns the exit status."""
        with trio.fail_after(timeout_s):
            await self._drained.wait()
            return await self.process.wait()

    async def stop(self, timeout_s: float = 15) -> int:
        """SIGTERM (graceful shutdown), then `wait`; returns the exit status."""
        self.terminate()
        return await self.wait(timeout_s)

    async def kill(self) -> int:
        """SIGKILL (kill -9: no shutdown at all); returns once the child is gone."""
        if self.process.returncode is None:
            self.process.kill()
        return await self.process.wait()
