"""User code trying to get out of a container, and failing.

The escapes of ``test_sandbox_escapes.py``, each run as a call in a long-lived
`ContainerProcess` (real bubblewrap) instead of a fresh run, where the code
shares its process with the kernel and has the kernel's control channel at
hand; plus what only containers have: two of them side by side. After each
escape the container still answers.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import secrets
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from tests.tools.test_sandbox import wait_for_processes
from tests.tools.test_sandbox_escapes import (
    KEYRING_CODE,
    MARKER_ENV,
    SOURCE,
    TABLE,
    needs_filter,
    socket_attempts,
)
from trio_responses.tools.container_process import ContainerProcess
from trio_responses.tools.sandbox import Limits, Sandbox, probe_sandbox

MIB = 1024 * 1024
LIMITS = Limits(cpu_s=10, wall_s=60, disk_bytes=16 * MIB, memory_bytes=256 * MIB)


@pytest.fixture
async def bwrap() -> Sandbox:
    return await probe_sandbox("bwrap")


@pytest.fixture
async def container(bwrap: Sandbox) -> AsyncIterator[ContainerProcess]:
    async with ContainerProcess.open(bwrap, LIMITS) as opened:
        await opened.run("state = 'kept'")
        yield opened
        # Whatever the escape did, the container goes on (or says it died).
        after = await opened.run("print(state)")
        assert after.logs == "kept\n" and after.ok, after


async def report(container: ContainerProcess, code: str) -> Any:
    """Run ``code``; the JSON it printed last."""
    result = await container.run(code)
    assert result.ok, result
    return json.loads(result.logs.strip().splitlines()[-1])


@pytest.fixture
async def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    """A secret in the host's environment (where an API key would be)."""
    value = f"secret-{secrets.token_hex(12)}"
    monkeypatch.setenv(MARKER_ENV, value)
    return value


async def test_cannot_read_host_files_or_the_servers_secrets(
    marker: str, container: ContainerProcess
) -> None:
    targets = [
        "/etc/passwd",
        "/etc/shadow",
        "/proc/1/environ",
        f"/proc/{os.getpid()}/environ",
        f"/proc/{os.getpid()}/cmdline",
        f"/proc/{container.pid}/environ",
        str(SOURCE),
        str(SOURCE.parent / "_config.py"),
        str(pathlib.Path(sys.executable).parent / "activate"),
    ]
    found = await report(
        container,
        "import glob, json\n"
        f"secret = {marker[:10]!r} + {marker[10:]!r}\n"
        "report = {}\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        with open(path, 'rb') as file:\n"
        "            report[path] = 'read: ' + file.read(40).decode(errors='replace')\n"
        "    except OSError as error:\n"
        "        report[path] = type(error).__name__\n"
        "report['environ'] = []\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        if secret.encode() in open(path, 'rb').read():\n"
        "            report['environ'].append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(json.dumps(report))",
    )
    assert found.pop("environ") == []
    assert not any(outcome.startswith("read") for outcome in found.values()), found


async def test_cannot_write_outside_its_directories(
    container: ContainerProcess, tmp_path: pathlib.Path
) -> None:
    name = f"written-by-a-container-{secrets.token_hex(6)}"
    targets = [
        tmp_path / name,
        SOURCE.parent / f"{name}.py",
        pathlib.Path("/usr/lib", name),
        pathlib.Path("/etc", name),
        pathlib.Path("/root", name),
        pathlib.Path("/", name),
        pathlib.Path("/dev/shm", name),
        pathlib.Path("/opt/kernel/main.py"),  # the kernel's own script
    ]
    try:
        found = await report(
            container,
            "import json\n"
            "report = {}\n"
            f"for path in {[str(target) for target in targets]!r}:\n"
            "    try:\n"
            "        with open(path, 'w') as file:\n"
            "            file.write('x')\n"
            "        report[path] = 'written'\n"
            "    except OSError as error:\n"
            "        report[path] = type(error).__name__\n"
            "print(json.dumps(report))",
        )
        assert "written" not in found.values(), found
        assert not [target for target in targets[:-1] if target.exists()]
    finally:
        for target in targets[:-1]:
            target.unlink(missing_ok=True)


