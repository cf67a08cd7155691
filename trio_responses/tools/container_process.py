"""One container's long-lived sandboxed Python process (`ContainerProcess`).

A container runs its calls in one Python process, the kernel
(``tools/container_kernel.py``), whose globals persist from call to call, with
its files under ``/mnt/data``. The process is isolated as ``tools.sandbox``
isolates a run, once per container instead of once per run: a bubblewrap
sandbox (`Bwrap.argv`) with its own pid namespace, its own tmpfs ``/mnt/data``
of ``disk_bytes`` and its own ``/tmp`` of the same size (so that what programs
keep there is not among the container's files), the seccomp filter, the
launcher's resource limits and user drop, and a cgroup of its own where
``sandbox.cgroups`` allows. The kernel's script lies at ``/opt/kernel/main.py``,
outside the work directory.

Host and kernel talk over a control channel of two pipes (the kernel's fds
named on its command line), in length-prefixed frames, JSON headers encoded and
decoded by ``protocol.codec`` here; the kernel's docstring lists the
operations. User output (stdout and stderr, one pipe) is read continuously; a
call's output ends at a random marker the kernel writes after it flushed. User
code shares the kernel's process and can write anything to any of its fds, so
everything read here is bounded and checked: a frame too large, a reply that is
not what was asked, or no reply within the wall-clock limit ends the process,
and the call says the process died.

Limits, per call unless said otherwise:

- wall clock (``wall_s``): the call's whole time, the only firm bound; past it
  the process is killed (`ContainerRun.died`).
- CPU (``cpu_s``): the CPU limit of a long-lived process is cumulative, so
  before each call the kernel sets its soft ``RLIMIT_CPU`` to what it has used
  plus ``cpu_s``; the hard limit is unlimited, so user code could raise it
  again: the wall-clock limit is what holds. Past it, SIGXCPU kills the process.
- memory (``memory_bytes``, per process; the whole container's with a cgroup):
  a ``MemoryError`` that ends a call, or the cgroup's OOM kill, ends the process.
- output (``output_bytes``): past it, the process is killed and the output
  kept so far is returned with a note.
- processes (``processes``) and disk (``disk_bytes``) hold for the container's
  whole life: processes a call left running and files it wrote count for the
  next ones. Reaching them fails the calls that try (``EAGAIN``, ``ENOSPC``),
  the process lives on.

Unsandboxed (``sandbox.mode == "none"``), the same kernel runs as a plain child
process with limits only, in a temporary directory that is its data directory
and working directory (``HOME`` and ``TMPDIR`` another one beside it): code
must use relative paths there (``/mnt/data`` does not exist), and its files go
with the container.

Extra packages: ``packages`` names a host directory bound read-only at
``/opt/packages`` and appended to ``sys.path`` by the kernel (the interpreter
runs isolated, ``-I``, so nothing else would add it). An operator fills it
with the interpreter user code runs (the server's base interpreter, not a
virtual environment's), e.g. ``scripts/sandbox-packages DIR`` (numpy, pandas,
matplotlib), which runs ``python -m pip install --target DIR ...``. The kernel
sets ``MPLBACKEND=Agg``; when user code imports ``matplotlib.pyplot`` its
``show`` keeps the figures open at that point as PNGs (`ContainerRun.figures`),
as it does with the figures still open at the end of a call.
"""

from __future__ import annotations

import secrets
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from ..protocol.codec import decode_json, encode_ascii_json
from .bwrap import PACKAGES_DIR, SANDBOX_UID, WORK_DIR
from .cgroup import RunCgroup
from .child import Child
from .sandbox import (
    Limits,
    Sandbox,
    _bwrap_command,
    _Fds,
    _kill_group,
    _launcher_argv,
    _scrubbed_environment,
)

KERNEL_SOURCE = Path(__file__).with_name("container_kernel.py")
"""The kernel's source, run as a script inside the container."""
KERNEL_PATH = "/opt/kernel/main.py"
"""Where the kernel's script lies inside the sandbox."""
HOST_CONFIG = ("/etc/fonts",)
"""Host directories a container sees (read-only): fontconfig's configuration, which
matplotlib's font lookup reads."""
MAX_FIGURES = 8
MAX_FIGURE_BYTES = 4 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
"""The largest JSON header read from the kernel, but for a listing's."""
START_S = 30.0
"""The least time the process gets to start (say hello), whatever ``wall_s``."""
REAP_S = 5.0
"""How long the host waits for a killed process to be reaped."""
_MARKER_BYTES = 40


