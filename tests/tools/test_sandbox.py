"""The python sandbox: fresh process, scrubbed environment, limits, nothing left behind.

Each behaviour is checked in both modes, bubblewrap and ``none`` (limits only);
what only bubblewrap protects against is in ``test_sandbox_escapes.py``.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import subprocess
import sys

import pytest
import trio

from tests.conftest import StartServer
from tests.processes import ServeCommand
from trio_responses import Config, open_responses_service
from trio_responses.tools.sandbox import (
    Limits,
    Sandbox,
    SandboxUnavailable,
    probe_sandbox,
    run_python,
)


@pytest.fixture(params=["bwrap", "none"])
async def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return await probe_sandbox(request.param)


def host_processes_with(marker: str) -> list[int]:
    """Pids of host processes whose command line contains ``marker`` (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if marker.encode() not in cmdline.read():
                    continue
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                if stat.read().rpartition(")")[2].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


async def wait_for_processes(marker: str, *, running: bool, within: float = 30) -> list[int]:
    """``host_processes_with(marker)`` once some are (or none are) ``running``.

    A process that has just been started can read as an empty command line for a
    moment (exec has not set it up yet), and one just killed is not reaped at once;
    this waits that out, bounded generously, and returns what it then sees.
    """
    with trio.move_on_after(within):
        while bool(host_processes_with(marker)) != running:  # noqa: ASYNC110 (processes: no event)
            await trio.sleep(0.05)
    return host_processes_with(marker)


async def test_runs_code_isolated_with_a_scrubbed_environment(
    monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    result = await run_python(
        "import json, os, sys\n"
        "open('left-behind', 'w').write('x')\n"
        "print(json.dumps({'env': sorted(os.environ), 'cwd': os.getcwd(),"
        " 'isolated': sys.flags.isolated}))",
        sandbox=sandbox,
    )
    assert result.ok and result.problem is None
    report = json.loads(result.output)
    assert "SECRET_TOKEN" not in report["env"]
    allowed = {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONIOENCODING", "LC_CTYPE", "PWD"}
    assert set(report["env"]) <= allowed
    assert report["isolated"] == 1
    if sandbox.mode == "bwrap":
        assert report["cwd"] == "/mnt/data"  # a tmpfs of the run, not a host directory
    # Whatever it wrote is gone with it.
    assert not await trio.Path(report["cwd"], "left-behind").exists()


async def test_stderr_is_interleaved_and_failures_say_why(sandbox: Sandbox) -> None:
    result = await run_python(
        "print('out')\nimport sys\nprint('err', file=sys.stderr)\n1/0", sandbox=sandbox
    )
    assert not result.ok and result.problem == "exit status 1"
    assert result.output.startswith("out\nerr\n") and "ZeroDivisionError" in result.output


async def test_output_is_capped(sandbox: Sandbox) -> None:
    result = await run_python("print('x' * 200_000)", Limits(output_bytes=1000), sandbox=sandbox)
    assert not result.ok and result.problem == "output limit exceeded"
    assert len(result.output) < 1200 and "[output truncated at 1000 bytes" in result.output


async def test_wall_clock_limit(sandbox: Sandbox) -> None:
    result = await run_python("import time\ntime.sleep(30)", Limits(wall_s=0.5), sandbox=sandbox)
    assert not result.ok and result.problem == "wall-clock limit of 0.5 s exceeded"


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        ("while True: pass", "CPU time limit of 1 s exceeded"),
        ("x = bytearray(2 * 1024**3)", "memory limit of 256 MiB exceeded"),
        ("raise SystemExit(3)", "exit status 3"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", "killed by signal SIGTERM"),
    ],
)
async def test_limits_say_which_one_was_hit(sandbox: Sandbox, code: str, problem: str) -> None:
    result = await run_python(
        code, Limits(cpu_s=1, memory_bytes=256 * 1024 * 1024), sandbox=sandbox
    )
    assert not result.ok and result.problem == problem


async def test_nothing_it_starts_survives(sandbox: Sandbox) -> None:
    marker = f"sandbox-test-{secrets.token_hex(8)}"
    result = await run_python(
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
        "print('started', flush=True)",
        Limits(wall_s=20),
        sandbox=sandbox,
    )
    assert result.ok and result.output == "started\n"
    # Killed at once (not after the wall-clock limit): at most a zombie awaiting its reaper.
    assert host_processes_with(marker) == []


async def test_a_run_outlives_the_thread_that_started_it() -> None:
    # Trio ends an idle worker thread after 10 s; a sandbox tied to the thread that
    # started it (bwrap's --die-with-parent) would be killed then, and the run
    # reported as over its CPU limit. Waiting that long is the point of this test.
    result = await run_python(
        "import time\ntime.sleep(12)\nprint('done')",
        Limits(wall_s=60),
        sandbox=await probe_sandbox("bwrap"),
    )
    assert (result.ok, result.output, result.problem) == (True, "done\n", None)


async def test_the_process_count_is_limited() -> None:
    # Bubblewrap only: the kernel ignores RLIMIT_NPROC for root outside a user namespace.
    result = await run_python(
        "import os, time\n"
        "started = 0\n"
        "try:\n"
        "    for _ in range(100):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        started += 1\n"
        "except OSError as error:\n"
        "    print(error.errno)\n"
        "print(started)",
        Limits(processes=10, wall_s=20),
        sandbox=await probe_sandbox("bwrap"),
    )
    assert result.ok
    errno_line, started = result.output.split()
    assert errno_line == "11"  # EAGAIN
    assert int(started) < 10


async def test_bwrap_adds_little_to_a_run() -> None:
    """The cost of the sandbox per run, measured against a run without it."""
    bwrap, none = await probe_sandbox("bwrap"), await probe_sandbox("none")
    costs: dict[str, float] = {}
    for sandbox in (bwrap, none, bwrap, none):
        start = trio.current_time()
        result = await run_python("print(1)", sandbox=sandbox)
        assert result.output == "1\n"
        elapsed = trio.current_time() - start
        costs[sandbox.mode] = min(costs.get(sandbox.mode, elapsed), elapsed)
    print(f"per run: bwrap {costs['bwrap'] * 1000:.0f} ms, none {costs['none'] * 1000:.0f} ms")
    # Generous: about 20 ms on an idle 2-core box.
    assert costs["bwrap"] - costs["none"] < 1.0


# -- start-up ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "bwrap"])
async def test_without_bubblewrap_the_code_interpreter_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, mode: str
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap there
    with pytest.raises(SandboxUnavailable) as refused:
        async with open_responses_service(
            Config(code_interpreter=True, python_sandbox=mode)  # type: ignore[arg-type]
        ):
            pytest.fail("the service started")
    message = str(refused.value)
    assert "apt-get install bubblewrap" in message
    assert "--python-sandbox none" in message


async def test_a_bwrap_that_does_not_work_is_refused(tmp_path: pathlib.Path) -> None:
    fake = trio.Path(tmp_path, "bwrap")
    await fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\n")
    await fake.chmod(0o755)
    with pytest.raises(SandboxUnavailable, match=r"does not work here.*Permission denied"):
        await probe_sandbox("auto", bwrap=str(fake))


async def test_the_serve_command_exits_with_the_refusal(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    server = await ServeCommand.start(nursery, "--code-interpreter", ready=False)
    assert await server.wait(timeout_s=60) == 1
    log = server.log.decode()
    assert "cannot start the code interpreter" in log and "apt-get install bubblewrap" in log
    assert "listening on" not in log


async def test_the_tool_server_command_exits_with_the_refusal(tmp_path: pathlib.Path) -> None:
    command = [sys.executable, "-m", "trio_responses", "tool-server", "python", "--port", "0"]
    with trio.fail_after(60):
        finished = await trio.run_process(
            [*command, "--bwrap", str(tmp_path / "missing-bwrap")],
            capture_stderr=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    assert finished.returncode == 1
    assert b"apt-get install bubblewrap" in finished.stderr
    assert b"--sandbox none" in finished.stderr


async def test_health_shows_the_sandbox(start_server: StartServer) -> None:
    server = await start_server(code_interpreter=True, python_processes=8, python_memory_mb=256)
    sandbox = (await server.http.get("/health")).json()["sandbox"]
    assert sandbox["mode"] == "bwrap" and sandbox["warning"] is None
    assert sandbox["version"].startswith("bubblewrap ")
    mib = 1024 * 1024
    if sandbox["memory_bound"] == "rlimit":
        assert sandbox["memory_bound_bytes"] == 8 * 256 * mib + 64 * mib
    else:
        assert sandbox["memory_bound"] == "cgroup"
        assert sandbox["memory_bound_bytes"] == 256 * mib
    plain = await start_server()
    assert (await plain.http.get("/health")).json()["sandbox"] is None


async def test_none_warns_in_health(start_server: StartServer) -> None:
    server = await start_server(code_interpreter=True, python_sandbox="none")
    sandbox = (await server.http.get("/health")).json()["sandbox"]
    assert sandbox["mode"] == "none" and sandbox["bwrap"] is None
    assert "WITHOUT a sandbox" in sandbox["warning"]
    assert sandbox["memory_bound"] == "per-process" and sandbox["memory_bound_bytes"] is None
    response = await server.client.responses.create(
        model="gpt-oss-scripted",
        input="```python\nprint('unsandboxed')\n```",
        tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
    )
    assert response.output_text == "Tool result: unsandboxed\n"