async def test_cannot_reach_host_sockets(
    container: ContainerProcess, tmp_path: pathlib.Path
) -> None:
    tcp = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    await tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    port = tcp.getsockname()[1]
    unix_path = str(tmp_path / "host.sock")
    abstract = f"\0trio-responses-test-{secrets.token_hex(6)}"
    listeners = [tcp]
    for address in (unix_path, abstract):
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await listener.bind(address)
        listener.listen()
        listeners.append(listener)
    try:
        found = await report(
            container,
            "import json, socket\n"
            "report = {}\n"
            f"for name, family, address in (('tcp', socket.AF_INET, ('127.0.0.1', {port})),"
            f" ('unix', socket.AF_UNIX, {unix_path!r}), ('abstract', socket.AF_UNIX,"
            f" {abstract!r})):\n"
            "    sock = socket.socket(family, socket.SOCK_STREAM)\n"
            "    sock.settimeout(5)\n"
            "    try:\n"
            "        sock.connect(address)\n"
            "        report[name] = 'connected'\n"
            "    except OSError as error:\n"
            "        report[name] = type(error).__name__\n"
            "print(json.dumps(report))",
        )
        assert "connected" not in found.values(), found
        for listener in listeners:
            with trio.move_on_after(0.1) as nobody:
                await listener.accept()
            assert nobody.cancelled_caught
    finally:
        for listener in listeners:
            listener.close()


async def test_cannot_signal_host_processes(container: ContainerProcess) -> None:
    victim = await trio.lowlevel.open_process(["sleep", "60"])
    try:
        targets = {"test": os.getpid(), "bwrap": container.pid, "victim": victim.pid}
        found = await report(
            container,
            "import json, os\n"
            "report = {}\n"
            f"for name, pid in {targets!r}.items():\n"
            "    try:\n"
            "        os.kill(pid, 0 if name != 'victim' else 9)\n"
            "        report[name] = 'signalled'\n"
            "    except OSError as error:\n"
            "        report[name] = type(error).__name__\n"
            "print(json.dumps(report))",
        )
        assert set(found.values()) == {"ProcessLookupError"}, found
        assert victim.poll() is None
    finally:
        victim.kill()
        with trio.CancelScope(shield=True):
            await victim.wait()


async def test_a_double_forked_session_leader_does_not_outlive_the_container(
    bwrap: Sandbox,
) -> None:
    marker = f"escapee-{secrets.token_hex(8)}"
    async with ContainerProcess.open(bwrap, LIMITS) as container:
        result = await container.run(
            "import os, sys, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        os.closerange(0, 1024)\n"  # not even holding the output open
            "        os.execv(sys.executable, [sys.executable, '-c', 'import time;"
            f" time.sleep(120)', {marker!r}])\n"
            "    os._exit(0)\n"
            "time.sleep(0.5)"
        )
        assert result.ok, result
        assert await wait_for_processes(marker, running=True)  # it did start
    assert await wait_for_processes(marker, running=False) == []


async def test_a_fork_bomb_stops_at_the_process_limit(container: ContainerProcess) -> None:
    found = await report(
        container,
        "import json, os, time\n"
        "started, error = 0, None\n"
        "try:\n"
        "    for _ in range(500):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        started += 1\n"
        "except OSError as failure:\n"
        "    error = failure.errno\n"
        "print(json.dumps({'started': started, 'error': error}))",
    )
    assert found["error"] == errno.EAGAIN and found["started"] < LIMITS.processes


async def test_children_cannot_together_exceed_the_memory_bound(
    bwrap: Sandbox, container: ContainerProcess
) -> None:
    found = await report(
        container,
        "import json, os\n"
        "go_r, go_w = os.pipe()\n"
        "done_r, done_w = os.pipe()\n"
        "children = 0\n"
        "for _ in range(16):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        os.read(go_r, 1)\n"
        "        try:\n"
        "            held = b'\\x01' * (200 * 1024 * 1024)\n"
        "            os.write(done_w, b'y')\n"
        "        except MemoryError:\n"
        "            os.write(done_w, b'n')\n"
        "        os.read(go_r, 1)\n"
        "        os._exit(0)\n"
        "    children += 1\n"
        "os.write(go_w, b'g' * children)\n"
        "answers = b''\n"
        "while len(answers) < children:\n"
        "    answers += os.read(done_r, 16)\n"
        "os.write(go_w, b'e' * children)\n"
        "print(json.dumps({'children': children, 'holding': answers.count(b'y')}))",
    )
    bound = bwrap.bound_bytes(LIMITS)
    assert bound is not None and found["holding"] * 200 * MIB <= bound


async def test_the_data_dir_cannot_grow_past_its_size(container: ContainerProcess) -> None:
    found = await report(
        container,
        "import json\n"
        "written, error = 0, None\n"
        "try:\n"
        "    for n in range(40):\n"
        "        with open(f'fill-{n}', 'wb') as file:\n"
        "            file.write(b'x' * (1024 * 1024))\n"
        "            file.flush()\n"
        "        written += 1024 * 1024\n"
        "except OSError as failure:\n"
        "    error = failure.errno\n"
        "print(json.dumps({'written': written, 'error': error}))",
    )
    assert found["error"] == errno.ENOSPC and found["written"] <= LIMITS.disk_bytes


