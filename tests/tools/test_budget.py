"""The code runs' memory budget: the arithmetic, the slots, and a real server with two keys."""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

import openai
import pytest
import trio
import trio.testing
from openai import AsyncOpenAI

from tests.conftest import StartServer
from tests.support import MODEL
from tests.tools.test_sandbox import host_processes_with
from trio_responses._exceptions import StartupError
from trio_responses.tools.budget import (
    MIB,
    HostMemory,
    MemoryBudget,
    RunsBusy,
    RunSlots,
    host_memory,
    plan_budget,
)

TOOLS = [{"type": "code_interpreter", "container": {"type": "auto"}}]
RLIMIT_RUN = 8 * 512 * MIB + 64 * MIB
"""One run's worst case with the default limits and no cgroup."""


# -- arithmetic --------------------------------------------------------------------------


def _plan(**overrides: Any) -> MemoryBudget:
    options: dict[str, Any] = {
        "per_run_bytes": RLIMIT_RUN,
        "bound": "rlimit",
        "max_concurrent": None,
        "max_concurrent_per_key": None,
        "budget_mb": None,
        "host": HostMemory(24 * 1024 * MIB, "test"),
    }
    return plan_budget(**{**options, **overrides})


def test_the_worst_case_is_the_runs_at_once_times_one_runs_bound() -> None:
    plan = _plan(max_concurrent=3, max_concurrent_per_key=2, budget_mb=16 * 1024)
    assert plan.worst_case_bytes == 3 * RLIMIT_RUN
    assert plan.budget_bytes == 16 * 1024 * MIB and plan.fits
    assert plan.max_concurrent_per_key == 2
    assert "3 x 4160 MiB (rlimit) = 12480 MiB" in plan.describe()
    health = plan.health()
    assert health["worst_case_bytes"] == 3 * RLIMIT_RUN
    assert health["memory_bound"] == "rlimit"
    assert health["budget_source"] == "--python-memory-budget-mb"


def test_the_default_budget_is_three_quarters_of_the_host() -> None:
    plan = _plan()
    assert plan.budget_bytes == 18 * 1024 * MIB
    assert "75% of 24576 MiB, test" in plan.budget_source
    # As many runs as fit: 18 GiB // 4160 MiB.
    assert plan.max_concurrent == 4 and plan.worst_case_bytes == 4 * RLIMIT_RUN
    assert plan.max_concurrent_per_key == 2


def test_a_cgroup_bounds_a_run_by_its_memory_max() -> None:
    plan = _plan(per_run_bytes=512 * MIB, bound="cgroup", budget_mb=4096)
    assert plan.max_concurrent == 8 and plan.worst_case_bytes == 4096 * MIB and plan.fits


def test_per_key_is_never_above_the_server_limit() -> None:
    plan = _plan(max_concurrent=1, max_concurrent_per_key=5, budget_mb=8192)
    assert plan.max_concurrent_per_key == 1


def test_a_worst_case_over_the_budget_is_refused() -> None:
    with pytest.raises(StartupError) as refused:
        _plan(max_concurrent=4, budget_mb=16 * 1024)
    message = str(refused.value)
    assert "\n" not in message
    assert "4 runs at once x 4160 MiB" in message and "= 16640 MiB" in message
    assert "budget of 16384 MiB (--python-memory-budget-mb)" in message
    # Not even one run fits: refused too, not allowed zero runs.
    with pytest.raises(StartupError, match="1 runs at once x 4160 MiB"):
        _plan(budget_mb=4096)


def test_unbounded_runs_are_not_refused() -> None:
    plan = _plan(per_run_bytes=None, bound="per-process", budget_mb=1)
    assert plan.fits and plan.worst_case_bytes is None and plan.max_concurrent == 4
    assert "not bounded" in plan.describe()


def test_host_memory_is_read() -> None:
    memory = host_memory()
    assert memory.total_bytes > 64 * MIB and memory.source


# -- slots -------------------------------------------------------------------------------


def _slots(max_concurrent: int, per_key: int) -> RunSlots:
    return RunSlots(_plan(max_concurrent=max_concurrent, max_concurrent_per_key=per_key))


async def test_slots_hold_the_per_key_and_server_limits_first_come_first_served() -> None:
    slots = _slots(3, 2)
    release = {name: trio.Event() for name in ("a1", "a2", "a3", "b1", "b2")}
    running: set[str] = set()

    async def run(name: str, owner: str) -> None:
        async with slots.hold(owner):
            running.add(name)
            try:
                await release[name].wait()
            finally:
                running.discard(name)

    async with trio.open_nursery() as nursery:
        for name in ("a1", "a2", "a3", "b1", "b2"):
            nursery.start_soon(run, name, "key-" + name[0])
            await trio.testing.wait_all_tasks_blocked()
        assert running == {"a1", "a2", "b1"}
        assert (slots.running, slots.waiting, slots.health()["keys"]) == (3, 2, 2)
        # b2 queued for a server slot before a3 could: it goes first.
        release["a1"].set()
        await trio.testing.wait_all_tasks_blocked()
        assert running == {"a2", "b1", "b2"}
        release["b1"].set()
        await trio.testing.wait_all_tasks_blocked()
        assert running == {"a2", "b2", "a3"}
        for event in release.values():
            event.set()
    assert (slots.running, slots.waiting, slots.health()["keys"]) == (0, 0, 0)


