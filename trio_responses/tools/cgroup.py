"""A cgroup v2 per run, where the host lets the server make one.

A cgroup bounds the memory (``memory.max``, no swap) and the number of tasks
(``pids.max``) of a run's whole process tree, files in its work directory
included, which per-process limits can only approximate. The server uses one
when the cgroup it runs in, on a cgroup v2 hierarchy, already offers the
memory and pids controllers to its children (``cgroup.subtree_control``) and
lets it create a child there: the root cgroup of a host or VM, or a
delegated subtree set up that way. It creates one child per run
(``trio-responses-run-…``), puts the run's first process in it before anything
else starts, kills what is left in it at the end and removes it. It never
writes to a cgroup it did not create; where none can be made (cgroup v1, no
delegation, no permission), `find_parent` says why and the sandbox falls back
to per-process limits.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from dataclasses import dataclass

import trio

_PREFIX = "trio-responses-run-"


@dataclass(frozen=True)
class CgroupParent:
    """The cgroup v2 directory under which runs get cgroups of their own."""

    path: str

    def create(self, *, memory_bytes: int, processes: int) -> RunCgroup:
        """A new child limited to ``memory_bytes`` and ``processes`` tasks.

        Raises:
            OSError: it could not be created or limited (nothing is left behind).
        """
        path = os.path.join(self.path, _PREFIX + secrets.token_hex(6))
        os.mkdir(path)
        cgroup = RunCgroup(path)
        try:
            _write(path, "memory.max", str(memory_bytes))
            if os.path.exists(os.path.join(path, "memory.swap.max")):
                _write(path, "memory.swap.max", "0")
            _write(path, "pids.max", str(processes))
        except OSError:
            os.rmdir(path)
            raise
        return cgroup


@dataclass(frozen=True)
class RunCgroup:
    """One run's cgroup (`CgroupParent.create`)."""

    path: str

    @property
    def procs(self) -> str:
        """The file a process writes its pid to, to join."""
        return os.path.join(self.path, "cgroup.procs")

    def launch_prefix(self) -> list[str]:
        """A command prefix that joins this cgroup, then execs the rest of the command."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', self.procs]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process here for exceeding ``memory.max``."""
        try:
            with open(os.path.join(self.path, "memory.events"), encoding="ascii") as events:
                for line in events:
                    name, _, count = line.partition(" ")
                    if name == "oom_kill" and int(count) > 0:
                        return True
        except (OSError, ValueError):
            pass
        return False

    def kill_all(self) -> None:
        """Kill every process in it (without waiting for them to exit)."""
        self._kill_all()

    async def remove(self) -> None:
        """Kill every process left in it and remove it (waits up to a second)."""
        for _ in range(100):
            self._kill_all()
            try:
                os.rmdir(self.path)
            except FileNotFoundError:
                return
            except OSError:  # EBUSY: its processes are still exiting
                await trio.sleep(0.01)
            else:
                return

    def _kill_all(self) -> None:
        with contextlib.suppress(OSError):
            _write(self.path, "cgroup.kill", "1")  # Linux 5.14+
            return
        with contextlib.suppress(OSError), open(self.procs, encoding="ascii") as procs:
            for line in procs:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(line), signal.SIGKILL)


def find_parent() -> tuple[CgroupParent | None, str]:
    """Where run cgroups can be made, and why (or why none can)."""
    try:
        path = own_cgroup_dir()
    except OSError as error:
        return None, f"cgroups unreadable: {error}"
    except LookupError as error:
        return None, str(error)
    try:
        with open(os.path.join(path, "cgroup.subtree_control"), encoding="ascii") as file:
            enabled = set(file.read().split())
    except OSError as error:
        return None, f"cannot read {path}/cgroup.subtree_control: {error}"
    missing = {"memory", "pids"} - enabled
    if missing:
        return None, (
            f"the cgroup v2 {path} does not delegate the {' and '.join(sorted(missing))} "
            "controller to its children"
        )
    parent = CgroupParent(path)
    try:
        cgroup = parent.create(memory_bytes=64 * 1024 * 1024, processes=1)
        os.rmdir(cgroup.path)
    except OSError as error:
        return None, f"cannot create a cgroup in {path}: {error}"
    return parent, f"a cgroup v2 per run under {path}"


def own_cgroup_dir() -> str:
    """The directory of this process's cgroup v2.

    Raises:
        LookupError: there is none (the message says why).
        OSError: ``/proc/self`` could not be read.
    """
    own = _own_cgroup_v2()
    mount = _cgroup2_mount()
    if own is None or mount is None:
        raise LookupError("no cgroup v2 hierarchy")
    root, mount_point = mount
    if not (own == root or own.startswith(root.rstrip("/") + "/")):
        raise LookupError("this process's cgroup is outside the mounted cgroup v2 hierarchy")
    return os.path.join(mount_point, own[len(root) :].lstrip("/"))


def _own_cgroup_v2() -> str | None:
    with open("/proc/self/cgroup", encoding="utf-8") as file:
        for line in file:
            hierarchy, _, rest = line.rstrip("\n").partition(":")
            controllers, _, path = rest.partition(":")
            if hierarchy == "0" and controllers == "":
                return path
    return None


def _cgroup2_mount() -> tuple[str, str] | None:
    """(root, mount point) of the first cgroup2 mount this process sees."""
    with open("/proc/self/mountinfo", encoding="utf-8") as file:
        for line in file:
            fields = line.split()
            if "-" not in fields:
                continue
            dash = fields.index("-")
            if dash + 1 < len(fields) and fields[dash + 1] == "cgroup2":
                return fields[3], fields[4]
    return None


def _write(directory: str, name: str, value: str) -> None:
    with open(os.path.join(directory, name), "w", encoding="ascii") as file:
        file.write(value)
