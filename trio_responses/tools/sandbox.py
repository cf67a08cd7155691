"""Run untrusted Python code in a fresh, isolated, limited child process.

`probe_sandbox` decides once, at start, how runs are isolated:

- ``bwrap`` (and ``auto``): every run in its own bubblewrap sandbox
  (``tools.bwrap``): no network, no view of the host's files beyond ``/usr``
  and the Python runtime (read-only), its own processes only (the host-wide
  files of ``/proc`` masked), a size-limited tmpfs work directory, an empty
  environment, no capabilities, a seccomp filter against memory the limits
  cannot see and kernel interfaces user code has no use for (sockets other
  than unix and IP, keyrings, io_uring: ``tools.seccomp``). It refuses
  (`SandboxUnavailable`) when bubblewrap is missing or does not work.
- ``none``: a plain child process in a temporary directory with a scrubbed
  environment: resource limits only, no isolation. It can read what the
  server's user can read and reach the network; a warning says so.

Each run, either way: a new ``python -I`` process started by a tiny launcher
that sets resource limits before it execs the interpreter (CPU seconds,
address space, process count, file size, open files, no core dumps), a
wall-clock timeout, and a cap on the output collected. Everything the run
started is killed when it ends. With bwrap that includes processes that left
its process group and session (``setsid``): they live in the run's pid
namespace, which dies with it.

The memory of a run's whole process tree is bounded by a cgroup of its own
where the host lets the server create one (``tools.cgroup``), and otherwise by
the product of the per-process limits: at most ``processes`` processes of at
most ``memory_bytes`` each, plus ``disk_bytes`` of files. `Sandbox.health`
says which one is in force. How many runs execute at once, and so what they
hold in sum, is ``tools.budget``'s part.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import trio

from . import seccomp
from .budget import RunSlots, plan_budget
from .bwrap import SANDBOX_UID, WORK_DIR, Bwrap, Runtime
from .cgroup import CgroupParent, RunCgroup, find_parent
from .child import Child

logger = logging.getLogger("trio_responses.sandbox")

SandboxMode = Literal["auto", "bwrap", "none"]

# Runs inside the sandbox: sets the limits, then replaces itself with the
# interpreter running the script (main.py, unbuffered, so stdout and stderr
# interleave as the code wrote them), with the arguments after it. The hard CPU
# limit is one second above the soft one, or unlimited ("-1": a long-lived
# container process raises its soft limit call by call). As root (bwrap with
# user-namespace maps, see tools.bwrap), it first closes the run's user
# namespace to nested ones and, after the limits, becomes the sandbox user,
# which drops its capabilities.
_LAUNCHER = """\
import os, resource, sys
cpu, memory, fsize, nproc, nofile = (int(v) for v in sys.argv[1:6])
drop, script, cpu_hard = sys.argv[6:9]
if drop != "-":
    with open("/proc/sys/user/max_user_namespaces", "w") as limit:
        limit.write("0")
hard = cpu + 1 if cpu_hard == "+1" else int(cpu_hard)
resource.setrlimit(resource.RLIMIT_CPU, (cpu, hard))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if drop != "-":
    ids = int(drop)
    os.setgroups([])
    os.setresgid(ids, ids, ids)
    os.setresuid(ids, ids, ids)
os.execv(sys.executable, [sys.executable, "-I", "-u", script, *sys.argv[9:]])
"""

_INSTALL_HINT = (
    "Install bubblewrap (Debian, Ubuntu: apt-get install bubblewrap) or pass {flag} none "
    "to run user code without isolation (it can then read the server's files, use its "
    "network and signal its processes)."
)


class SandboxUnavailable(Exception):
    """The code interpreter cannot isolate user code here, so it does not start."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 10
    """CPU seconds per process before the kernel stops it (SIGXCPU)."""
    memory_bytes: int = 512 * 1024 * 1024
    """Address space per process; a larger allocation fails with MemoryError.
    With a cgroup, also the bound of the whole run."""
    file_bytes: int = 16 * 1024 * 1024
    """Largest file the code may write."""
    wall_s: float = 30.0
    """Wall-clock time before everything the run started is killed."""
    output_bytes: int = 64 * 1024
    """Output kept (stdout and stderr interleaved); the rest is dropped."""
    processes: int = 8
    """Most processes (and threads) the run may have at once."""
    disk_bytes: int = 64 * 1024 * 1024
    """Size of the run's work directory (bwrap: a tmpfs, also ``/tmp``)."""
    open_files: int = 256
    """Most open file descriptors per process."""