async def test_slots_are_freed_when_a_holder_or_a_waiter_is_cancelled() -> None:
    slots = _slots(1, 1)
    async with trio.open_nursery() as nursery:
        holder = trio.CancelScope()
        waiter = trio.CancelScope()

        async def hold(scope: trio.CancelScope, owner: str | None) -> None:
            with scope:
                async with slots.hold(owner):
                    await trio.sleep_forever()

        nursery.start_soon(hold, holder, "a")
        nursery.start_soon(hold, waiter, "a")
        await trio.testing.wait_all_tasks_blocked()
        assert (slots.running, slots.waiting) == (1, 1)
        waiter.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert (slots.running, slots.waiting) == (1, 0)
        holder.cancel()
    assert (slots.running, slots.waiting, slots.health()["keys"]) == (0, 0, 0)
    async with slots.hold(None):  # free again, without a key too
        assert slots.running == 1


async def test_a_run_that_waits_too_long_says_why() -> None:
    slots = _slots(2, 1)
    async with slots.hold("a"):
        with pytest.raises(RunsBusy, match="this API key already runs 1 programs"):
            async with slots.hold("a", wait_s=0.01):
                pass
        async with slots.hold("b"):
            with pytest.raises(RunsBusy, match="the server already runs 2 programs"):
                async with slots.hold("c", wait_s=0.01):
                    pass
    assert (slots.running, slots.waiting, slots.health()["keys"]) == (0, 0, 0)


# -- a real server -----------------------------------------------------------------------


def _sleeper(marker: str) -> str:
    """A code block whose call waits an hour for a child process named by ``marker``."""
    return (
        "```python\nimport subprocess, sys\n"
        f'subprocess.run([sys.executable, "-c", "import time; time.sleep(3600)", "{marker}"])\n```'
    )


async def test_the_memory_budget_with_concurrent_runs_of_two_keys(
    start_server: StartServer,
) -> None:
    server = await start_server(
        code_interpreter=True,
        api_keys=("key-a", "key-b"),
        admin_keys=("admin",),
        python_max_concurrent=3,
        python_max_concurrent_per_key=2,
        python_memory_mb=128,
        python_memory_budget_mb=4096,
        python_wall_s=600,
        tool_timeout_s=600,
    )
    clients = {
        key: AsyncOpenAI(base_url=server.base_url, api_key=f"key-{key}", max_retries=0)
        for key in ("a", "b")
    }
    tag = "budget-" + secrets.token_hex(4)
    responses: dict[str, str] = {}

    def running() -> set[str]:
        return {name for name in responses if host_processes_with(f"{tag}-{name}\0")}

    async def budget() -> dict[str, Any]:
        reply = await server.http.get("/health", headers={"Authorization": "Bearer admin"})
        health: dict[str, Any] = reply.json()["sandbox"]["budget"]
        return health

    async def start(name: str) -> None:
        response = await clients[name[0]].responses.create(
            model=MODEL, input=_sleeper(f"{tag}-{name}"), tools=TOOLS, background=True
        )
        responses[name] = response.id

    async def until(condition: Any) -> None:
        with trio.fail_after(60):
            while not await condition():  # noqa: ASYNC110 (processes: no event)
                await trio.sleep(0.05)

    async def runs_are(expected: set[str]) -> None:
        async def holds() -> bool:
            return running() == expected

        await until(holds)

    async def waiting_is(count: int) -> None:
        async def holds() -> bool:
            return (await budget())["waiting"] == count

        await until(holds)

    try:
        await start("a1")
        await runs_are({"a1"})
        await start("a2")
        await runs_are({"a1", "a2"})
        await start("a3")  # over its key's 2: waits
        await waiting_is(1)
        await start("b1")
        await runs_are({"a1", "a2", "b1"})
        await start("b2")  # over the server's 3: waits
        await waiting_is(2)
        assert running() == {"a1", "a2", "b1"}
        health = await budget()
        assert (health["running"], health["keys"]) == (3, 2)
        assert health["max_concurrent"] == 3 and health["max_concurrent_per_key"] == 2
        assert health["worst_case_bytes"] <= health["budget_bytes"] == 4096 * MIB

        # A cancelled run is stopped and frees its slots: b2 had queued for the
        # server's slot before a3 could, so it goes first.
        await clients["a"].responses.cancel(responses["a1"])
        await runs_are({"a2", "b1", "b2"})
        await waiting_is(1)
        await clients["b"].responses.cancel(responses["b1"])
        await runs_are({"a2", "b2", "a3"})
        await waiting_is(0)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            for name, response_id in responses.items():
                with contextlib.suppress(openai.APIError):  # already cancelled
                    await clients[name[0]].responses.cancel(response_id)
            for client in clients.values():
                await client.close()
    await runs_are(set())

    async def released() -> bool:
        health = await budget()
        return (health["running"], health["waiting"], health["keys"]) == (0, 0, 0)

    # A cancelled call gives its slots back once its container's process is reaped.
    await until(released)


async def test_health_shows_the_budget(start_server: StartServer) -> None:
    server = await start_server(
        code_interpreter=True, python_memory_mb=256, python_memory_budget_mb=8192
    )
    budget = (await server.http.get("/health")).json()["sandbox"]["budget"]
    per_run = 256 * MIB if budget["memory_bound"] == "cgroup" else 8 * 256 * MIB + 64 * MIB
    assert budget["per_run_bytes"] == per_run
    assert budget["max_concurrent"] == 8192 * MIB // per_run  # as many as fit
    assert budget["worst_case_bytes"] == budget["max_concurrent"] * per_run
    assert budget["budget_bytes"] == 8192 * MIB
    assert budget["budget_source"] == "--python-memory-budget-mb"
    assert (budget["running"], budget["waiting"]) == (0, 0)