async def test_no_memory_outside_the_limits_and_no_nested_namespaces(
    container: ContainerProcess,
) -> None:
    found = await report(
        container,
        "import ctypes, json, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "report = {}\n"
        "try:\n"
        "    os.memfd_create('hoard')\n"
        "    report['memfd'] = 'created'\n"
        "except OSError as error:\n"
        "    report['memfd'] = error.errno\n"
        "segment = libc.shmget(0, 64 * 1024 * 1024, 0o1000 | 0o600)\n"
        "report['shmget'] = 'created' if segment >= 0 else ctypes.get_errno()\n"
        "queue = libc.msgget(0, 0o1000 | 0o600)\n"
        "report['msgget'] = 'created' if queue >= 0 else ctypes.get_errno()\n"
        "for name, flags in (('user', 0x10000000), ('mount', 0x00020000)):\n"
        "    report[name] = 'unshared' if libc.unshare(flags) == 0 else ctypes.get_errno()\n"
        "print(json.dumps(report))",
    )
    assert found["memfd"] == found["shmget"] == found["msgget"] == errno.EPERM
    assert found["user"] in (errno.ENOSPC, errno.EPERM) and found["mount"] == errno.EPERM


@needs_filter
async def test_only_unix_and_inet_sockets(container: ContainerProcess) -> None:
    families = {"vsock": 40, "netlink": 16, "packet": 17}
    assert await report(container, socket_attempts(families)) == dict.fromkeys(
        families, errno.EAFNOSUPPORT
    )


@needs_filter
async def test_the_kernel_keyring_and_io_uring_are_out_of_reach(
    container: ContainerProcess,
) -> None:
    assert TABLE is not None
    code = KEYRING_CODE.format(
        numbers=TABLE.keyring, description=f"left-by-a-container-{secrets.token_hex(6)}"
    )
    assert set((await report(container, code)).values()) == {-errno.EPERM}
    setup = TABLE.io_uring[0]
    found = await report(
        container,
        "import ctypes, json\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(120)\n"
        f"result = libc.syscall({setup}, 8, params)\n"
        "print(json.dumps(result if result >= 0 else ctypes.get_errno()))",
    )
    assert found == errno.ENOSYS


async def test_host_wide_proc_files_are_masked(container: ContainerProcess) -> None:
    masked = ["/proc/stat", "/proc/loadavg", "/proc/meminfo", "/proc/cmdline", "/proc/uptime"]
    found = await report(
        container,
        "import json\n"
        "report = {}\n"
        f"for path in {masked!r}:\n"
        "    try:\n"
        "        report[path] = len(open(path, 'rb').read())\n"
        "    except OSError as error:\n"
        "        report[path] = type(error).__name__\n"
        "print(json.dumps(report))",
    )
    assert found == dict.fromkeys(masked, "PermissionError")


async def test_two_containers_see_neither_files_nor_processes_of_the_other(
    bwrap: Sandbox,
) -> None:
    marker = f"neighbour-{secrets.token_hex(8)}"
    async with (
        ContainerProcess.open(bwrap, LIMITS) as first,
        ContainerProcess.open(bwrap, LIMITS) as second,
    ):
        await first.put_file("mine.txt", b"first's")
        started = await first.run(
            "import subprocess, sys\n"
            "open('/tmp/scratch', 'w').write('first')\n"
            "kept = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)',"
            f" {marker!r}])\n"
            "kept.pid"
        )
        assert started.ok, started
        looked = await report(
            second,
            "import glob, json, os\n"
            "seen = []\n"
            "for path in glob.glob('/proc/[0-9]*/cmdline'):\n"
            "    try:\n"
            f"        if {marker!r}.encode() in open(path, 'rb').read():\n"
            "            seen.append(path)\n"
            "    except OSError:\n"
            "        pass\n"
            "print(json.dumps({'files': os.listdir('/mnt/data'), 'tmp': os.listdir('/tmp'),"
            " 'processes': seen, 'pids': len(glob.glob('/proc/[0-9]*'))}))",
        )
        assert looked == {"files": [], "tmp": [], "processes": [], "pids": looked["pids"]}
        assert looked["pids"] <= 3  # bwrap's init, the kernel (and at most a helper)
        assert await second.listing() == {}
        assert await second.read_file("mine.txt", max_bytes=100) is None
        assert await first.read_file("mine.txt", max_bytes=100) == b"first's"
