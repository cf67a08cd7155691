"""A seccomp filter for user code: no memory outside the limits' reach.

The sandbox bounds a run's memory with per-process address-space limits, a
process count and a size-limited work directory (or a cgroup). Two kinds of
memory escape all three, because their pages belong to no process and no
file system of the run: System V shared memory segments (``shmget``: a
segment stays allocated after it is detached, and a run could create
thousands), System V message queues (``msgget``: thousands of queues of 16 KiB
each) and anonymous memory files (``memfd_create``, ``memfd_secret``).
This filter makes those calls fail with ``EPERM``; everything else is allowed.
Calls through another ABI (32-bit, x32) are refused too, since their numbers
differ.

The filter is a classic BPF program, as bwrap's ``--seccomp FD`` reads it.
Only x86_64 and aarch64 are known; elsewhere `program` returns None and the
sandbox runs without it.
"""

from __future__ import annotations

import errno
import platform
import struct

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000

_NR_OFFSET = 0  # struct seccomp_data: int nr; __u32 arch; ...
_ARCH_OFFSET = 4

_X32_SYSCALL_BIT = 0x40000000

# machine: (audit arch, first number of another ABI or None, refused call numbers)
_ARCHES: dict[str, tuple[int, int | None, tuple[int, ...]]] = {
    # shmget 29, msgget 68, memfd_create 319, memfd_secret 447
    "x86_64": (0xC000003E, _X32_SYSCALL_BIT, (29, 68, 319, 447)),
    # msgget 186, shmget 194, memfd_create 279, memfd_secret 447
    "aarch64": (0xC00000B7, None, (186, 194, 279, 447)),
}


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one), or None when unknown."""
    known = _ARCHES.get(machine or platform.machine())
    if known is None:
        return None
    arch, foreign_from, refused = known
    deny = _RET_ERRNO | errno.EPERM
    # Instructions as (code, jump if true, jump if false, k); jumps are relative.
    body: list[tuple[int, int, int, int]] = [(_LD_W_ABS, 0, 0, _NR_OFFSET)]
    if foreign_from is not None:
        body.append((_JGE_K, 0, 0, foreign_from))  # patched below: to deny
    for number in refused:
        body.append((_JEQ_K, 0, 0, number))  # patched below: to deny
    body.append((_RET_K, 0, 0, _RET_ALLOW))
    deny_at = len(body)
    body.append((_RET_K, 0, 0, deny))
    patched = [
        (code, deny_at - index - 1, 0, k) if code in (_JEQ_K, _JGE_K) else (code, jt, jf, k)
        for index, (code, jt, jf, k) in enumerate(body)
    ]
    # Another architecture's calls (e.g. int 0x80 on x86_64): denied.
    head = [
        (_LD_W_ABS, 0, 0, _ARCH_OFFSET),
        (_JEQ_K, 1, 0, arch),
        (_RET_K, 0, 0, deny),
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in (*head, *patched))
