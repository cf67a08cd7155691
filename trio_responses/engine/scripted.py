"""The scripted engine: a deterministic stand-in for a gpt-oss model.

It plans the answer with `engine.script.plan` (genuine harmony tokens) and plays
it back one token per step, pausing ``token_delay_s`` (or ``delay:MS``) between
tokens; every pause is a checkpoint, so a cancelled request stops at once.

With no delay it runs like an engine that is ahead of its reader: it hands
over tokens one by one without pausing, and yields to the scheduler after each
`YIELD_INTERVAL_S` of work. Cancellation is delivered at those yields, before
the next token. (Yielding after every token would wake the readers once per
token and cap a stream at a fraction of what the HTTP layer can write.)
"""

from __future__ import annotations

import functools
import time
from typing import final

import trio

from .._exceptions import EngineError
from .._offload import INLINE_BYTES, offload
from .base import EngineInfo, GenerationRequest, GenerationResult, TokenSink
from .script import plan

YIELD_INTERVAL_S = 0.001


@final
class ScriptedEngine:
    """Implements `Engine`. Safe to share between any number of requests."""

    def __init__(self, *, model: str, token_delay_s: float = 0.0) -> None:
        self._info = EngineInfo(
            kind="scripted",
            model=model,
            description="scripted engine: deterministic harmony output, no model weights",
        )
        self._token_delay_s = token_delay_s
        self._running: set[str] = set()

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def healthy(self) -> bool:
        return True

    def statistics(self) -> dict[str, int]:
        return {"running": len(self._running)}

    @property
    def running_requests(self) -> frozenset[str]:
        """Ids of requests being generated right now."""
        return frozenset(self._running)

    async def generate(self, request: GenerationRequest, sink: TokenSink) -> GenerationResult:
        # A constrained plan builds a schema instance: bounded, but not cheap.
        script = await offload(
            0 if request.constraint is None else INLINE_BYTES + 1,
            functools.partial(plan, request.prompt_token_ids, request.constraint),
        )
        delay = script.delay_s if script.delay_s is not None else self._token_delay_s
        stop = frozenset(request.sampling.stop_token_ids)
        limit = request.sampling.max_tokens
        prompt_tokens = len(request.prompt_token_ids)
        emitted = 0
        self._running.add(request.request_id)
        try:
            await trio.lowlevel.checkpoint()
            last_yield = time.perf_counter()
            for token in script.tokens:
                if emitted >= limit:
                    return GenerationResult("length", prompt_tokens, 0, emitted)
                if script.fail_after is not None and emitted >= script.fail_after:
                    raise EngineError(
                        f"The scripted engine failed after {emitted} tokens, "
                        f"as the request asked (fail:{script.fail_after})."
                    )
                sink((token,))
                emitted += 1
                if token in stop:
                    return GenerationResult("stop", prompt_tokens, 0, emitted)
                if delay > 0:
                    await trio.sleep(delay)
                elif time.perf_counter() - last_yield >= YIELD_INTERVAL_S:
                    await trio.lowlevel.checkpoint()
                    # Measured from here: other tasks' time is not this engine's work.
                    last_yield = time.perf_counter()
            return GenerationResult("stop", prompt_tokens, 0, emitted)
        finally:
            self._running.discard(request.request_id)
