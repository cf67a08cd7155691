"""The bubblewrap command line of one sandboxed run.

Each run gets fresh user, pid, network, ipc, uts, mount and cgroup namespaces
(``--unshare-all``). Its filesystem is a read-only tmpfs holding only ``/usr``
(plus the ``/bin``, ``/lib*`` links into it), the Python runtime user code runs
with (its prefix, read-only), a new ``/proc`` (it sees its own processes only)
with the host-wide files that show other runs' activity masked (`MASKED_PROC`),
a minimal read-only ``/dev``, and the work directory, ``/mnt/data``: a tmpfs of
``disk_bytes`` that is also ``/tmp``. No ``/etc``, no home, no project checkout,
no sockets of the host. The environment is empty but for what `environment`
lists; capabilities are dropped, ``no_new_privs`` is set, the process starts a
new session (no terminal to inject input into) and everything dies with bwrap.

Who user code is depends on who runs the tool server:

- Not root: bwrap maps the sandbox user (uid 1000) to the server's own uid in
  a new user namespace and forbids nested ones (``--disable-userns``).
- Root: bwrap's own mapping would make user code root on the host, for which
  the kernel ignores ``RLIMIT_NPROC``. Instead bwrap waits
  (``--userns-block-fd``) while `user_namespace_maps` are written: the
  namespace's uid 0 is the host's root, so bwrap can read a runtime under
  ``/root`` to bind it, and uid 1000 is the host's ``nobody``. The launcher
  (see ``tools.sandbox``) then closes the namespace to nested user namespaces
  and becomes uid 1000 before it runs any user code; the capabilities it
  needed for that go with the uid change.

Either way the run's processes belong to a user namespace of their own, where
the kernel counts ``RLIMIT_NPROC`` per run (not per host user), and nested user
namespaces (which could mount tmpfs beyond every limit here) are refused.
"""

from __future__ import annotations

import os
import pwd
import sys
from dataclasses import dataclass

WORK_DIR = "/mnt/data"
"""User code's working directory (and ``/tmp``, and ``HOME``) inside the sandbox."""

PACKAGES_DIR = "/opt/packages"
"""Where a container's extra packages directory is bound (read-only), if it has one."""

SANDBOX_UID = 1000
"""The uid (and gid) user code has inside the sandbox."""

_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Top-level directories that merged-/usr systems make links into /usr."""

MASKED_PROC_FILES = (
    "buddyinfo",
    "cmdline",
    "diskstats",
    "interrupts",
    "key-users",
    "keys",
    "latency_stats",
    "loadavg",
    "meminfo",
    "pagetypeinfo",
    "sched_debug",
    "schedstat",
    "slabinfo",
    "softirqs",
    "stat",
    "swaps",
    "sys/fs/file-nr",
    "sys/fs/inode-nr",
    "sys/kernel/random/boot_id",
    "timer_list",
    "uptime",
    "vmallocinfo",
    "vmstat",
    "zoneinfo",
)
"""Files under ``/proc`` that no namespace confines: the whole host's CPU, memory,
disk, interrupt and scheduler counters, load, uptime, boot command line and id,
and keyrings, from which a run could watch other tenants' runs. Each is covered
by the host's ``/dev/null`` on a ``nodev`` bind, so opening it fails with
``EACCES`` (``PermissionError``). Those this kernel lacks are left out.

What Python needs keeps working: ``/proc/self`` and the run's own processes;
``os.cpu_count()`` (glibc falls back to ``sched_getaffinity`` when it cannot
read ``/proc/stat`` and there is no ``/sys``); ``/proc/cpuinfo``. ``/proc/net``
is the run's own network namespace's."""

MASKED_PROC_DIRS = ("irq", "pressure")
"""Directories under ``/proc`` hidden the same way (per-interrupt counters,
the host's pressure stall information): an empty read-only tmpfs covers each."""


@dataclass(frozen=True)
class Runtime:
    """The Python interpreter user code runs with, and what of the host it needs."""

    executable: str
    """The base interpreter (not a virtual environment's: user code gets the
    runtime's standard library, not the server's packages)."""
    binds: tuple[str, ...]
    """Host directories outside ``/usr`` bound read-only at the same path."""

    @classmethod
    def current(cls) -> Runtime:
        """The runtime of the interpreter running this process."""
        executable = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
        binds: list[str] = []
        for path in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(executable)):
            real = os.path.realpath(path)
            if not any(_inside(real, bound) for bound in ("/usr", *binds)):
                binds.append(real)
        return cls(executable, tuple(binds))

    def environment(self) -> dict[str, str]:
        """User code's whole environment."""
        return {
            "PATH": f"{os.path.dirname(self.executable)}:/usr/local/bin:/usr/bin:/bin",
            "HOME": WORK_DIR,
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
        }


