"""A seccomp filter for user code: no memory outside the limits' reach, and a
smaller kernel surface.

The sandbox bounds a run's memory with per-process address-space limits, a
process count and a size-limited work directory (or a cgroup). Two kinds of
memory escape all three, because their pages belong to no process and no
file system of the run: System V shared memory segments (``shmget``: a
segment stays allocated after it is detached, and a run could create
thousands), System V message queues (``msgget``: thousands of queues of 16 KiB
each) and anonymous memory files (``memfd_create``, ``memfd_secret``).
This filter makes those calls fail with ``EPERM``.

It also takes away kernel interfaces user code has no use for, and which
either reach past the run's namespaces or are a frequent home of kernel bugs:

- ``socket`` and ``socketpair`` work for ``AF_UNIX``, ``AF_INET`` and
  ``AF_INET6`` only (the run's network namespace has nothing but a loopback
  interface); every other family fails with ``EAFNOSUPPORT``, as on a kernel
  built without it. Among them ``AF_VSOCK`` (the hypervisor's sockets, which
  no network namespace confines), ``AF_NETLINK`` (bubblewrap brings the
  loopback interface up over netlink before it applies the filter, and
  glibc's ``getaddrinfo`` does without it), ``AF_PACKET``, ``AF_KEY``,
  ``AF_ALG``, ``AF_BLUETOOTH``. The family is the low 32 bits of the first
  argument, all the kernel reads of it (``int family``).
- The kernel's keyrings (``add_key``, ``keyctl``, ``request_key``) fail with
  ``EPERM``: keys are only partly namespaced (their serial numbers are
  host-wide, and they belong to, and count against the quota of, the host
  user all runs share), so a key one run stored could outlive it and be found
  by a later one.
- ``io_uring`` (``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``)
  fails with ``ENOSYS``, as on a kernel without it, so that programs fall back
  to ordinary calls.

Everything else is allowed. Calls through another ABI (32-bit, x32) are refused
with ``EPERM``, since their numbers differ.

The filter is a classic BPF program, as bwrap's ``--seccomp FD`` reads it; bwrap
applies it last, just before it starts the launcher, so its own set-up is not
subject to it. Only x86_64 and aarch64 (both little-endian) are known;
elsewhere `program` returns None and the sandbox runs without it.
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass
from typing import TypeAlias

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_NR_OFFSET = 0
_ARCH_OFFSET = 4
_ARG0_LOW_OFFSET = 16  # little-endian: the low half of args[0] comes first

_X32_SYSCALL_BIT = 0x40000000

ALLOWED_FAMILIES = (1, 2, 10)
"""The socket families user code may create sockets of: ``AF_UNIX``, ``AF_INET``,
``AF_INET6`` (Linux's numbers, the same on every architecture)."""

_Jump: TypeAlias = int | str
"""A jump offset, or the label of its target."""


@dataclass(frozen=True)
class Table:
    """One architecture's audit number and the call numbers the filter checks."""

    arch: int
    """``AUDIT_ARCH_*``: calls made through another ABI carry another one."""
    foreign_from: int | None
    """The first number of another ABI sharing this ``arch`` (x32), or None."""
    memory: tuple[int, ...]
    """``shmget``, ``msgget``, ``memfd_create``, ``memfd_secret``."""
    keyring: tuple[int, ...]
    """``add_key``, ``request_key``, ``keyctl``."""
    io_uring: tuple[int, ...]
    """``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``."""
    sockets: tuple[int, ...]
    """``socket``, ``socketpair``."""


TABLES: dict[str, Table] = {
    # arch/x86/entry/syscalls/syscall_64.tbl
    "x86_64": Table(
        arch=0xC000003E,  # AUDIT_ARCH_X86_64
        foreign_from=_X32_SYSCALL_BIT,
        memory=(29, 68, 319, 447),
        keyring=(248, 249, 250),
        io_uring=(425, 426, 427),
        sockets=(41, 53),
    ),
    # include/uapi/asm-generic/unistd.h
    "aarch64": Table(
        arch=0xC00000B7,  # AUDIT_ARCH_AARCH64 (little-endian)
        foreign_from=None,
        memory=(194, 186, 279, 447),
        keyring=(217, 218, 219),
        io_uring=(425, 426, 427),
        sockets=(198, 199),
    ),
}
"""The architectures the filter knows, by ``platform.machine()``."""


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one), or None when unknown."""
    table = TABLES.get(machine or platform.machine())
    if table is None:
        return None
    # Instructions as (code, jump if true, jump if false, k); a jump names its
    # target's label and is made relative below.
    body: list[tuple[int, _Jump, _Jump, int]] = []
    labels: dict[str, int] = {}

    def label(name: str) -> None:
        labels[name] = len(body)

    def emit(code: int, k: int, jt: _Jump = 0, jf: _Jump = 0) -> None:
        body.append((code, jt, jf, k))

    emit(_LD_W_ABS, _ARCH_OFFSET)
    emit(_JEQ_K, table.arch, jf="eperm")  # another architecture's calls: denied
    emit(_LD_W_ABS, _NR_OFFSET)
    if table.foreign_from is not None:
        emit(_JGE_K, table.foreign_from, jt="eperm")  # e.g. x32 on x86_64
    for number in (*table.memory, *table.keyring):
        emit(_JEQ_K, number, jt="eperm")
    for number in table.io_uring:
        emit(_JEQ_K, number, jt="enosys")
    for number in table.sockets:
        emit(_JEQ_K, number, jt="family")
    emit(_RET_K, _RET_ALLOW)  # every other call
    label("family")  # socket, socketpair: jumps go forward only, so "allow" is last
    emit(_LD_W_ABS, _ARG0_LOW_OFFSET)
    for family in ALLOWED_FAMILIES:
        emit(_JEQ_K, family, jt="allow")
    emit(_RET_K, _RET_ERRNO | errno.EAFNOSUPPORT)
    label("eperm")
    emit(_RET_K, _RET_ERRNO | errno.EPERM)
    label("enosys")
    emit(_RET_K, _RET_ERRNO | errno.ENOSYS)
    label("allow")
    emit(_RET_K, _RET_ALLOW)

    def relative(index: int, jump: _Jump) -> int:
        if isinstance(jump, int):
            return jump
        offset = labels[jump] - index - 1
        if not 0 <= offset <= 255:
            raise ValueError(f"jump to {jump} out of reach")  # pragma: no cover - fixed layout
        return offset

    return b"".join(
        struct.pack("=HBBI", code, relative(index, jt), relative(index, jf), k)
        for index, (code, jt, jf, k) in enumerate(body)
    )
