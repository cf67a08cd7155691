"""CPU-heavy work for large requests, off the event loop.

Parsing a 15 MB body or rendering a long conversation takes the Trio thread for
hundreds of milliseconds; every stream and ``/health`` waits behind it. `offload`
runs such work in a worker thread when its input is large, under one
`trio.CapacityLimiter` per run so that many large requests cannot take every
core; small inputs run inline, where a thread hop would cost more than the work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

INLINE_BYTES = 64 * 1024
"""Inputs up to this size are handled on the event loop."""

WORKER_THREADS = 2
"""Large requests processed at once; the rest wait their turn (off the loop)."""

_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("offload_limiter")


def _limiter() -> trio.CapacityLimiter:
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(WORKER_THREADS)
        _LIMITER.set(limiter)
        return limiter


async def offload(size: int, function: Callable[[], T]) -> T:
    """``function()``, inline when ``size`` (bytes, or an estimate) is small,
    else in a worker thread.

    Cancellation while waiting for the limiter is immediate; once the thread
    runs, the caller waits for it (the work is bounded by the input's size).
    """
    if size <= INLINE_BYTES:
        return function()
    return await trio.to_thread.run_sync(function, limiter=_limiter())