@dataclass(frozen=True)
class FileState:
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class ContainerRun:
    logs: str
    """stdout and stderr as written (truncated at ``output_bytes``, with a note),
    and the repr of the call's last expression when it is one and not None."""
    ok: bool
    """The code ran to its end without an exception."""
    problem: str | None
    """Why not ok: the exception's line, the limit hit, or that the process died."""
    died: bool
    """The process is gone (a limit killed it, it crashed or exited): its variables
    are lost."""
    figures: list[bytes]
    """PNGs of the matplotlib figures the call showed or left open."""


class ContainerProcessDied(Exception):
    """A file operation found the container's process gone, or ended it."""


class _Broken(Exception):
    """The kernel said something it should not have, or stopped answering."""


class ContainerProcess:
    """One container's long-lived sandboxed Python process."""

    def __init__(
        self,
        process: Child,
        limits: Limits,
        requests: trio.lowlevel.FdStream,
        replies: trio.lowlevel.FdStream,
        cgroup: RunCgroup | None,
    ) -> None:
        self._process = process
        self._limits = limits
        self._requests = requests
        self._replies = replies
        self._cgroup = cgroup
        self._lock = trio.Lock()
        self._exited = trio.Event()
        self._reply_buffer = bytearray()
        self._output = bytearray()
        self._output_closed = False
        self._reader_gone = False
        """The output's reader ended (with the output, or cancelled with its nursery)."""
        self._output_changed = trio.Event()
        self._overflow = False
        self._death: str | None = None
        """Why the process ended, once the host knows (a limit, a bad reply)."""

    # -- life -------------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(
        cls, sandbox: Sandbox, limits: Limits, *, packages: str | None = None
    ) -> AsyncIterator[ContainerProcess]:
        """Start the container's process; on exit, kill and reap everything it
        started and remove its cgroup.

        Raises:
            ContainerProcessDied: it did not start (the message says why).
        """
        cgroup = None
        if sandbox.cgroups is not None:
            cgroup = sandbox.cgroups.create(
                memory_bytes=limits.memory_bytes, processes=limits.processes
            )
        try:
            with (
                tempfile.TemporaryDirectory(prefix="trio-responses-container-") as workdir,
                _Fds() as fds,
            ):
                process, requests, replies, release = await _start(
                    sandbox, limits, packages, cgroup, fds, workdir
                )
                container = cls(process, limits, requests, replies, cgroup)
                # The body's exception leaves as it came, not in an ExceptionGroup.
                failure: BaseException | None = None
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(container._watch)
                        nursery.start_soon(container._read_output)
                        try:
                            if release is not None:
                                await release()
                            await container._hello()
                            yield container
                        except BaseException as error:
                            failure = error
                        finally:
                            with trio.CancelScope(shield=True):
                                await container._end()
                            nursery.cancel_scope.cancel()
                    if failure is not None:
                        raise failure
                finally:
                    with trio.CancelScope(shield=True):
                        await requests.aclose()
                        await replies.aclose()
                        await process.stdout.aclose()
                        process.close()
        finally:
            if cgroup is not None:
                with trio.CancelScope(shield=True):
                    await cgroup.remove()

    @property
    def alive(self) -> bool:
        return self._death is None and not self._exited.is_set()

    @property
    def pid(self) -> int:
        """The host's pid of the process (bwrap's, when sandboxed)."""
        return self._process.pid

    async def _hello(self) -> None:
        try:
            with trio.fail_after(max(START_S, self._limits.wall_s)):
                hello = await self._until_exit(partial(self._header, MAX_HEADER_BYTES))
            if hello.get("id") != "hello" or not isinstance(hello.get("pid"), int):
                raise _Broken("no hello")
        except (_Broken, trio.TooSlowError) as error:
            await self._kill_and_reap(f"did not start: {error or 'no answer'}")
            output = self._output.decode("utf-8", errors="replace").strip()
            raise ContainerProcessDied(
                f"the container's process did not start ({self._describe_exit()}): "
                f"{output[-2000:] or 'no output'}"
            ) from None

    async def _watch(self) -> None:
        await self._process.wait()
        self._exited.set()
        self._wake()

    async def _read_output(self) -> None:
        stdout = self._process.stdout
        if stdout is None:  # pragma: no cover - stdout=PIPE
            return
        room = self._limits.output_bytes + 2 * _MARKER_BYTES
        try:
            while chunk := await stdout.receive_some(65536):
                self._output.extend(chunk)
                if len(self._output) > room and not self._overflow:
                    self._overflow = True
                    self._kill("output limit exceeded")
                if len(self._output) > 2 * room:  # killed; still draining its last writes
                    del self._output[room:]
                self._wake()
            self._output_closed = True
        finally:
            self._reader_gone = True
            self._wake()

    def _wake(self) -> None:
        self._output_changed.set()
        self._output_changed = trio.Event()

    def _kill(self, why: str | None) -> None:
        if self._death is None:
            self._death = why
        _kill_group(self._process.pid)
        if self._cgroup is not None:
            self._cgroup.kill_all()

    async def _kill_and_reap(self, why: str | None) -> None:
        """Kill everything, reap the process and wait (bounded) until nothing holds
        its output open: with bwrap, until its pid namespace is gone."""
        self._kill(why)
        # Waited for here, not through `_watch`: that task is cancelled with its
        # nursery when the container closes because its owner was cancelled.
        with trio.CancelScope(shield=True):
            with trio.move_on_after(REAP_S):
                await self._process.wait()
                self._exited.set()
            with trio.move_on_after(1):
                while not self._output_closed and not self._reader_gone:
                    await self._output_changed.wait()

    async def _end_broken(self, broken: _Broken) -> None:
        """The control channel failed: when the process is exiting anyway (a crash,
        a limit), its exit says why, else what failed does."""
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await self._exited.wait()
        why = None if self._exited.is_set() else f"the container's process died ({broken})"
        await self._kill_and_reap(why)

    async def _end(self) -> None:
        await self._kill_and_reap("the container's process died (the container was closed)")

    # -- calls ------------------------------------------------------------------------

    async def run(self, code: str) -> ContainerRun:
        """Run ``code`` in the container's namespace (one call at a time).

        Cancellation kills the process (its state is lost) and propagates.
        """
        async with self._lock:
            if not self.alive:
                return ContainerRun("", False, self._death_problem(), True, [])
            marker = f"\n<<<{secrets.token_hex(16)}>>>\n"
            request_id = secrets.token_hex(8)
            request = {
                "id": request_id,
                "op": "run",
                "code": code,
                "marker": marker,
                "cpu_s": self._limits.cpu_s,
            }
            done = False
            try:
                with trio.move_on_after(self._limits.wall_s) as wall:
                    try:
                        reply, figures = await self._until_exit(
                            partial(self._run_exchange, request, marker)
                        )
                        done = True
                    except _Broken as broken:
                        await self._end_broken(broken)
                if wall.cancelled_caught:
                    await self._kill_and_reap(
                        f"wall-clock limit of {self._limits.wall_s:g} s exceeded"
                    )
            finally:
                if not done and self.alive:  # cancelled
                    await self._kill_and_reap("the container's process died (a call was cancelled)")
            if not done:
                await self._drain()
                return self._died_run()
            logs = self._take_output(marker)
            error = reply.get("error")
            if reply.get("memory") is True:
                await self._kill_and_reap(self._memory_problem())
                return ContainerRun(logs, False, self._memory_problem(), True, figures)
            ok = reply.get("ok") is True
            problem = None if ok else (_text(error) if isinstance(error, str) else "failed")
            return ContainerRun(logs, ok, problem, False, figures)

    async def _run_exchange(
        self, request: dict[str, Any], marker: str
    ) -> tuple[dict[str, Any], list[bytes]]:
        reply = await self._ask(request)
        count = reply.get("figures")
        if not isinstance(count, int) or not 0 <= count <= MAX_FIGURES:
            raise _Broken("malformed reply: figures")
        if not isinstance(reply.get("ok"), bool):
            raise _Broken("malformed reply: ok")
        figures = [await self._frame(MAX_FIGURE_BYTES) for _ in range(count)]
        encoded = marker.encode()
        # The overflow first: past the limit the process is being killed, even when its
        # call got to answer (and the end of its output to arrive) before the kill did.
        while self._overflow or encoded not in self._output:
            if self._output_closed or self._overflow:
                raise _Broken("its output ended")
            await self._output_changed.wait()
        return reply, figures

    def _take_output(self, marker: str) -> str:
        encoded = marker.encode()
        end = self._output.find(encoded)
        text = bytes(self._output[:end])
        del self._output[: end + len(encoded)]
        return self._bounded_text(text, stopped=False)

    def _bounded_text(self, text: bytes, *, stopped: bool) -> str:
        limit = self._limits.output_bytes
        out = text[:limit].decode("utf-8", errors="replace")
        if len(text) > limit:
            out += f"\n[output truncated at {limit} bytes"
            out += "; the process was stopped]" if stopped else "]"
        return out

    async def _drain(self) -> None:
        """Wait (briefly) for the last of a dead process's output."""
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            while not self._output_closed and not self._reader_gone:
                await self._output_changed.wait()

    def _died_run(self) -> ContainerRun:
        text = bytes(self._output)
        self._output.clear()
        problem = self._death_problem()
        if problem != "output limit exceeded" and len(text) > self._limits.output_bytes:
            problem = "output limit exceeded"
        return ContainerRun(self._bounded_text(text, stopped=True), False, problem, True, [])

    def _memory_problem(self) -> str:
        return f"memory limit of {self._limits.memory_bytes // (1024 * 1024)} MiB exceeded"

    def _death_problem(self) -> str:
        """Why the process is gone, in the words of `ContainerRun.problem`."""
        if self._overflow:
            return "output limit exceeded"
        if self._cgroup is not None and self._cgroup.oom_killed():
            return self._memory_problem()
        returncode = self._returncode()
        if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            return f"CPU time limit of {self._limits.cpu_s} s exceeded"
        if self._death is not None:
            return self._death
        return f"the container's process died ({self._describe_exit()})"

    def _returncode(self) -> int | None:
        returncode = self._process.returncode
        # bwrap exits 128 + N when the process in it died of signal N.
        if returncode is not None and 128 < returncode < 128 + signal.NSIG:
            returncode = -(returncode - 128)
        return returncode

    def _describe_exit(self) -> str:
        returncode = self._returncode()
        if returncode is None:
            return "still running"
        if returncode < 0:
            return f"killed by signal {signal.Signals(-returncode).name}"
        return f"exit status {returncode}"

    # -- files ------------------------------------------------------------------------

    async def put_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` under ``/mnt/data``, making its directories.

        Raises:
            ValueError: ``path`` is not a relative path inside the data directory.
            OSError: the kernel could not write it (no space, too large...).
            ContainerProcessDied: the process is gone.
        """
        checked = _checked_path(path)
        if len(data) >= 1 << 32:
            raise OSError(f"cannot write {checked}: 4 GiB or more")
        reply = await self._file_op({"op": "put", "path": checked}, payload=data)
        error = reply.get("error")
        if error is not None:
            raise OSError(f"cannot write {checked}: {_text(error, 500)}")

    async def read_file(self, path: str, *, max_bytes: int) -> bytes | None:
        """The bytes of ``path``; None if it is missing, not a regular file (a
        symbolic link included) or larger than ``max_bytes``."""
        checked = _checked_path(path)
        request = {"op": "read", "path": checked, "max_bytes": max_bytes}
        data: bytes | None = await self._file_op(request, read_bytes=max_bytes)
        return data

    async def remove_file(self, path: str) -> None:
        """Remove ``path`` (nothing if it is missing).

        Raises:
            OSError: the kernel could not remove it (a directory...).
        """
        checked = _checked_path(path)
        reply = await self._file_op({"op": "remove", "path": checked})
        error = reply.get("error")
        if error is not None:
            raise OSError(f"cannot remove {checked}: {_text(error, 500)}")

    async def listing(self, *, max_files: int = 1000) -> dict[str, FileState]:
        """The regular files under ``/mnt/data`` by relative path (at most
        ``max_files``); symbolic links are neither followed nor listed."""
        reply = await self._file_op(
            {"op": "list", "max_files": max_files}, header_bytes=MAX_HEADER_BYTES + 4200 * max_files
        )
        files = reply.get("files")
        if not isinstance(files, dict) or len(files) > max_files:
            await self._kill_and_reap("the container's process died (malformed listing)")
            raise ContainerProcessDied(self._death_problem())
        listed: dict[str, FileState] = {}
        for name, state in files.items():
            valid = (
                isinstance(state, list)
                and len(state) == 2
                and all(isinstance(value, int) and value >= 0 for value in state)
            )
            try:
                checked = _checked_path(name)
            except ValueError:
                valid = False
            if valid:
                listed[checked] = FileState(size=state[0], mtime_ns=state[1])
        return listed

    async def _file_op(
        self,
        request: dict[str, Any],
        *,
        payload: bytes | None = None,
        read_bytes: int | None = None,
        header_bytes: int = MAX_HEADER_BYTES,
    ) -> Any:
        """One file operation's exchange: its reply (with ``read_bytes``, the file's
        bytes or None)."""
        async with self._lock:
            if not self.alive:
                raise ContainerProcessDied(self._death_problem())
            request = {**request, "id": secrets.token_hex(8)}
            done = False
            try:
                with trio.move_on_after(self._limits.wall_s) as wall:
                    try:
                        result = await self._until_exit(
                            partial(self._file_exchange, request, payload, read_bytes, header_bytes)
                        )
                        done = True
                    except _Broken as broken:
                        await self._end_broken(broken)
                if wall.cancelled_caught:
                    await self._kill_and_reap(
                        "the container's process did not answer within the wall-clock limit"
                    )
            finally:
                if not done and self.alive:  # cancelled
                    await self._kill_and_reap(
                        "the container's process died (a file operation was cancelled)"
                    )
            if not done:
                raise ContainerProcessDied(self._death_problem())
            return result

    async def _file_exchange(
        self,
        request: dict[str, Any],
        payload: bytes | None,
        read_bytes: int | None,
        header_bytes: int,
    ) -> Any:
        reply = await self._ask(request, payload=payload, header_bytes=header_bytes)
        if read_bytes is None:
            return reply
        found = reply.get("found")
        if not isinstance(found, bool):
            raise _Broken("malformed reply: found")
        return await self._frame(read_bytes) if found else None

    # -- the control channel ----------------------------------------------------------

    async def _until_exit(self, exchange: Callable[[], Awaitable[Any]]) -> Any:
        """``exchange()``, unless the process exits first (then `_Broken`)."""
        result: list[Any] = []
        broken: list[_Broken] = []
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await self._exited.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            try:
                result.append(await exchange())
            except _Broken as error:
                broken.append(error)
            nursery.cancel_scope.cancel()
        if broken:
            raise broken[0]
        if not result:
            raise _Broken(self._describe_exit())
        return result[0]

    async def _ask(
        self,
        request: dict[str, Any],
        *,
        payload: bytes | None = None,
        header_bytes: int = MAX_HEADER_BYTES,
    ) -> dict[str, Any]:
        # ASCII: code may hold lone surrogates, which UTF-8 cannot.
        message = _frame_bytes(encode_ascii_json(request).encode())
        if payload is not None:
            message += _frame_bytes(payload)
        try:
            await self._requests.send_all(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            raise _Broken(f"its control channel is closed: {error}") from None
        reply = await self._header(header_bytes)
        if reply.get("id") != request["id"]:
            raise _Broken("malformed reply: not an answer to the request")
        return reply

    async def _header(self, max_bytes: int) -> dict[str, Any]:
        frame = await self._frame(max_bytes)
        try:
            value = decode_json(frame)
        except (ValueError, RecursionError):
            raise _Broken("malformed reply: not JSON") from None
        if not isinstance(value, dict):
            raise _Broken("malformed reply: not an object")
        return value

    async def _frame(self, max_bytes: int) -> bytes:
        header = await self._exactly(4)
        size = int.from_bytes(header, "big")
        if size > max_bytes:
            raise _Broken(f"malformed reply: a frame of {size} bytes")
        return await self._exactly(size)

    async def _exactly(self, size: int) -> bytes:
        while len(self._reply_buffer) < size:
            try:
                chunk = await self._replies.receive_some(max(65536, size - len(self._reply_buffer)))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                raise _Broken(f"its control channel failed: {error}") from None
            if not chunk:
                raise _Broken("its control channel closed")
            self._reply_buffer.extend(chunk)
        data = bytes(self._reply_buffer[:size])
        del self._reply_buffer[:size]
        return data


def _frame_bytes(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def _text(value: object, limit: int = 2000) -> str:
    """A string the kernel sent, as plain text: valid UTF-8, at most ``limit`` characters."""
    text = str(value)[:limit]
    return text.encode("utf-8", errors="replace").decode("utf-8")


def _checked_path(path: str) -> str:
    """``path`` as a relative path inside the data directory.

    Raises:
        ValueError: it is absolute, has ``..``, or is otherwise not one.
    """
    if not isinstance(path, str) or not path or "\0" in path or len(path) > 4096:
        raise ValueError(f"not a file path: {path!r}")
    if path.startswith("/"):
        raise ValueError(f"an absolute path; give one relative to {WORK_DIR}: {path!r}")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"not a path inside {WORK_DIR}: {path!r}")
    return "/".join(parts)


_Started = tuple[
    Child,
    trio.lowlevel.FdStream,
    trio.lowlevel.FdStream,
    Callable[[], Awaitable[None]] | None,
]


async def _start(
    sandbox: Sandbox,
    limits: Limits,
    packages: str | None,
    cgroup: RunCgroup | None,
    fds: _Fds,
    workdir: str,
) -> _Started:
    """Start the process: it, the host's ends of the control channel, and what
    lets bwrap go on (root only: the user namespace's maps)."""
    kernel_in, host_out = fds.pipe()  # requests
    host_in, kernel_out = fds.pipe()  # replies
    environment = {"MPLBACKEND": "Agg"}
    release = None
    if sandbox.bwrap is None:
        data, home = trio.Path(workdir, "data"), trio.Path(workdir, "tmp")
        await data.mkdir()
        await home.mkdir()
        argv = _launcher_argv(
            sys.executable,
            limits,
            "-",
            script=str(KERNEL_SOURCE),
            cpu_hard="-1",
            args=(str(kernel_in), str(kernel_out), str(data), packages or "-"),
        )
        env = {**_scrubbed_environment(str(home)), **environment}
        passed = [kernel_in, kernel_out]
        cwd: str | None = str(data)
    else:
        bwrap = sandbox.bwrap
        launcher = _launcher_argv(
            bwrap.runtime.executable,
            limits,
            str(SANDBOX_UID) if bwrap.maps_users else "-",
            script=KERNEL_PATH,
            cpu_hard="-1",
            args=(
                str(kernel_in),
                str(kernel_out),
                WORK_DIR,
                "-" if packages is None else PACKAGES_DIR,
            ),
        )
        command = _bwrap_command(
            bwrap,
            fds,
            limits,
            cgroup,
            code=("kernel.py", await trio.Path(KERNEL_SOURCE).read_bytes()),
            launcher=launcher,
            script_path=KERNEL_PATH,
            packages=None if packages is None else str(await trio.Path(packages).resolve()),
            own_tmp=True,
            environment={**environment, "HOME": "/tmp"},
            host_config=HOST_CONFIG,
        )
        argv = command.argv
        passed = [*command.pass_fds, kernel_in, kernel_out]
        env = {}  # bwrap's own environment is visible to the sandbox (its pid 1)
        cwd = None
        release = command.release
    process = Child.start(argv, cwd=cwd, env=env, pass_fds=passed)
    for fd in passed:
        fds.close(fd)  # the process has them now
    requests = trio.lowlevel.FdStream(fds.release(host_out))
    replies = trio.lowlevel.FdStream(fds.release(host_in))
    return process, requests, replies, release