@dataclass(frozen=True)
class Bwrap:
    """A working bubblewrap and how runs use it (see the module docstring)."""

    path: str
    """The bwrap executable."""
    version: str
    """What ``bwrap --version`` printed, e.g. ``bubblewrap 0.8.0``."""
    runtime: Runtime
    host_ids: tuple[int, int] | None
    """Root only: the host uid and gid (``nobody``'s) the sandbox user is mapped
    to; None when bwrap maps it to the server's own uid."""

    @classmethod
    def for_this_process(cls, path: str, version: str, runtime: Runtime) -> Bwrap:
        return cls(path, version, runtime, _nobody() if os.geteuid() == 0 else None)

    @property
    def maps_users(self) -> bool:
        """Whether the caller writes the user namespace's maps (`user_namespace_maps`)."""
        return self.host_ids is not None

    def user_namespace_maps(self) -> tuple[str, str]:
        """The ``uid_map`` and ``gid_map`` of a run's user namespace (root only)."""
        if self.host_ids is None:
            raise ValueError("bwrap writes the maps itself when not run as root")
        uid, gid = self.host_ids
        return f"0 0 1\n{SANDBOX_UID} {uid} 1\n", f"0 0 1\n{SANDBOX_UID} {gid} 1\n"

    def argv(
        self,
        *,
        disk_bytes: int,
        code_fd: int,
        launcher: list[str],
        seccomp_fd: int | None,
        info_fd: int | None = None,
        block_fd: int | None = None,
        script_path: str = f"{WORK_DIR}/main.py",
        packages: str | None = None,
        own_tmp: bool = False,
        environment: dict[str, str] | None = None,
        host_config: tuple[str, ...] = (),
    ) -> list[str]:
        """The command of one run: bwrap, its options, then ``launcher`` inside.

        ``code_fd`` is read to become ``script_path`` (default: ``main.py`` in the
        work directory); with `maps_users`, bwrap writes its child's pid to
        ``info_fd`` and waits on ``block_fd`` until the maps are written.

        For a container (``tools.container_process``): ``packages``, a host
        directory bound read-only at `PACKAGES_DIR`; ``own_tmp``, ``/tmp`` a tmpfs
        of its own (also of ``disk_bytes``) rather than the work directory, so that
        what programs keep there is not among the container's files; and
        ``environment``, added to `Runtime.environment`; ``host_config``, host
        directories bound read-only at the same path where they exist (e.g.
        ``/etc/fonts``, without which fontconfig complains on every use). File
        descriptors the
        caller passes bwrap beyond those named here stay open, at the same
        numbers, in the launcher.
        """
        argv = [self.path, "--unshare-all", "--unshare-user"]
        if self.maps_users:
            if info_fd is None or block_fd is None:
                raise ValueError("a run as root needs info_fd and block_fd")
            argv += ["--userns-block-fd", str(block_fd), "--info-fd", str(info_fd)]
            argv += ["--cap-drop", "ALL"]
            # Only the launcher uses these, to close the namespace and drop to the
            # sandbox user; the uid change takes them away before user code runs.
            for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SYS_RESOURCE"):
                argv += ["--cap-add", cap]
        else:
            argv += ["--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
            argv += ["--cap-drop", "ALL"]
        argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        argv += ["--ro-bind", "/usr", "/usr"]
        for link in _SYSTEM_LINKS:
            if os.path.islink(link):
                argv += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link) and not _inside(link, "/usr"):
                argv += ["--ro-bind", link, link]
        made: set[str] = set()
        for bind in self.runtime.binds:
            for parent in _parents(bind):
                if parent not in made:
                    # bwrap would copy the host's modes (/root is 0700).
                    argv += ["--perms", "0755", "--dir", parent]
                    made.add(parent)
            argv += ["--ro-bind", bind, bind]
        argv += ["--proc", "/proc"]
        for name in MASKED_PROC_FILES:
            if os.path.exists(f"/proc/{name}"):
                argv += ["--ro-bind", "/dev/null", f"/proc/{name}"]
        for name in MASKED_PROC_DIRS:
            if os.path.isdir(f"/proc/{name}"):
                argv += ["--perms", "0555", "--tmpfs", f"/proc/{name}"]
                argv += ["--remount-ro", f"/proc/{name}"]
        argv += ["--dev", "/dev", "--remount-ro", "/dev"]
        argv += ["--perms", "1777", "--size", str(disk_bytes), "--tmpfs", WORK_DIR]
        if own_tmp:
            argv += ["--perms", "1777", "--size", str(disk_bytes), "--tmpfs", "/tmp"]
        else:
            argv += ["--symlink", WORK_DIR, "/tmp"]
        config = [directory for directory in host_config if os.path.isdir(directory)]
        extra_dirs = [] if packages is None else _parents(PACKAGES_DIR)
        if not _inside(os.path.dirname(script_path), WORK_DIR):
            extra_dirs += _parents(script_path)
        for directory in config:
            extra_dirs += _parents(directory)
        for directory in dict.fromkeys(extra_dirs):  # in order, each once
            if directory not in made:
                # Readable by the sandbox user (bwrap would make them 0700).
                argv += ["--perms", "0755", "--dir", directory]
        if packages is not None:
            argv += ["--ro-bind", packages, PACKAGES_DIR]
        for directory in config:
            argv += ["--ro-bind", directory, directory]
        argv += ["--perms", "0644", "--file", str(code_fd), script_path]
        argv += ["--remount-ro", "/", "--chdir", WORK_DIR, "--clearenv"]
        for name, value in {**self.runtime.environment(), **(environment or {})}.items():
            argv += ["--setenv", name, value]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        return [*argv, "--", *launcher]


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _parents(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/a", "/a/b"]``."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return 65534, 65534
    return entry.pw_uid, entry.pw_gid
