"""User code trying to get out of the code interpreter's sandbox, and failing.

Every attempt goes the way a user's would: a request to the server whose model
(the scripted engine) runs the code in the response's container, a sandboxed
process the server runs. Each test checks what the code could do, from inside
(its own report) and from the host (files, processes, sockets), and that the
server still answers and runs code.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import platform
import re
import secrets
import socket
import subprocess
import sys
from typing import Any

import pytest
import trio

import trio_responses
from tests.conftest import StartServer
from tests.support import MODEL, Server
from tests.tools.test_sandbox import host_processes_with
from trio_responses.tools import seccomp
from trio_responses.tools.session import McpSession
from trio_responses.tools.transport import connect_to

TOOLS = [{"type": "code_interpreter", "container": {"type": "auto"}}]
MIB = 1024 * 1024
MARKER_ENV = "TRIO_RESPONSES_TEST_SECRET"
SOURCE = pathlib.Path(trio_responses.__file__).resolve()
"""The server's own source (its package's ``__init__.py``)."""
TABLE = seccomp.TABLES.get(platform.machine())
"""This machine's system call numbers, or None where the sandbox has no filter."""
needs_filter = pytest.mark.skipif(
    TABLE is None, reason=f"no seccomp filter for {platform.machine()}"
)


@pytest.fixture
async def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    """A secret in the server's environment (where an API key would be)."""
    value = f"secret-{secrets.token_hex(12)}"
    monkeypatch.setenv(MARKER_ENV, value)
    return value


@pytest.fixture
async def server(start_server: StartServer, marker: str) -> Server:
    return await start_server(
        code_interpreter=True,
        python_cpu_s=10,
        python_wall_s=60,
        python_disk_mb=16,
    )


