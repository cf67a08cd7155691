"""Run untrusted Python code in a fresh, limited child process.

Each run gets: a new ``python -I`` process (isolated mode: no user site, no
PYTHON* variables), a temporary working directory removed afterwards, an
environment with nothing but PATH/HOME/TMPDIR/LANG, resource limits set by a
tiny launcher before it execs the interpreter (CPU seconds, address space,
file size, no core dumps), a wall-clock timeout, and a cap on the output
collected. The process runs in its own session and the whole group is killed
at the end, so nothing it forks survives.

This is a sandbox in the resource sense, not a security boundary against a
determined attacker (the child can still read the filesystem and use the
network); run the tool server in a container when that matters.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import trio

# Sets the limits, then replaces itself with the interpreter running main.py
# (unbuffered, so stdout and stderr interleave as the code wrote them).
_LAUNCHER = """\
import os, resource, sys
cpu, memory, fsize = (int(v) for v in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(sys.executable, [sys.executable, "-I", "-u", "main.py"])
"""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 10
    """CPU seconds before the kernel stops the process (SIGXCPU)."""
    memory_bytes: int = 512 * 1024 * 1024
    """Address space; a larger allocation fails with MemoryError."""
    file_bytes: int = 16 * 1024 * 1024
    """Largest file the code may write."""
    wall_s: float = 30.0
    """Wall-clock time before the process group is killed."""
    output_bytes: int = 64 * 1024
    """Output kept (stdout and stderr interleaved); the rest is dropped."""


@dataclass(frozen=True)
class RunResult:
    output: str
    """stdout and stderr as the process wrote them (possibly truncated)."""
    ok: bool
    """True when the code ran to the end and exited 0."""
    problem: str | None
    """Why it is not ok: the exit status, the limit it hit, the signal."""


async def run_python(code: str, limits: Limits | None = None) -> RunResult:
    """Run ``code`` under ``limits``.

    Cancellation: the process group is killed and reaped before this returns.
    """
    limits = limits or Limits()
    with tempfile.TemporaryDirectory(prefix="trio-responses-python-") as workdir:
        await trio.Path(workdir, "main.py").write_text(code, encoding="utf-8")
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
        }
        process = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-I",
                "-c",
                _LAUNCHER,
                str(limits.cpu_s),
                str(limits.memory_bytes),
                str(limits.file_bytes),
            ],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        stdout = process.stdout
        assert stdout is not None
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
                    await process.wait()
                    # Whatever it started still holds the pipe open: end them too.
                    _kill_group(process.pid)
        finally:
            with trio.CancelScope(shield=True):
                _kill_group(process.pid)
                await process.wait()
                await stdout.aclose()
    text = output.decode("utf-8", errors="replace")
    if truncated:
        text += f"\n[output truncated at {limits.output_bytes} bytes; the process was stopped]"
        return RunResult(text, False, "output limit exceeded")
    if wall.cancelled_caught:
        return RunResult(text, False, f"wall-clock limit of {limits.wall_s:g} s exceeded")
    assert process.returncode is not None  # reaped above
    return _verdict(text, process.returncode, limits)


def _verdict(text: str, returncode: int, limits: Limits) -> RunResult:
    if returncode == 0:
        return RunResult(text, True, None)
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL) and "MemoryError" not in text:
        return RunResult(text, False, f"CPU time limit of {limits.cpu_s} s exceeded")
    if "MemoryError" in text:
        return RunResult(
            text, False, f"memory limit of {limits.memory_bytes // (1024 * 1024)} MiB exceeded"
        )
    if returncode < 0:
        return RunResult(text, False, f"killed by signal {signal.Signals(-returncode).name}")
    return RunResult(text, False, f"exit status {returncode}")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