@dataclass(frozen=True)
class RunResult:
    output: str
    """stdout and stderr as the process wrote them (possibly truncated)."""
    ok: bool
    """True when the code ran to the end and exited 0."""
    problem: str | None
    """Why it is not ok: the exit status, the limit it hit, the signal."""


@dataclass(frozen=True)
class Sandbox:
    """How runs are isolated (see `probe_sandbox`)."""

    mode: Literal["bwrap", "none"]
    bwrap: Bwrap | None = None
    cgroups: CgroupParent | None = None
    """Where each run gets a cgroup; None: per-process limits bound memory."""
    cgroup_note: str = (
        "without a sandbox only each process's address space is limited: neither the "
        "number of processes (for root) nor the size of the files it writes"
    )
    """Why `cgroups` is what it is."""

    @classmethod
    def unsandboxed(cls) -> Sandbox:
        return cls("none")

    @property
    def memory_bound(self) -> Literal["cgroup", "rlimit", "per-process"]:
        """What bounds the memory of a run's process tree (`bound_bytes`)."""
        if self.cgroups is not None:
            return "cgroup"
        return "rlimit" if self.mode == "bwrap" else "per-process"

    @property
    def warning(self) -> str | None:
        if self.mode == "bwrap":
            return None
        return (
            "user code runs WITHOUT a sandbox (--python-sandbox none): it can read every "
            "file the server's user can, reach the network and the server, and signal "
            "the server's processes"
        )

    def bound_bytes(self, limits: Limits) -> int | None:
        """The most memory a run's process tree can hold, files in its work directory
        included; None when nothing bounds it (no sandbox)."""
        if self.cgroups is not None:
            return limits.memory_bytes
        if self.mode == "bwrap":
            return limits.processes * limits.memory_bytes + limits.disk_bytes
        return None

    def describe(self, limits: Limits) -> str:
        """One line for the start-up log."""
        mib = 1024 * 1024
        if self.cgroups is not None:
            bound = f"cgroup, {limits.memory_bytes // mib} MiB per run ({self.cgroup_note})"
        elif self.mode == "none":
            bound = f"{limits.memory_bytes // mib} MiB per process ({self.cgroup_note})"
        else:
            bound = (
                f"rlimit, {limits.processes} processes x {limits.memory_bytes // mib} MiB "
                f"+ {limits.disk_bytes // mib} MiB of files ({self.cgroup_note})"
            )
        if self.bwrap is None:
            return f"none; memory bound: {bound}"
        return f"{self.bwrap.version} ({self.bwrap.path}); memory bound: {bound}"

    def health(self, limits: Limits) -> dict[str, Any]:
        """What ``/health`` shows about the sandbox."""
        return {
            "mode": self.mode,
            "bwrap": None if self.bwrap is None else self.bwrap.path,
            "version": None if self.bwrap is None else self.bwrap.version,
            "memory_bound": self.memory_bound,
            "memory_bound_bytes": self.bound_bytes(limits),
            "memory_bound_note": self.cgroup_note,
            "processes": limits.processes,
            "memory_bytes_per_process": limits.memory_bytes,
            "disk_bytes": limits.disk_bytes,
            "warning": self.warning,
        }


@dataclass(frozen=True)
class SandboxReport:
    """A sandbox, the limits its runs use and the slots that bound how many run at
    once: what the server reports."""

    sandbox: Sandbox
    limits: Limits
    slots: RunSlots | None = None

    def health(self) -> dict[str, Any]:
        health = self.sandbox.health(self.limits)
        if self.slots is not None:
            health["budget"] = self.slots.health()
        return health


