"""CPU-heavy work for large requests, off the event loop.

Parsing a 15 MB body or rendering a long conversation takes the Trio thread for
hundreds of milliseconds; every stream and ``/health`` waits behind it. `offload`
runs such work in a worker thread when its input is large, under one
`trio.CapacityLimiter` per run so that many large requests cannot take every
core; small inputs run inline, where a thread hop would cost more than the work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

import trio
from pydantic import BaseModel

T = TypeVar("T")

INLINE_BYTES = 64 * 1024
"""Inputs up to this size are handled on the event loop."""

INLINE_TOKENIZED = 2 * 1024
"""Text up to this size is tokenized on the event loop. Tokenizing costs from
half a microsecond a character (prose) to about nine (a long run of a
three-byte script, which byte-pair encoding handles in quadratic time, cut
every 2,048 characters): at most about 20 ms inline."""

WORKER_THREADS = 2
"""Large requests processed at once; the rest wait their turn (off the loop)."""

Lane = Literal["requests", "store"]
"""Requests (parsing, validation, rendering) and store records (encoding, sizing)
have limiters of their own, so that a response's final write never waits behind
other clients' large requests."""

_LIMITERS: dict[Lane, trio.lowlevel.RunVar[trio.CapacityLimiter]] = {
    "requests": trio.lowlevel.RunVar("offload_requests"),
    "store": trio.lowlevel.RunVar("offload_store"),
}


def _limiter(lane: Lane) -> trio.CapacityLimiter:
    var = _LIMITERS[lane]
    try:
        return var.get()
    except LookupError:
        limiter = trio.CapacityLimiter(WORKER_THREADS)
        var.set(limiter)
        return limiter


async def offload(
    size: int, function: Callable[[], T], *, lane: Lane = "requests", inline: int = INLINE_BYTES
) -> T:
    """``function()``, inline when ``size`` (bytes, or an estimate) is at most
    ``inline``, else in a worker thread of ``lane``.

    Cancellation while waiting for the limiter is immediate; once the thread
    runs, the caller waits for it (the work is bounded by the input's size).
    """
    if size <= inline:
        return function()
    return await trio.to_thread.run_sync(function, limiter=_limiter(lane))


def estimated_size(value: object, *, limit: int = INLINE_BYTES) -> int:
    """About how many bytes ``value`` (decoded JSON, models, and tuples or lists of
    them) takes as JSON, counted only until the count passes ``limit``.

    It decides whether validating or rendering a request is worth a worker thread
    (`offload`), so it must cost less than the work it saves on small values (a
    request of a few hundred bytes: some tens of microseconds) and stay cheap on
    huge ones: it stops once the count passes ``limit``, and a list or object
    with more members than ``limit`` is over it before any is looked at (each
    takes at least a byte), so no more than ``limit`` members ever wait on its
    stack.
    """
    total = 0
    stack: list[object] = [value]
    pop, push = stack.pop, stack.extend
    while stack:
        node = pop()
        # Exact types first: most nodes are, and ``type() is`` is the cheapest test.
        if type(node) is str:
            total += len(node) + 2
        elif type(node) is dict or isinstance(node, dict):
            total += 2 + 4 * len(node)
            if total > limit:
                break
            total += sum(len(key) for key in node if isinstance(key, str))
            push(node.values())
        elif type(node) is list or isinstance(node, list | tuple):
            total += 2 + len(node)
            if total > limit:
                break
            push(node)
        elif isinstance(node, str):
            total += len(node) + 2
        elif isinstance(node, BaseModel):
            total += 2
            push(vars(node).values())
        else:
            total += 8
        if total > limit:
            break
    return total
