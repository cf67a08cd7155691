"""How much memory code runs may hold in sum, and the slots that keep them to it.

One run's worst case is what its sandbox lets it hold (`Sandbox.bound_bytes`):
the run's cgroup ``memory.max`` where the host delegates cgroup v2, otherwise
the product of the per-process limits (processes x address space, plus the work
directory's tmpfs). At most ``max_concurrent`` runs execute at once, all API
keys together, and at most ``max_concurrent_per_key`` of one key's, so the
worst case of the whole server is ``max_concurrent`` x one run's worst case.

`plan_budget` checks that it fits the memory the operator gives the code runs
(``--python-memory-budget-mb``; by default three quarters of what the host, or
the cgroup the server runs in, has) and refuses to start (`StartupError`) when
it does not. Without ``--python-max-concurrent`` it allows as many runs at once
as fit the budget.

`RunSlots` holds the limits while the server runs: a run waits for one of its
key's slots, then for one of the server's, both first come first served. A key
waiting for its own slot stays out of the server-wide queue, so it cannot hold
up the runs of other keys. Without API keys (owner None) only the server-wide
limit applies.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, final

import trio

from .._exceptions import StartupError
from .cgroup import own_cgroup_dir

MIB = 1024 * 1024

DEFAULT_BUDGET_FRACTION = 0.75
"""Share of the host's memory code runs get without ``--python-memory-budget-mb``."""

DEFAULT_MAX_CONCURRENT_PER_KEY = 2

MemoryBound = Literal["cgroup", "rlimit", "per-process"]


@dataclass(frozen=True)
class HostMemory:
    """The memory this server may use: the host's, or its cgroup's limit if smaller."""

    total_bytes: int
    source: str
    """Where the figure comes from, e.g. ``MemTotal of /proc/meminfo``."""


def host_memory() -> HostMemory:
    """`HostMemory` of this process (``MemTotal``, or the cgroup limit below it)."""
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        total = 0
        for line in meminfo:
            name, _, value = line.partition(":")
            if name == "MemTotal":
                total = int(value.split()[0]) * 1024
                break
    memory = HostMemory(total, "MemTotal in /proc/meminfo")
    limit = _cgroup_limit()
    if limit is not None and limit[0] < memory.total_bytes:
        memory = HostMemory(*limit)
    return memory


def _cgroup_limit() -> tuple[int, str] | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1 at the mount)."""
    candidates: list[str] = []
    with contextlib.suppress(OSError, LookupError):
        candidates.append(os.path.join(own_cgroup_dir(), "memory.max"))
    candidates.append("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    for candidate in candidates:
        try:
            with open(candidate, encoding="ascii") as file:
                text = file.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text), candidate
    return None


@dataclass(frozen=True)
class MemoryBudget:
    """The concurrency limits of code runs and the memory they may hold in sum."""

    max_concurrent: int
    """Most runs at once, all keys together."""
    max_concurrent_per_key: int
    """Most runs of one API key at once (not above ``max_concurrent``)."""
    per_run_bytes: int | None
    """One run's worst case; None when nothing bounds it (no sandbox)."""
    bound: MemoryBound
    """What bounds one run: its cgroup, or the per-process rlimits."""
    budget_bytes: int
    """The memory code runs may hold in sum."""
    budget_source: str
    """Where ``budget_bytes`` comes from (the option, or the host's memory)."""

    @property
    def worst_case_bytes(self) -> int | None:
        """The most memory every run together can hold; None when unbounded."""
        if self.per_run_bytes is None:
            return None
        return self.max_concurrent * self.per_run_bytes

    @property
    def fits(self) -> bool:
        worst = self.worst_case_bytes
        return worst is None or worst <= self.budget_bytes

    def describe(self) -> str:
        """One line for the start-up log."""
        limits = (
            f"at most {self.max_concurrent} runs at once, {self.max_concurrent_per_key} per API key"
        )
        budget = f"budget {self.budget_bytes // MIB} MiB ({self.budget_source})"
        if self.per_run_bytes is None:
            return f"{limits}; memory per run not bounded (no sandbox); {budget}"
        worst = self.worst_case_bytes or 0
        return (
            f"{limits}; worst case {self.max_concurrent} x {self.per_run_bytes // MIB} MiB "
            f"({self.bound}) = {worst // MIB} MiB of {budget}"
        )

    def health(self) -> dict[str, Any]:
        """What ``/health`` shows (under ``sandbox.budget``)."""
        return {
            "max_concurrent": self.max_concurrent,
            "max_concurrent_per_key": self.max_concurrent_per_key,
            "memory_bound": self.bound,
            "per_run_bytes": self.per_run_bytes,
            "worst_case_bytes": self.worst_case_bytes,
            "budget_bytes": self.budget_bytes,
            "budget_source": self.budget_source,
        }