async def probe_sandbox(
    mode: SandboxMode, *, bwrap: str = "bwrap", flag: str = "--python-sandbox"
) -> Sandbox:
    """The sandbox for ``mode``, checked by running ``print(6 * 7)`` in it.

    ``bwrap`` is the executable (a name looked up on PATH, or a path); ``flag``
    is how the refusal message names the mode option.

    Raises:
        SandboxUnavailable: ``auto`` or ``bwrap``, and bubblewrap is missing or
            does not work here; the message says what to do.
    """
    if mode == "none":
        return Sandbox.unsandboxed()
    hint = _INSTALL_HINT.format(flag=flag)
    path = shutil.which(bwrap)
    if path is None:
        raise SandboxUnavailable(
            f"The code interpreter runs user code in a bubblewrap sandbox, and {bwrap!r} "
            f"was not found{' on PATH' if os.sep not in bwrap else ''}. {hint}"
        )
    try:
        version = await trio.run_process(
            [path, "--version"], capture_stdout=True, capture_stderr=True, env={}
        )
    except (OSError, subprocess.CalledProcessError) as error:
        raise SandboxUnavailable(f"{path} --version failed ({error}). {hint}") from None
    cgroups, note = await trio.to_thread.run_sync(find_parent)
    sandbox = Sandbox(
        "bwrap",
        Bwrap.for_this_process(
            path, version.stdout.decode(errors="replace").strip(), Runtime.current()
        ),
        cgroups,
        note,
    )
    checked = await run_python("print(6 * 7)", Limits(wall_s=60), sandbox=sandbox)
    if checked.output != "42\n" or not checked.ok:
        said = checked.output.strip() or "no output"
        raise SandboxUnavailable(
            f"The code interpreter runs user code in a bubblewrap sandbox, and {path} does "
            f"not work here ({checked.problem}: {said}). {hint}"
        )
    return sandbox


async def open_sandbox(
    mode: SandboxMode,
    limits: Limits,
    *,
    max_concurrent: int | None = None,
    max_concurrent_per_key: int | None = None,
    memory_budget_mb: int | None = None,
) -> SandboxReport:
    """The code interpreter's sandbox for the server: probed, its memory budget
    planned (`tools.budget.plan_budget`), and both logged.

    Raises:
        SandboxUnavailable: see `probe_sandbox`.
        StartupError: the worst case of the runs does not fit the memory budget.
    """
    sandbox = await probe_sandbox(mode)
    if sandbox.warning is not None:
        logger.warning("code interpreter: %s", sandbox.warning)
    logger.info("code interpreter sandbox: %s", sandbox.describe(limits))
    budget = plan_budget(
        per_run_bytes=sandbox.bound_bytes(limits),
        bound=sandbox.memory_bound,
        max_concurrent=max_concurrent,
        max_concurrent_per_key=max_concurrent_per_key,
        budget_mb=memory_budget_mb,
    )
    logger.info("code interpreter memory: %s", budget.describe())
    return SandboxReport(sandbox, limits, RunSlots(budget))


async def run_python(code: str, limits: Limits | None = None, *, sandbox: Sandbox) -> RunResult:
    """Run ``code`` under ``limits`` in ``sandbox``.

    Cancellation: everything the run started is killed and reaped before this
    returns.
    """
    limits = limits or Limits()
    if sandbox.bwrap is None:
        return await _run_unsandboxed(code, limits)
    cgroup = None
    if sandbox.cgroups is not None:
        cgroup = sandbox.cgroups.create(
            memory_bytes=limits.memory_bytes, processes=limits.processes
        )
    try:
        return await _run_in_bwrap(code, limits, sandbox.bwrap, cgroup)
    finally:
        if cgroup is not None:
            with trio.CancelScope(shield=True):
                await cgroup.remove()


