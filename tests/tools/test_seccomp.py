"""The seccomp filter's program, run by a classic BPF interpreter for each table.

What user code observes in a real sandbox is in ``test_sandbox_escapes.py``;
this checks every architecture's table, including the ones this host cannot
run, and the numbers against the kernel's headers where they are installed.
"""

from __future__ import annotations

import errno
import pathlib
import re
import struct

import pytest

from trio_responses.tools import seccomp

ALLOW = 0x7FFF0000
MEMORY = ("shmget", "msgget", "memfd_create", "memfd_secret")
KEYRING = ("add_key", "request_key", "keyctl")
IO_URING = ("io_uring_setup", "io_uring_enter", "io_uring_register")
SOCKETS = ("socket", "socketpair")
HEADERS = {
    "x86_64": pathlib.Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": pathlib.Path("/usr/include/asm-generic/unistd.h"),
}
# A call the filter lets through: read (x86_64 0, aarch64 63).
READ = {"x86_64": 0, "aarch64": 63}


def errno_of(verdict: int) -> int:
    assert verdict & 0xFFFF0000 == 0x00050000, hex(verdict)  # SECCOMP_RET_ERRNO
    return verdict & 0xFFFF


def run_filter(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel would return for this call: a classic BPF interpreter of the
    instructions the filter uses (``ld [k]``, ``jeq``, ``jge``, ``ret``)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(args + (0,) * (6 - len(args))))
    instructions = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    assert len(instructions) <= 4096
    accumulator = 0
    pc = 0
    while True:
        code, jt, jf, k = instructions[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            assert k % 4 == 0 and k + 4 <= len(data)
            (accumulator,) = struct.unpack_from("<I", data, k)
            pc += 1
        elif code in (0x15, 0x35):  # BPF_JMP | BPF_JEQ / BPF_JGE | BPF_K
            taken = accumulator == k if code == 0x15 else accumulator >= k
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


@pytest.mark.parametrize("machine", sorted(seccomp.TABLES))
def test_each_table_denies_what_it_should_and_nothing_else(machine: str) -> None:
    table = seccomp.TABLES[machine]
    program = seccomp.program(machine)
    assert program is not None

    def verdict(nr: int, *args: int) -> int:
        return run_filter(program, nr, table.arch, args)

    assert verdict(READ[machine]) == ALLOW
    for nr in (*table.memory, *table.keyring):
        assert errno_of(verdict(nr)) == errno.EPERM
    for nr in table.io_uring:
        assert errno_of(verdict(nr)) == errno.ENOSYS
    for nr in table.sockets:
        opened = [family for family in range(64) if verdict(nr, family, 1, 0) == ALLOW]
        assert opened == [1, 2, 10]
        assert errno_of(verdict(nr, 40, 1, 0)) == errno.EAFNOSUPPORT  # AF_VSOCK
        assert errno_of(verdict(nr, 16, 3, 0)) == errno.EAFNOSUPPORT  # AF_NETLINK
        # The kernel reads an int: high bits do not smuggle a family past the filter.
        assert errno_of(verdict(nr, (1 << 32) | 40, 1, 0)) == errno.EAFNOSUPPORT
        assert verdict(nr, (1 << 32) | 1, 1, 0) == ALLOW
    # Another architecture's calls, whatever their number.
    assert errno_of(run_filter(program, READ[machine], 0x40000003)) == errno.EPERM  # i386
    if table.foreign_from is not None:  # x32 on x86_64
        assert errno_of(verdict(table.foreign_from | READ[machine])) == errno.EPERM


def test_unknown_machines_get_no_filter() -> None:
    assert seccomp.program("riscv64") is None


@pytest.mark.parametrize("machine", sorted(seccomp.TABLES))
def test_the_numbers_are_the_kernels(machine: str) -> None:
    header = HEADERS[machine]
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    numbers = {
        name: int(number)
        for name, number in re.findall(r"#define __NR_(\w+)\s+(\d+)", header.read_text())
    }
    table = seccomp.TABLES[machine]
    for names, found in (
        (MEMORY, table.memory),
        (KEYRING, table.keyring),
        (IO_URING, table.io_uring),
        (SOCKETS, table.sockets),
    ):
        assert found == tuple(numbers[name] for name in names), names
    assert READ[machine] == numbers["read"]