def plan_budget(
    *,
    per_run_bytes: int | None,
    bound: MemoryBound,
    max_concurrent: int | None,
    max_concurrent_per_key: int | None,
    budget_mb: int | None,
    host: HostMemory | None = None,
) -> MemoryBudget:
    """The limits in force: ``None`` options get their defaults (module docstring).

    ``host`` is only read without ``budget_mb`` (`host_memory` when not given).

    Raises:
        StartupError: the worst case does not fit the budget (or not even one
            run does); the message says by how much and what to change.
    """
    if budget_mb is not None:
        budget, source = budget_mb * MIB, "--python-memory-budget-mb"
    else:
        host = host or host_memory()
        budget = int(host.total_bytes * DEFAULT_BUDGET_FRACTION)
        source = f"{DEFAULT_BUDGET_FRACTION:.0%} of {host.total_bytes // MIB} MiB, {host.source}"
    if max_concurrent is None:
        # As many as fit (at least one: if that does not fit, the check below says so).
        max_concurrent = 4 if per_run_bytes is None else max(1, budget // per_run_bytes)
    per_key = max_concurrent_per_key or DEFAULT_MAX_CONCURRENT_PER_KEY
    plan = MemoryBudget(
        max_concurrent=max_concurrent,
        max_concurrent_per_key=min(per_key, max_concurrent),
        per_run_bytes=per_run_bytes,
        bound=bound,
        budget_bytes=budget,
        budget_source=source,
    )
    if not plan.fits:
        raise StartupError(
            "cannot start the code interpreter: its worst case, "
            f"{plan.max_concurrent} runs at once x {(per_run_bytes or 0) // MIB} MiB "
            f"({_explain(bound)}) = {(plan.worst_case_bytes or 0) // MIB} MiB, does not fit "
            f"the memory budget of {budget // MIB} MiB ({source}). Lower "
            "--python-max-concurrent, --python-memory-mb or --python-processes, or raise "
            "--python-memory-budget-mb."
        )
    return plan


def _explain(bound: MemoryBound) -> str:
    if bound == "cgroup":
        return "each run's cgroup memory.max, --python-memory-mb"
    return "per run: --python-processes x --python-memory-mb + --python-disk-mb"


class RunsBusy(Exception):
    """A run waited for a slot as long as it could (`RunSlots.hold`)."""


@final
class _Key:
    """One API key's slots and how many of its runs hold or wait for one."""

    def __init__(self, slots: int) -> None:
        self.slots = trio.Semaphore(slots)
        self.users = 0


@final
class RunSlots:
    """The concurrency limits of a `MemoryBudget`, held while runs execute."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self._server = trio.Semaphore(budget.max_concurrent)
        self._keys: dict[str, _Key] = {}
        self.running = 0
        """Runs holding a slot now."""
        self.waiting = 0
        """Runs waiting for a slot (their key's or the server's)."""

    @contextlib.asynccontextmanager
    async def hold(self, owner: str | None, *, wait_s: float = math.inf) -> AsyncIterator[None]:
        """Wait for ``owner``'s slot (with API keys), then the server's; hold both
        until the block ends, however it ends (cancellation included).

        Raises:
            RunsBusy: no slot came free within ``wait_s`` seconds.
        """
        key = None
        if owner is not None:
            key = self._keys.get(owner)
            if key is None:
                key = self._keys[owner] = _Key(self.budget.max_concurrent_per_key)
            key.users += 1
        try:
            async with contextlib.AsyncExitStack() as held:
                self.waiting += 1
                acquired = key_held = False
                try:
                    with trio.move_on_after(wait_s):
                        if key is not None:
                            await held.enter_async_context(key.slots)
                            key_held = True
                        await held.enter_async_context(self._server)
                        acquired = True
                    if not acquired:
                        raise RunsBusy(
                            self._busy(
                                waited_for_key=key is not None and not key_held, wait_s=wait_s
                            )
                        )
                finally:
                    self.waiting -= 1
                self.running += 1
                try:
                    yield
                finally:
                    self.running -= 1
        finally:
            if key is not None and owner is not None:
                key.users -= 1
                if key.users == 0:
                    del self._keys[owner]

    def _busy(self, *, waited_for_key: bool, wait_s: float) -> str:
        if waited_for_key:
            why = (
                f"this API key already runs {self.budget.max_concurrent_per_key} programs "
                "at once, the most the server allows per key"
            )
        else:
            why = (
                f"the server already runs {self.budget.max_concurrent} programs at once, "
                "the most it allows"
            )
        return f"The code interpreter is busy: {why}; no run finished within {wait_s:g} s."

    def health(self) -> dict[str, Any]:
        return {
            **self.budget.health(),
            "running": self.running,
            "waiting": self.waiting,
            "keys": len(self._keys),
        }