async def _run_in_bwrap(
    code: str, limits: Limits, bwrap: Bwrap, cgroup: RunCgroup | None
) -> RunResult:
    launcher = _launcher_argv(
        bwrap.runtime.executable, limits, str(SANDBOX_UID) if bwrap.maps_users else "-"
    )
    with _Fds() as fds:
        command = _bwrap_command(
            bwrap, fds, limits, cgroup, code=("main.py", code.encode("utf-8")), launcher=launcher
        )
        # Its own environment ({}) is visible to the sandbox (its pid 1).
        process = Child.start(command.argv, cwd=None, env={}, pass_fds=command.pass_fds)
        for fd in command.pass_fds:
            fds.close(fd)  # bwrap has them now
        result = await _collect(process, limits, release=command.release)
    if isinstance(result, RunResult):
        return result
    text, returncode = result
    # bwrap exits 128 + N when user code died of signal N.
    if 128 < returncode < 128 + signal.NSIG:
        returncode = -(returncode - 128)
    oom = cgroup is not None and cgroup.oom_killed()
    return _verdict(text, returncode, limits, oom_killed=oom)


@dataclass(frozen=True)
class _BwrapCommand:
    """One sandbox's start: bwrap's command line, the descriptors it inherits (to
    close here once it has started), and what lets it go on once started (root
    only: writing its user namespace's maps; None when there is nothing to do)."""

    argv: list[str]
    pass_fds: list[int]
    release: Callable[[], Awaitable[None]] | None


def _bwrap_command(
    bwrap: Bwrap,
    fds: _Fds,
    limits: Limits,
    cgroup: RunCgroup | None,
    *,
    code: tuple[str, bytes],
    launcher: list[str],
    script_path: str = f"{WORK_DIR}/main.py",
    packages: str | None = None,
    own_tmp: bool = False,
    environment: dict[str, str] | None = None,
    host_config: tuple[str, ...] = (),
) -> _BwrapCommand:
    """The command of a sandbox running ``launcher`` on ``code`` (a name and the
    bytes of the script, passed as an anonymous file), under the seccomp filter,
    in ``cgroup`` when there is one. Started from the event loop's thread
    (`Child`): bwrap dies with the thread that started it."""
    code_fd = fds.memfd(*code)
    filter_program = seccomp.program()
    seccomp_fd = None if filter_program is None else fds.memfd("seccomp", filter_program)
    info_w = block_r = None
    release = None
    if bwrap.maps_users:
        info_r, info_w = fds.pipe()
        block_r, block_w = fds.pipe()
        release = partial(_map_users, bwrap, info_r, block_w, fds)
    argv = bwrap.argv(
        disk_bytes=limits.disk_bytes,
        code_fd=code_fd,
        launcher=launcher,
        seccomp_fd=seccomp_fd,
        info_fd=info_w,
        block_fd=block_r,
        script_path=script_path,
        packages=packages,
        own_tmp=own_tmp,
        environment=environment,
        host_config=host_config,
    )
    if cgroup is not None:
        argv = [*cgroup.launch_prefix(), *argv]
    passed = [fd for fd in (code_fd, seccomp_fd, info_w, block_r) if fd is not None]
    return _BwrapCommand(argv, passed, release)


