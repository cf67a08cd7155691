"""A sandbox's process, started from the event loop's own thread.

Not with `trio.lowlevel.open_process`: that forks in a worker thread, and bwrap's
``--die-with-parent`` (``PR_SET_PDEATHSIG``) ties the sandbox to the *thread* that
forked it, which Trio ends after 10 s idle: a run or a container would be killed
(``SIGKILL``) 10 s after it started, whatever its own limits. The event loop's
thread lives as long as the server; starting the process holds it 0.3 ms (p50,
up to 3 ms, a 2-core box with 200 MiB resident: ``subprocess`` forks with
``vfork``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess

import trio


class Child:
    """A started process: what the sandboxes need of a trio `Process` (``pid``,
    ``returncode``, ``stdout`` as a stream with stderr merged in, ``wait``), and
    ``close`` for its pidfd once it is reaped."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: trio.lowlevel.FdStream) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        self._pidfd = os.pidfd_open(popen.pid)
        self._lock = trio.Lock()

    @classmethod
    def start(
        cls, argv: list[str], *, cwd: str | None, env: dict[str, str], pass_fds: list[int]
    ) -> Child:
        """Start ``argv`` in a new session, its stdin empty, its stdout and stderr one pipe."""
        read, write = os.pipe()
        try:
            popen = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=write,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        return cls(popen, trio.lowlevel.FdStream(read))

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        async with self._lock:
            if self._popen.poll() is None:
                await trio.lowlevel.wait_readable(self._pidfd)
                self._popen.wait()
        return self._popen.returncode

    def close(self) -> None:
        """Close the pidfd (once the process is reaped, or given up on)."""
        with contextlib.suppress(OSError):
            os.close(self._pidfd)