async def run_code(server: Server, code: str) -> tuple[str, str]:
    """Run ``code`` through the server's code interpreter: (call status, its logs).

    Then checks that the server still answers and runs code.
    """
    if "```" in code:
        raise ValueError("the code would end the scripted model's python block")
    response = await server.client.responses.create(
        model=MODEL,
        input=f"```python\n{code}\n```",
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert response.status == "completed"
    call = next(item for item in response.output if item.type == "code_interpreter_call")
    assert call.outputs is not None
    logs: str = call.outputs[0].logs  # type: ignore[union-attr]
    alive = await server.client.responses.create(
        model=MODEL,
        input="```python\nprint('alive')\n```",
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert alive.output_text == "Tool result: alive\n"
    health = (await server.http.get("/health")).json()
    assert health["sandbox"]["mode"] == "bwrap" and health["containers"]["live"] >= 1
    return call.status, logs


def report_of(logs: str) -> Any:
    """The JSON the code printed last."""
    return json.loads(logs.strip().splitlines()[-1])


async def test_cannot_read_host_files_or_the_servers_secrets(server: Server, marker: str) -> None:
    source = SOURCE
    targets = [
        "/etc/passwd",
        "/etc/shadow",
        "/proc/1/environ",
        f"/proc/{os.getpid()}/environ",
        f"/proc/{os.getpid()}/cmdline",
        str(source),
        str(source.parent / "_config.py"),
        str(pathlib.Path(sys.executable).parent / "activate"),  # the server's virtualenv
    ]
    code = (
        "import glob, json\n"
        f"marker = {marker[:10]!r} + {marker[10:]!r}\n"
        "report = {}\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        with open(path, 'rb') as file:\n"
        "            report[path] = 'read: ' + file.read(40).decode(errors='replace')\n"
        "    except OSError as error:\n"
        "        report[path] = type(error).__name__\n"
        "found = []\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        with open(path, 'rb') as file:\n"
        "            if marker.encode() in file.read():\n"
        "                found.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "report['marker found in'] = found\n"
        "print(json.dumps(report))"
    )
    status, logs = await run_code(server, code)
    assert status == "completed", logs
    report = report_of(logs)
    assert report.pop("marker found in") == []
    assert not any(outcome.startswith("read") for outcome in report.values()), report
    assert marker not in logs


async def test_cannot_write_outside_the_work_dir(server: Server, tmp_path: pathlib.Path) -> None:
    name = f"written-by-user-code-{secrets.token_hex(6)}"
    targets = [
        tmp_path / name,
        SOURCE.parent / f"{name}.py",
        pathlib.Path("/usr/lib", name),
        pathlib.Path("/etc", name),
        pathlib.Path("/root", name),
        pathlib.Path("/", name),
        pathlib.Path("/dev/shm", name),
    ]
    code = (
        "import json, os\n"
        "report = {}\n"
        f"for path in {[str(target) for target in targets]!r}:\n"
        "    try:\n"
        "        with open(path, 'w') as file:\n"
        "            file.write('x')\n"
        "        report[path] = 'written'\n"
        "    except OSError as error:\n"
        "        report[path] = type(error).__name__\n"
        "with open('mine.txt', 'w') as file:\n"
        "    file.write('in the work dir')\n"
        "report['work dir'] = open('/mnt/data/mine.txt').read()\n"
        "print(json.dumps(report))"
    )
    try:
        status, logs = await run_code(server, code)
        assert status == "completed", logs
        report = report_of(logs)
        assert report.pop("work dir") == "in the work dir"  # the work dir is /mnt/data
        assert "written" not in report.values(), report
        assert not [target for target in targets if target.exists()]
    finally:
        for target in targets:  # should the sandbox ever fail
            target.unlink(missing_ok=True)


async def test_cannot_reach_the_server_over_tcp_udp_or_unix_sockets(
    server: Server, tmp_path: pathlib.Path
) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    udp = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await udp.bind(("127.0.0.1", 0))
    udp_port = udp.getsockname()[1]
    unix_path = str(tmp_path / "server.sock")
    abstract = f"\0trio-responses-test-{secrets.token_hex(6)}"
    listeners = []
    for address in (unix_path, abstract):
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await listener.bind(address)
        listener.listen()
        listeners.append(listener)
    code = (
        "import json, socket\n"
        "report = {}\n"
        f"for host in ('127.0.0.1', 'localhost', {socket.gethostname()!r}):\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=5).close()\n"
        "        report['tcp ' + host] = 'connected'\n"
        "    except OSError as error:\n"
        "        report['tcp ' + host] = type(error).__name__\n"
        "udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n"
        f"    udp.sendto(b'stolen', ('127.0.0.1', {udp_port}))\n"
        "    report['udp'] = 'sent'\n"
        "except OSError as error:\n"
        "    report['udp'] = type(error).__name__\n"
        f"for name, address in (('unix', {unix_path!r}), ('abstract', {abstract!r})):\n"
        "    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    try:\n"
        "        unix.connect(address)\n"
        "        report[name] = 'connected'\n"
        "    except OSError as error:\n"
        "        report[name] = type(error).__name__\n"
        "print(json.dumps(report))"
    )
    try:
        status, logs = await run_code(server, code)
        assert status == "completed", logs
        report = report_of(logs)
        assert not {key for key, value in report.items() if value == "connected"}, report
        with trio.move_on_after(1) as nothing:
            await udp.recv(100)
        assert nothing.cancelled_caught  # a datagram "sent" went nowhere
        for listener in listeners:
            with trio.move_on_after(0.1) as nobody:
                await listener.accept()
            assert nobody.cancelled_caught
    finally:
        udp.close()
        for listener in listeners:
            listener.close()


async def test_cannot_signal_the_server(server: Server) -> None:
    # Signal 0 checks that a signal could be sent without sending one: on a sandbox
    # that failed, this test fails instead of killing the test run. A host process
    # of the same user does get SIGKILL.
    victim = await trio.lowlevel.open_process(["sleep", "60"])
    try:
        targets = {
            "server": (os.getpid(), 0),
            "host process": (victim.pid, 9),
        }
        code = (
            "import json, os\n"
            "report = {}\n"
            f"for name, (pid, signal) in {targets!r}.items():\n"
            "    try:\n"
            "        os.kill(pid, signal)\n"
            "        report[name] = 'signalled'\n"
            "    except OSError as error:\n"
            "        report[name] = type(error).__name__\n"
            "report['parent'] = os.getppid()\n"
            "print(json.dumps(report))"
        )
        status, logs = await run_code(server, code)  # checks both still answer
        assert status == "completed", logs
        report = report_of(logs)
        assert report.pop("parent") != os.getpid()
        assert set(report.values()) == {"ProcessLookupError"}, report
        assert victim.poll() is None
    finally:
        victim.kill()
        with trio.CancelScope(shield=True):
            await victim.wait()


async def test_a_double_forked_session_leader_does_not_outlive_its_container(
    server: Server,
) -> None:
    marker = f"escapee-{secrets.token_hex(8)}"
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)',"
        f" {marker!r}])\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        f"print(any({marker!r}.encode() in open(f'/proc/{{pid}}/cmdline', 'rb').read()\n"
        "          for pid in os.listdir('/proc') if pid.isdigit()))"
    )
    status, logs = await run_code(server, code)
    assert status == "completed" and logs == "True\n"  # it did start
    # A container keeps what its calls started (it is stateful) until it ends: then
    # the escapee goes with its process namespace.
    async for container in server.client.containers.list():
        await server.client.containers.delete(container.id)
    assert host_processes_with(marker) == []


async def test_a_fork_bomb_is_stopped_at_the_process_limit(server: Server) -> None:
    code = (
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
        "print(json.dumps({'started': started, 'error': error}))"
    )
    status, logs = await run_code(server, code)
    assert status == "completed", logs
    report = report_of(logs)
    assert report["error"] == errno.EAGAIN
    assert report["started"] < 8  # python_processes, the launcher included


async def test_children_cannot_together_exceed_the_memory_bound(server: Server) -> None:
    code = (
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
        "            held = b'\\x01' * (400 * 1024 * 1024)  # every page touched\n"
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
        "print(json.dumps({'children': children, 'holding': answers.count(b'y')}))\n"
        "_ = os.write(go_w, b'e' * children)"
    )
    status, logs = await run_code(server, code)
    assert status == "completed", logs
    report = report_of(logs)
    assert report["holding"] < 16
    sandbox = (await server.http.get("/health")).json()["sandbox"]
    assert report["holding"] * 400 * MIB <= sandbox["memory_bound_bytes"]


async def test_the_work_dir_cannot_grow_past_its_size(server: Server) -> None:
    code = (
        "import errno, json, os\n"
        "written, error = 0, None\n"
        "chunk = b'x' * (1024 * 1024)\n"
        "try:\n"
        "    for n in range(40):\n"  # at most 40 MiB, whatever happens
        "        with open(f'fill-{n}', 'wb') as file:\n"
        "            for _ in range(4):\n"
        "                file.write(chunk)\n"
        "                file.flush()\n"
        "                written += len(chunk)\n"
        "except OSError as failure:\n"
        "    error = failure.errno\n"
        "print(json.dumps({'written': written, 'error': error}))"
    )
    status, logs = await run_code(server, code)
    assert status == "completed", logs
    report = report_of(logs)
    assert report["error"] == errno.ENOSPC
    assert report["written"] <= 16 * MIB


async def test_no_memory_outside_the_limits_and_no_nested_namespaces(server: Server) -> None:
    code = (
        "import ctypes, json, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "report = {}\n"
        "try:\n"
        "    os.memfd_create('hoard')\n"
        "    report['memfd'] = 'created'\n"
        "except OSError as error:\n"
        "    report['memfd'] = error.errno\n"
        "IPC_PRIVATE, IPC_CREAT = 0, 0o1000\n"
        "segment = libc.shmget(IPC_PRIVATE, 64 * 1024 * 1024, IPC_CREAT | 0o600)\n"
        "report['shmget'] = 'created' if segment >= 0 else ctypes.get_errno()\n"
        "queue = libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)\n"
        "report['msgget'] = 'created' if queue >= 0 else ctypes.get_errno()\n"
        "CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000\n"
        "for name, flags in (('user', CLONE_NEWUSER), ('mount', CLONE_NEWNS)):\n"
        "    done = libc.unshare(flags)\n"
        "    report[name] = 'unshared' if done == 0 else ctypes.get_errno()\n"
        "print(json.dumps(report))"
    )
    status, logs = await run_code(server, code)
    assert status == "completed", logs
    report = report_of(logs)
    assert report["memfd"] == errno.EPERM and report["shmget"] == errno.EPERM
    assert report["msgget"] == errno.EPERM
    assert report["user"] in (errno.ENOSPC, errno.EPERM), report
    assert report["mount"] == errno.EPERM


async def test_a_standalone_tool_server_is_sandboxed_too(nursery: trio.Nursery) -> None:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trio_responses", "tool-server", "python", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    try:
        log = b""
        with trio.fail_after(30):
            while not (match := re.search(rb"python tool server: (http\S+)", log)):
                chunk = await process.stderr.receive_some()
                assert chunk, log.decode()
                log += chunk
        assert b"sandbox: bubblewrap" in log
        session = McpSession("python", connect_to(match.group(1).decode()))
        await nursery.start(session.run)
        result = await session.call_tool(
            "python", {"code": "import os; print(os.path.exists('/etc/passwd'), os.getcwd())"}
        )
        assert result.text == "False /mnt/data\n" and not result.is_error
        session.close()
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


def socket_attempts(families: dict[str, int]) -> str:
    """Code that tries to create a socket of each family (never connecting one) and
    prints ``{name: "created" or errno}``."""
    return (
        "import json, socket\n"
        "report = {}\n"
        f"for name, family in {families!r}.items():\n"
        "    try:\n"
        "        socket.socket(family, socket.SOCK_STREAM if family == 40 else"
        " socket.SOCK_RAW).close()\n"
        "        report[name] = 'created'\n"
        "    except OSError as error:\n"
        "        report[name] = error.errno\n"
        "print(json.dumps(report))"
    )


@needs_filter
async def test_a_vsock_socket_cannot_be_created(server: Server) -> None:
    # AF_VSOCK reaches the hypervisor, which no network namespace confines; the
    # code only ever creates one (inside the sandbox), never connects it.
    status, logs = await run_code(server, socket_attempts({"vsock": 40}))
    assert status == "completed", logs
    assert report_of(logs) == {"vsock": errno.EAFNOSUPPORT}


@needs_filter
async def test_netlink_and_packet_sockets_cannot_be_created(server: Server) -> None:
    status, logs = await run_code(server, socket_attempts({"netlink": 16, "packet": 17}))
    assert status == "completed", logs
    assert report_of(logs) == {"netlink": errno.EAFNOSUPPORT, "packet": errno.EAFNOSUPPORT}


@needs_filter
async def test_only_unix_and_inet_sockets_open(server: Server) -> None:
    assert TABLE is not None
    socket_nr = TABLE.sockets[0]
    code = (
        "import ctypes, json, os, socket\n"
        "opened = []\n"
        "for family in range(46):\n"
        "    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET,"
        " socket.SOCK_RAW):\n"
        "        try:\n"
        "            socket.socket(family, kind).close()\n"
        "        except OSError:\n"
        "            continue\n"
        "        opened.append(family)\n"
        "        break\n"
        "pair = socket.socketpair(socket.AF_UNIX)\n"
        "pair[0].sendall(b'ok')\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "# AF_VSOCK in the low 32 bits, a bit above them: the kernel reads an int.\n"
        f"fd = libc.syscall(ctypes.c_long({socket_nr}), ctypes.c_long((1 << 32) | 40),"
        " ctypes.c_long(socket.SOCK_STREAM), ctypes.c_long(0))\n"
        "if fd >= 0:\n"
        "    os.close(fd)\n"
        "print(json.dumps({'opened': opened, 'pair': pair[1].recv(2).decode(),"
        " 'high bits': 'created' if fd >= 0 else ctypes.get_errno()}))"
    )
    status, logs = await run_code(server, code)
    assert status == "completed", logs
    assert report_of(logs) == {
        "opened": [socket.AF_UNIX, socket.AF_INET, socket.AF_INET6],
        "pair": "ok",
        "high bits": errno.EAFNOSUPPORT,
    }


KEYRING_CODE = """\
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, REQUEST_KEY, KEYCTL = {numbers}
KEY_SPEC_SESSION_KEYRING, KEYCTL_GET_KEYRING_ID, KEYCTL_SEARCH = -3, 0, 10
def call(*args):
    result = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return result if result >= 0 else -ctypes.get_errno()
description = {description!r}.encode()
report = {{
    "add_key": call(ADD_KEY, b"user", description, b"payload", 7, KEY_SPEC_SESSION_KEYRING),
    "request_key": call(REQUEST_KEY, b"user", description, None, 0),
    "keyctl get": call(KEYCTL, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0),
    "keyctl search": call(KEYCTL, KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user",
                          description, 0),
}}
print(json.dumps(report))
"""


@needs_filter
async def test_the_kernel_keyring_is_out_of_reach(server: Server) -> None:
    # Keyrings are not namespaced: a key one run added could be found by a later
    # run. Every keyring call fails, so neither can happen.
    assert TABLE is not None
    code = KEYRING_CODE.format(
        numbers=TABLE.keyring,  # add_key, request_key, keyctl
        description=f"left-by-a-run-{secrets.token_hex(6)}",
    )
    for _ in range(2):  # the second run looks for the first one's key
        status, logs = await run_code(server, code)
        assert status == "completed", logs
        assert set(report_of(logs).values()) == {-errno.EPERM}, logs


@needs_filter
async def test_io_uring_is_unavailable(server: Server) -> None:
    assert TABLE is not None
    setup, enter, register = TABLE.io_uring
    code = (
        "import ctypes, json\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(120)  # struct io_uring_params\n"
        "report = {}\n"
        f"for name, args in (('setup', ({setup}, 8, params)), ('enter', ({enter}, 0, 1, 0, 0,"
        f" None, 0)), ('register', ({register}, 0, 0, None, 0))):\n"
        "    result = libc.syscall(*args)\n"
        "    report[name] = result if result >= 0 else ctypes.get_errno()\n"
        "print(json.dumps(report))"
    )
    status, logs = await run_code(server, code)
    assert status == "completed", logs
    assert report_of(logs) == dict.fromkeys(("setup", "enter", "register"), errno.ENOSYS)


async def test_host_wide_proc_files_are_masked(server: Server) -> None:
    masked = ["/proc/stat", "/proc/loadavg", "/proc/meminfo", "/proc/cmdline", "/proc/uptime"]
    for path in masked:  # what a run would learn about the host
        assert await trio.Path(path).read_bytes(), path
    code = (
        "import json, os\n"
        "report = {}\n"
        f"for path in {masked!r} + ['/proc/self/status']:\n"
        "    try:\n"
        "        with open(path, 'rb') as file:\n"
        "            report[path] = len(file.read())\n"
        "    except OSError as error:\n"
        "        report[path] = type(error).__name__\n"
        "report['pressure'] = os.listdir('/proc/pressure') if os.path.isdir('/proc/pressure')"
        " else []\n"
        "report['cpus'] = os.cpu_count()\n"
        "print(json.dumps(report))"
    )
    status, logs = await run_code(server, code)
    assert status == "completed", logs
    report = report_of(logs)
    assert report.pop("/proc/self/status") > 0  # the run's own processes: readable
    assert report.pop("pressure") == []
    assert report.pop("cpus") >= 1
    assert report == dict.fromkeys(masked, "PermissionError")