def _scrubbed_environment(home: str) -> dict[str, str]:
    """The whole environment of an unsandboxed run: nothing of the server's."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
    }


async def _run_unsandboxed(code: str, limits: Limits) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="trio-responses-python-") as workdir:
        await trio.Path(workdir, "main.py").write_text(code, encoding="utf-8")
        env = _scrubbed_environment(workdir)
        process = Child.start(
            _launcher_argv(sys.executable, limits, "-"), cwd=workdir, env=env, pass_fds=[]
        )
        result = await _collect(process, limits)
    if isinstance(result, RunResult):
        return result
    text, returncode = result
    return _verdict(text, returncode, limits, oom_killed=False)


async def _collect(
    process: Child,
    limits: Limits,
    *,
    release: Callable[[], Awaitable[None]] | None = None,
) -> RunResult | tuple[str, int]:
    """Collect the run's output and end it; a result when it hit a limit, else
    (output, exit status). ``release``, called at once, lets a waiting bwrap go on."""
    stdout = process.stdout
    output = bytearray()
    truncated = False

    async def collect() -> None:
        nonlocal truncated
        while chunk := await stdout.receive_some(65536):
            room = limits.output_bytes - len(output)
            if len(chunk) > room:
                output.extend(chunk[:room])
                truncated = True
                _kill_group(process.pid)
                return
            output.extend(chunk)

    try:
        with trio.move_on_after(limits.wall_s) as wall:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect)
                if release is not None:
                    await release()
                await process.wait()
                # Whatever it started still holds the pipe open: end them too.
                _kill_group(process.pid)
    finally:
        with trio.CancelScope(shield=True):
            _kill_group(process.pid)
            await process.wait()
            await stdout.aclose()
            process.close()
    text = output.decode("utf-8", errors="replace")
    if truncated:
        text += f"\n[output truncated at {limits.output_bytes} bytes; the process was stopped]"
        return RunResult(text, False, "output limit exceeded")
    if wall.cancelled_caught:
        return RunResult(text, False, f"wall-clock limit of {limits.wall_s:g} s exceeded")
    returncode = process.returncode
    if returncode is None:  # pragma: no cover - reaped above
        raise RuntimeError("the run was not reaped")
    return text, returncode


async def _map_users(bwrap: Bwrap, info_r: int, block_w: int, fds: _Fds) -> None:
    """Write the maps of the run's user namespace, then let bwrap go on."""
    info = bytearray()
    async with trio.lowlevel.FdStream(fds.release(info_r)) as stream:
        while True:
            chunk = await stream.receive_some(4096)
            if not chunk:
                # bwrap failed before it got there; its message is in the output.
                return
            info.extend(chunk)
            with contextlib.suppress(ValueError):
                child = int(json.loads(info)["child-pid"])
                break
    try:
        _write_maps(child, *bwrap.user_namespace_maps())
    except OSError as error:
        # bwrap then fails on its own (it cannot set up as an unmapped user).
        logger.warning("cannot map the sandbox's user namespace: %s", error)
    os.write(block_w, b"1")
    fds.close(block_w)


def _write_maps(pid: int, uid_map: str, gid_map: str) -> None:
    """Two writes to procfs: instant, so done on the event loop."""
    for name, content in (("uid_map", uid_map), ("gid_map", gid_map)):
        with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as file:
            file.write(content)


def _launcher_argv(
    executable: str,
    limits: Limits,
    drop: str,
    *,
    script: str = "main.py",
    cpu_hard: str = "+1",
    args: tuple[str, ...] = (),
) -> list[str]:
    """The launcher's command: ``script`` run with ``args`` under ``limits``, as
    the sandbox user ``drop`` (or as it is: ``-``)."""
    return [
        executable,
        "-I",
        "-S",
        "-c",
        _LAUNCHER,
        str(limits.cpu_s),
        str(limits.memory_bytes),
        str(limits.file_bytes),
        str(limits.processes),
        str(limits.open_files),
        drop,
        script,
        cpu_hard,
        *args,
    ]


def _verdict(text: str, returncode: int, limits: Limits, *, oom_killed: bool) -> RunResult:
    if returncode == 0:
        return RunResult(text, True, None)
    memory = f"memory limit of {limits.memory_bytes // (1024 * 1024)} MiB exceeded"
    if oom_killed:
        return RunResult(text, False, memory)
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL) and "MemoryError" not in text:
        return RunResult(text, False, f"CPU time limit of {limits.cpu_s} s exceeded")
    if "MemoryError" in text:
        return RunResult(text, False, memory)
    if returncode < 0:
        return RunResult(text, False, f"killed by signal {signal.Signals(-returncode).name}")
    return RunResult(text, False, f"exit status {returncode}")


class _Fds:
    """The file descriptors one run opened: each closed once, all by the end."""

    def __init__(self) -> None:
        self._open: set[int] = set()

    def __enter__(self) -> _Fds:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for fd in list(self._open):
            self.close(fd)

    def memfd(self, name: str, content: bytes) -> int:
        """An anonymous file holding ``content``, positioned at its start."""
        fd = self._own(os.memfd_create(name, os.MFD_CLOEXEC))
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def pipe(self) -> tuple[int, int]:
        read, write = os.pipe()
        return self._own(read), self._own(write)

    def release(self, fd: int) -> int:
        """Hand ``fd`` over to a new owner (it is no longer closed here)."""
        self._open.discard(fd)
        return fd

    def close(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def _own(self, fd: int) -> int:
        self._open.add(fd)
        return fd


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
