"""``serve --workers N``: N server processes on one port, under a supervisor.

The supervisor is the ``serve`` command itself. It binds the address once (with
``SO_REUSEPORT``: `trio_responses._serve.bind_shared`), so that port 0 becomes
one real port, keeps that socket bound (never listening: the kernel hands
connections to listening sockets only) so the port stays the group's while
workers come and go, and starts N workers::

    python -m trio_responses serve ARGS... --workers 1 --port PORT --reuse-port
        --worker-id I --supervisor-fd FD

Each worker is a whole server (service, engine, jobs, HTTP) with its own replica
identity in the store (`RedisControl`: its lease and control stream), bound to the
same port with ``SO_REUSEPORT``; the kernel spreads new connections over the
workers listening. Because they share the store, a response created through one
is retrieved, streamed and cancelled through any, as across replicas.

Task tree::

    supervise()
    ├── _Worker.keep_running (N)  start, wait until ready, wait for its exit, restart
    └── (itself)                  wait for SIGINT/SIGTERM or a worker given up on;
                                  then SIGTERM to every worker, bounded wait, SIGKILL

The supervisor and a worker share a socket pair (``--supervisor-fd``): the
worker writes one line on it once it listens (`SupervisorLink.ready`), and reads
it until it ends: when the supervisor is gone (killed, even with ``kill -9``),
the worker shuts down gracefully on its own (`SupervisorLink.wait_gone`).
Workers run in their own session, so a terminal's Ctrl-C reaches the
supervisor only, which passes the stop on once.

Supervision:

- a worker that exits while the group runs is restarted: at once after a run of
  at least `WorkerPolicy.stable_s`, else after a backoff that doubles; after
  `WorkerPolicy.max_quick_exits` short runs in a row the supervisor gives up,
  stops the others and exits 1;
- a worker that exits before it ever listened (a store it cannot reach, a bad
  setting its own start-up refuses) stops the group at once: exit 1, the
  worker's own message on stderr says why;
- the responses a dead worker ran are recovered as a dead replica's: once its
  lease (``--job-lease``) runs out, another worker ends them ``failed``
  (``server_restarted``) and ends their event logs with that event;
- on SIGINT or SIGTERM every worker gets SIGTERM (its graceful shutdown:
  ``--shutdown-grace``, then the cleanup budget); one still running after
  `stop_bound` is killed. Exit 0 when every worker stopped cleanly.

What may not be shared is refused before anything starts (`Config`): a store
that is one process's (memory, SQLite) and the in-process vLLM engine.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import final

import trio

from ._config import Config
from ._serve import bind_shared

logger = logging.getLogger("trio_responses.workers")

READY_LINE = b"ready\n"
"""What a worker writes to its supervisor once it listens."""


@dataclass(frozen=True, kw_only=True)
class WorkerPolicy:
    """How the supervisor treats workers that exit."""

    stable_s: float = 30.0
    """A run at least this long was not a crash loop: the next restart is immediate."""
    first_backoff_s: float = 0.5
    """Wait before restarting after the second short run in a row (then doubled)."""
    max_backoff_s: float = 10.0
    """Longest wait before a restart."""
    max_quick_exits: int = 5
    """Short runs in a row after which the supervisor gives up (exit 1)."""
    start_timeout_s: float = 300.0
    """Most seconds a worker may take to listen (its start-up: store, engine, tools)."""


def stop_bound(config: Config) -> float:
    """Seconds the supervisor waits for its workers after passing on a stop: their
    graceful shutdown (grace period, then the cleanup steps, the engine's included),
    and a margin for the processes' own exit."""
    return config.shutdown_grace_s + 5 * config.cleanup_timeout_s + 10.0


def worker_command(argv: Sequence[str], *, index: int, port: int, fd: int) -> list[str]:
    """The command line of worker ``index``: the supervisor's own ``serve`` arguments
    (``argv``, which starts with ``serve``), then what makes it one worker. Later
    flags win, so these override whatever ``argv`` said about them."""
    return [
        sys.executable,
        "-m",
        "trio_responses",
        *argv,
        "--workers",
        "1",
        "--port",
        str(port),
        "--reuse-port",
        "--worker-id",
        str(index),
        "--supervisor-fd",
        str(fd),
    ]


class GaveUp(Exception):
    """A worker could not be kept running (see the module docstring)."""


@final
class _Worker:
    """One worker slot: the process now in it, restarted as `WorkerPolicy` says."""

    def __init__(self, index: int, command: Sequence[str], policy: WorkerPolicy) -> None:
        self.index = index
        self._argv = command
        self._policy = policy
        self.process: trio.Process | None = None
        self.ready = trio.Event()
        """Set once the first process listens."""
        self.stopping = False
        self.status: int | None = None
        """The exit status of the last process, once stopped."""

    def terminate(self) -> None:
        """Pass a graceful stop on to the process (SIGTERM), once; no more restarts."""
        self.stopping = True
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)

    async def keep_running(self, port: int) -> None:
        """Run the worker until `terminate`, restarting it when it exits.

        Raises:
            GaveUp: it exited before it ever listened, or it keeps exiting soon
                after starting (`WorkerPolicy.max_quick_exits`).
        """
        policy = self._policy
        quick_exits = 0
        while True:
            started_at = trio.current_time()
            self.status = None
            listened, status = await self._run_once(port)
            self.status = status
            if self.stopping:
                return
            if not self.ready.is_set():
                raise GaveUp(
                    f"worker {self.index} exited with status {status} before it listened "
                    "(its messages above say why)"
                )
            ran_s = trio.current_time() - started_at
            quick_exits = quick_exits + 1 if ran_s < policy.stable_s or not listened else 0
            if quick_exits >= policy.max_quick_exits:
                raise GaveUp(
                    f"worker {self.index} exited {quick_exits} times in a row within "
                    f"{policy.stable_s:g} s of starting (last status {status}): giving up"
                )
            delay = (
                0.0
                if quick_exits <= 1
                else min(policy.first_backoff_s * 2 ** (quick_exits - 2), policy.max_backoff_s)
            )
            logger.warning(
                "worker %d exited with status %s after %.1f s; restarting it%s",
                self.index,
                status,
                ran_s,
                f" in {delay:g} s" if delay else "",
            )
            await trio.sleep(delay)
            if self.stopping:
                return

    async def _run_once(self, port: int) -> tuple[bool, int]:
        """Start one process and wait for its exit: (whether it listened, its status).

        Cancelled, it kills the process (and waits for it, shielded)."""
        ours, theirs = socket.socketpair()
        try:
            command = worker_command(self._argv, index=self.index, port=port, fd=theirs.fileno())
            process = await trio.lowlevel.open_process(
                command,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # Ctrl-C reaches the supervisor, which passes it on
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.process = process
        if self.stopping:  # a stop came while it started
            process.send_signal(signal.SIGTERM)
        listened = False
        link = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        try:
            with trio.move_on_after(self._policy.start_timeout_s) as waiting:
                listened = await _read_ready(link)
            if waiting.cancelled_caught:
                logger.error(
                    "worker %d did not listen within %g s: killing it",
                    self.index,
                    self._policy.start_timeout_s,
                )
                process.kill()
            if listened:
                logger.info("worker %d (pid %d) listening", self.index, process.pid)
                self.ready.set()
            status = await process.wait()
        finally:
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    logger.error(
                        "worker %d (pid %d) still running: killing it", self.index, process.pid
                    )
                    process.kill()
                await process.wait()
                await link.aclose()
        return listened, status


async def _read_ready(link: trio.SocketStream) -> bool:
    """Whether the worker says it listens before its end of the pair closes."""
    received = b""
    while READY_LINE not in received:
        chunk = await link.receive_some(64)
        if not chunk:
            return False
        received += chunk
    return True


async def supervise(
    config: Config,
    argv: Sequence[str],
    *,
    policy: WorkerPolicy | None = None,
) -> int:
    """Run ``config.workers`` workers of the ``serve`` command ``argv`` on one port
    until SIGINT or SIGTERM (see the module docstring); returns the exit status.

    Logs ``listening on URL`` (the line a single server writes) once every
    worker listens.

    Raises:
        StartupError: the address cannot be bound.
    """
    policy = policy or WorkerPolicy()
    reserved = bind_shared(config.host, config.port)
    with reserved:
        host, port = reserved.getsockname()[:2]
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        workers = [_Worker(index, argv, policy) for index in range(1, config.workers + 1)]
        gave_up: list[GaveUp] = []
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                failed = trio.Event()

                async def keep(worker: _Worker) -> None:
                    try:
                        await worker.keep_running(port)
                    except GaveUp as error:
                        gave_up.append(error)
                        failed.set()

                for worker in workers:
                    nursery.start_soon(keep, worker)

                async def wait_for_signal() -> None:
                    async for signum in signals:
                        logger.info(
                            "received %s: stopping the workers", signal.Signals(signum).name
                        )
                        return

                async with trio.open_nursery() as waiting:

                    async def announce() -> None:
                        for worker in workers:
                            await worker.ready.wait()
                        logger.info("%d workers listening", len(workers))
                        logger.info("listening on %s", url)

                    async def until(wait: trio.Event | None) -> None:
                        if wait is None:
                            await wait_for_signal()
                        else:
                            await wait.wait()
                        waiting.cancel_scope.cancel()

                    waiting.start_soon(announce)
                    waiting.start_soon(until, None)
                    waiting.start_soon(until, failed)
                for error in gave_up:
                    logger.error("%s", error)
                for worker in workers:
                    worker.terminate()
                # What has not stopped by then is killed (`_Worker._run_once`).
                nursery.cancel_scope.deadline = trio.current_time() + stop_bound(config)
    if gave_up or any(worker.status != 0 for worker in workers):
        return 1
    logger.info("all workers stopped")
    return 0


@final
class SupervisorLink:
    """A worker's end of its socket pair with the supervisor (``--supervisor-fd``)."""

    def __init__(self, fd: int) -> None:
        self._stream = trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)))

    async def ready(self) -> None:
        """Tell the supervisor this worker listens (nothing if it is gone)."""
        with contextlib.suppress(trio.BrokenResourceError):
            await self._stream.send_all(READY_LINE)

    async def wait_gone(self) -> None:
        """Return once the supervisor is gone (its end closed: it exited, or was killed)."""
        with contextlib.suppress(trio.BrokenResourceError):
            while await self._stream.receive_some():
                pass


__all__ = [
    "GaveUp",
    "SupervisorLink",
    "WorkerPolicy",
    "stop_bound",
    "supervise",
    "worker_command",
]
