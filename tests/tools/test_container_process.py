"""A container's long-lived process: state across calls, its files, its limits, and
what it answers when user code turns against the kernel it shares a process with.

Real bubblewrap, but for the unsandboxed test. The escapes are in
``test_container_escapes.py``.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import AsyncIterator

import pytest
import trio

from tests.tools.test_sandbox import host_processes_with, wait_for_processes
from trio_responses.tools.container_process import (
    ContainerProcess,
    ContainerProcessDied,
    ContainerRun,
)
from trio_responses.tools.sandbox import Limits, Sandbox, probe_sandbox

MIB = 1024 * 1024
PACKAGES_ENV = "TRIO_RESPONSES_TEST_PACKAGES"
"""A directory filled by ``scripts/sandbox-packages`` (numpy, pandas, matplotlib)."""


@pytest.fixture
async def bwrap() -> Sandbox:
    return await probe_sandbox("bwrap")


@pytest.fixture
async def container(bwrap: Sandbox) -> AsyncIterator[ContainerProcess]:
    async with ContainerProcess.open(bwrap, Limits(wall_s=20)) as opened:
        yield opened


def alive(pid: int) -> bool:
    """Whether host process ``pid`` exists (a zombie counts: not reaped)."""
    return os.path.exists(f"/proc/{pid}")


async def test_state_persists_between_calls(container: ContainerProcess) -> None:
    first = await container.run("x = 41\ndef double(n):\n    return 2 * n")
    assert first == ContainerRun("", True, None, False, [])
    second = await container.run("print(x + 1)\ndouble(x)")
    assert second.ok and second.logs == "42\n82\n"  # the last expression, shown
    assert (await container.run("y = None\ny")).logs == ""  # None is not shown
    assert (await container.run("import os\nos.getcwd()")).logs == "'/mnt/data'\n"


async def test_an_exception_keeps_the_process_and_its_state(container: ContainerProcess) -> None:
    await container.run("kept = 'still here'")
    failed = await container.run("print('before')\n1 / 0")
    assert not failed.ok and not failed.died
    assert failed.problem == "ZeroDivisionError: division by zero"
    assert failed.logs.startswith("before\nTraceback") and "container_kernel" not in failed.logs
    syntax = await container.run("def (")
    assert not syntax.ok and syntax.problem is not None and "SyntaxError" in syntax.problem
    exited = await container.run("raise SystemExit(3)")
    assert not exited.ok and not exited.died and exited.problem == "SystemExit: 3"
    assert (await container.run("kept")).logs == "'still here'\n"
    assert container.alive


async def test_files_in_and_out(container: ContainerProcess) -> None:
    await container.put_file("data.csv", b"a,b\n1,2\n")
    await container.put_file("sub/dir/x.txt", b"x")
    seen = await container.run(
        "import os\n"
        "print(open('/mnt/data/data.csv').read().split())\n"
        "print(open('sub/dir/x.txt').read())\n"
        "open('/mnt/data/out.txt', 'w').write('written by the code')\n"
        "os.makedirs('made/here')\n"
        "n = open('made/here/y.bin', 'wb').write(bytes(300))"
    )
    assert seen.ok and seen.logs == "['a,b', '1,2']\nx\n", seen
    listed = await container.listing()
    assert sorted(listed) == ["data.csv", "made/here/y.bin", "out.txt", "sub/dir/x.txt"]
    assert listed["made/here/y.bin"].size == 300 and listed["data.csv"].size == 8
    assert listed["out.txt"].mtime_ns > 0
    assert await container.read_file("out.txt", max_bytes=100) == b"written by the code"
    assert await container.read_file("made/here/y.bin", max_bytes=299) is None  # too large
    assert await container.read_file("missing", max_bytes=100) is None
    assert await container.read_file("made", max_bytes=100) is None  # a directory
    await container.remove_file("out.txt")
    await container.remove_file("out.txt")  # already gone: nothing to do
    assert "out.txt" not in await container.listing()
    assert (await container.run("import os\nos.path.exists('out.txt')")).logs == "False\n"
    assert len(await container.listing(max_files=2)) == 2
    for bad in ("/etc/passwd", "../x", "a/../../x", "", "."):
        with pytest.raises(ValueError):
            await container.put_file(bad, b"x")
        with pytest.raises(ValueError):
            await container.read_file(bad, max_bytes=10)
    # The kernel's script is not among the container's files.
    assert "main.py" not in await container.listing()


async def test_links_are_neither_listed_nor_followed(container: ContainerProcess) -> None:
    made = await container.run(
        "import os\n"
        "os.symlink('/etc/passwd', 'passwd')\n"
        "os.symlink('/usr', 'usr')\n"
        "os.mkdir('real')\n"
        "os.symlink('/mnt/data/real', 'linked')\n"
        "open('real/file', 'w').write('r')\n"
        "os.mkfifo('fifo')"
    )
    assert made.ok, made
    assert await container.listing() == {"real/file": (await container.listing())["real/file"]}
    assert await container.read_file("passwd", max_bytes=100_000) is None
    assert await container.read_file("linked/file", max_bytes=100) is None
    assert await container.read_file("fifo", max_bytes=100) is None  # does not block
    assert await container.read_file("usr/bin/env", max_bytes=10**7) is None
    with pytest.raises(OSError):
        await container.put_file("linked/new", b"x")  # not through a link
    assert (await container.run("import os\nos.listdir('real')")).logs == "['file']\n"


async def test_the_wall_clock_limit_kills_the_process(bwrap: Sandbox) -> None:
    async with ContainerProcess.open(bwrap, Limits(wall_s=1)) as container:
        await container.run("x = 1")
        result = await container.run("import time\nprint('sleeping', flush=True)\ntime.sleep(30)")
        assert result.died and not result.ok
        assert result.problem == "wall-clock limit of 1 s exceeded"
        assert result.logs == "sleeping\n"
        assert not container.alive and not alive(container.pid)
        after = await container.run("print(x)")
        assert after.died and not after.ok and after.problem == result.problem
        with pytest.raises(ContainerProcessDied):
            await container.listing()


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        ("x = bytearray(2 * 1024**3)", "memory limit of 256 MiB exceeded"),
        ("while True: pass", "CPU time limit of 1 s exceeded"),
        ("import os\nos._exit(7)", "the container's process died (exit status 7)"),
        (
            "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)",
            "the container's process died (killed by signal SIGTERM)",
        ),
    ],
)
async def test_limits_and_crashes_end_the_process(bwrap: Sandbox, code: str, problem: str) -> None:
    limits = Limits(cpu_s=1, memory_bytes=256 * MIB, wall_s=20)
    async with ContainerProcess.open(bwrap, limits) as container:
        result = await container.run(code)
        assert result.died and not result.ok and result.problem == problem, result
        assert not container.alive


async def test_cpu_time_is_counted_per_call(bwrap: Sandbox) -> None:
    spin = "import time\nend = time.process_time() + 0.7\nwhile time.process_time() < end: pass"
    async with ContainerProcess.open(bwrap, Limits(cpu_s=1, wall_s=20)) as container:
        for _ in range(3):  # 2.1 s in all, each call under its second
            result = await container.run(spin)
            assert result.ok, result


async def test_the_output_limit_kills_the_process(bwrap: Sandbox) -> None:
    async with ContainerProcess.open(bwrap, Limits(output_bytes=1000)) as container:
        assert (await container.run("print('x' * 900)")).ok  # under it
        result = await container.run("import sys\nsys.stdout.write('y' * 10**6)\nimport time")
        assert result.died and result.problem == "output limit exceeded"
        assert result.logs.startswith("y" * 1000)
        assert "[output truncated at 1000 bytes" in result.logs and len(result.logs) < 1200


async def test_the_disk_holds_across_calls(bwrap: Sandbox) -> None:
    write = (
        "import errno\n"
        "try:\n"
        "    with open({name!r}, 'wb') as file:\n"
        "        file.write(b'x' * (10 * 1024 * 1024))\n"
        "    print('written')\n"
        "except OSError as error:\n"
        "    print(error.errno)"
    )
    async with ContainerProcess.open(bwrap, Limits(disk_bytes=16 * MIB)) as container:
        assert (await container.run(write.format(name="first"))).logs == "written\n"
        assert (await container.run(write.format(name="second"))).logs == f"{errno.ENOSPC}\n"
        with pytest.raises(OSError, match="space"):
            await container.put_file("third", b"x" * (10 * MIB))
        await container.remove_file("second")
        await container.remove_file("third")
        await container.put_file("fourth", b"x" * (4 * MIB))
        assert (await container.listing())["fourth"].size == 4 * MIB
        assert container.alive


async def test_processes_left_running_count_for_later_calls(bwrap: Sandbox) -> None:
    marker = f"left-running-{secrets.token_hex(6)}"
    async with ContainerProcess.open(bwrap, Limits(processes=8, wall_s=20)) as container:
        started = await container.run(
            "import subprocess, sys\n"
            "kept = [subprocess.Popen([sys.executable, '-c', 'import time; print(flush=True);"
            f" time.sleep(120)', {marker!r}], stdout=subprocess.PIPE) for _ in range(5)]\n"
            "[process.stdout.readline() for process in kept]\n"  # each one is running
            "len(kept)"
        )
        assert started.ok and started.logs == "5\n"
        assert len(host_processes_with(marker)) == 5
        forked = await container.run(
            "import os, time\n"
            "count = 0\n"
            "try:\n"
            "    for _ in range(20):\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(60)\n"
            "            os._exit(0)\n"
            "        count += 1\n"
            "except OSError as error:\n"
            "    print(error.errno)\n"
            "count"
        )
        assert forked.ok and forked.logs.split() == [str(errno.EAGAIN), forked.logs.split()[1]]
        assert int(forked.logs.split()[1]) <= 2  # 8 - the kernel - 5 kept
    assert host_processes_with(marker) == []


async def test_cancelling_a_call_kills_and_reaps_the_process(bwrap: Sandbox) -> None:
    marker = f"cancelled-{secrets.token_hex(6)}"
    async with ContainerProcess.open(bwrap, Limits(wall_s=60)) as container:
        code = (
            "import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)',"
            f" {marker!r}])\n"
            "time.sleep(60)"
        )
        with trio.move_on_after(2) as scope:
            await container.run(code)
        assert scope.cancelled_caught
        assert not container.alive
        assert not alive(container.pid)  # killed and reaped before run returned
        assert host_processes_with(marker) == []
        assert (await container.run("1")).died


async def test_closing_leaves_nothing_behind(bwrap: Sandbox) -> None:
    marker = f"closed-{secrets.token_hex(6)}"
    async with ContainerProcess.open(bwrap, Limits()) as container:
        await container.run(
            "import os, subprocess, sys\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)',"
            f" {marker!r}])"
        )
        assert await wait_for_processes(marker, running=True)
        pid = container.pid
    assert not alive(pid)
    assert host_processes_with(marker) == []


@pytest.mark.parametrize(
    "attack",
    [
        # A frame larger than any answer.
        "os.write(reply_fd, b'\\xff' * 64)",
        # A frame of the right size, not JSON.
        "os.write(reply_fd, (5).to_bytes(4, 'big') + b'abcde')",
        # JSON that answers no request.
        "os.write(reply_fd, (9).to_bytes(4, 'big') + b'{\"id\":1}')",
        # An answer cut short, then nothing.
        "os.write(reply_fd, (100).to_bytes(4, 'big') + b'{')",
        # The kernel's answers silenced.
        "os.close(reply_fd)",
        # Requests stolen from the kernel.
        "os.close(request_fd)",
        # A huge line on stdout, no newline.
        "os.write(1, b'z' * (4 * 1024 * 1024))",
        # The marker's writer silenced.
        "os.close(1)",
    ],
)
async def test_hostile_replies_fail_cleanly(bwrap: Sandbox, attack: str) -> None:
    async with ContainerProcess.open(bwrap, Limits(wall_s=5)) as container:
        result = await container.run(
            f"import os, sys\nrequest_fd, reply_fd = int(sys.argv[1]), int(sys.argv[2])\n{attack}"
        )
        if result.ok:  # the kernel answered this call before it noticed: the next one fails
            result = await container.run("print('next')")
        assert not result.ok and result.died, result
        assert result.problem is not None
        assert not container.alive and not alive(container.pid)
        with pytest.raises(ContainerProcessDied):
            await container.read_file("x", max_bytes=10)


async def test_garbage_between_calls_ends_the_process_cleanly(bwrap: Sandbox) -> None:
    async with ContainerProcess.open(bwrap, Limits(wall_s=5)) as container:
        started = await container.run(
            "import os, sys, threading, time\n"
            "def later():\n"
            "    time.sleep(0.5)\n"
            "    os.write(int(sys.argv[2]), b'\\x00\\x00\\x00\\x02{}')\n"
            "threading.Thread(target=later).start()"
        )
        assert started.ok
        await trio.sleep(1)
        result = await container.run("print('next')")
        assert result.died and result.problem is not None
        assert "malformed" in result.problem


async def test_code_that_utf_8_cannot_hold_fails_as_python_does(
    container: ContainerProcess,
) -> None:
    result = await container.run("x = '\udc80'\nlen(x)")
    assert not result.ok and not result.died
    assert result.problem is not None and result.problem.startswith("UnicodeEncodeError")
    assert (await container.run("1 + 1")).logs == "2\n"


async def test_unsandboxed_mode_runs_the_same_kernel() -> None:
    async with ContainerProcess.open(Sandbox.unsandboxed(), Limits()) as container:
        await container.put_file("in.txt", b"data")
        result = await container.run(
            "import os\nx = open('in.txt').read()\nopen('out.txt', 'w').write(x * 2)\nx"
        )
        assert result.ok and result.logs == "'data'\n"
        assert await container.read_file("out.txt", max_bytes=100) == b"datadata"
        assert sorted(await container.listing()) == ["in.txt", "out.txt"]
        assert (await container.run("print(x)")).logs == "data\n"


async def test_the_process_can_be_used_from_several_tasks(container: ContainerProcess) -> None:
    """Calls and file operations queue up (one at a time)."""
    results: list[ContainerRun] = []

    async def call(n: int) -> None:
        results.append(await container.run(f"import time\ntime.sleep(0.1)\nprint({n})"))

    async with trio.open_nursery() as nursery:
        for n in range(4):
            nursery.start_soon(call, n)
        nursery.start_soon(container.put_file, "f", b"x")
    assert sorted(result.logs for result in results) == ["0\n", "1\n", "2\n", "3\n"]
    assert "f" in await container.listing()


needs_packages = pytest.mark.skipif(
    not os.environ.get(PACKAGES_ENV),
    reason=f"{PACKAGES_ENV} is not set (fill a directory with scripts/sandbox-packages DIR)",
)


@needs_packages
async def test_matplotlib_figures_and_pandas(bwrap: Sandbox) -> None:
    packages = os.environ[PACKAGES_ENV]
    async with ContainerProcess.open(bwrap, Limits(wall_s=60), packages=packages) as container:
        shown = await container.run(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nprint('shown')"
        )
        assert shown.ok, shown
        assert len(shown.figures) == 1 and shown.figures[0].startswith(b"\x89PNG\r\n\x1a\n")
        assert shown.logs == "shown\n"  # no complaint (fontconfig's, matplotlib's)
        # Figures left open at the end of a call are kept (and closed) too.
        left = await container.run("plt.figure()\nplt.plot([3, 1])\nplt.figure()\nplt.plot([1])")
        assert len(left.figures) == 2 and left.ok
        assert (await container.run("plt.get_fignums()")).logs == "[]\n"
        many = await container.run("for n in range(10):\n    plt.figure()\n    plt.plot([n])")
        assert len(many.figures) == 8 and many.logs.count("[figure dropped") == 2
        await container.put_file("data.csv", b"name,value\na,1\nb,2\nc,3\n")
        summed = await container.run(
            "import pandas as pd\ndf = pd.read_csv('/mnt/data/data.csv')\nint(df['value'].sum())"
        )
        assert summed.ok and summed.logs.endswith("6\n"), summed
        assert "data.csv" in await container.listing()
        assert not any(name.startswith(".") for name in await container.listing())


async def test_a_container_outlives_the_thread_that_started_it(bwrap: Sandbox) -> None:
    # Trio ends an idle worker thread after 10 s; a sandbox tied to the thread that
    # started it (bwrap's --die-with-parent) would die with it. Waiting that long
    # is the point of this test.
    async with ContainerProcess.open(bwrap, Limits()) as container:
        await container.run("x = 41")
        await trio.sleep(12)
        again = await container.run("print(x + 1)")
        assert (again.logs, again.ok, container.alive) == ("42\n", True, True)
