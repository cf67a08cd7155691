"""The scripted engine: a deterministic stand-in for a gpt-oss model.

It plans the answer with `engine.script.plan` (genuine harmony tokens) and plays
it back one token per step, pausing ``token_delay_s`` (or ``delay:MS``) between
tokens; every pause is a checkpoint, so a cancelled request stops at once.

With no delay it runs like an engine that is ahead of its reader: it hands
over tokens one by one without pausing, and yields to the scheduler after each
`YIELD_INTERVAL_S` of work. Cancellation is delivered at those yields, before
the next token. (Yielding after every token would wake the readers once per
token and cap a stream at a fraction of what the HTTP layer can write.)

*Stepped* pacing (``stepped=True`` with a delay, `open_scripted_engine`) plays
like a GPU engine's decode loop instead: one clock task ticks every
``token_delay_s`` and each tick hands every running request its next token,
calling the sinks itself, so a tick costs one wake-up however many requests
run. Requests that ask for their own pace (``delay:MS``) keep their own timer.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import final

import trio

from .._exceptions import EngineError
from .._offload import INLINE_BYTES, offload
from .base import EngineInfo, FinishReason, GenerationRequest, GenerationResult, TokenSink
from .script import Script, plan

YIELD_INTERVAL_S = 0.001

INLINE_PLAN_TOKENS = 256
"""Prompts up to this length are planned on the event loop (a few milliseconds at most)."""


@dataclass(eq=False, slots=True)
class _Stepped:
    """One request played back by the clock: where it is, and how it ended."""

    tokens: Sequence[int]
    sink: TokenSink
    context: contextvars.Context
    stop: frozenset[int]
    limit: int
    fail_after: int | None
    next_index: int = 0
    finish_reason: FinishReason | None = None
    error: BaseException | None = None
    done: trio.Event = field(default_factory=trio.Event)

    def step(self) -> bool:
        """Hand over the next token, or end (one decode step). True once ended."""
        index = self.next_index
        if index >= len(self.tokens):
            self._end("stop")
            return True
        if index >= self.limit:
            self._end("length")
            return True
        if self.fail_after is not None and index >= self.fail_after:
            self.error = EngineError(
                f"The scripted engine failed after {index} tokens, "
                f"as the request asked (fail:{self.fail_after})."
            )
            self.done.set()
            return True
        token = self.tokens[index]
        self.next_index = index + 1
        try:
            self.context.run(self.sink, (token,))
        except Exception as error:  # raised in the request's own task
            self.error = error
            self.done.set()
            return True
        if token in self.stop:
            self._end("stop")
            return True
        return False

    def _end(self, reason: FinishReason) -> None:
        self.finish_reason = reason
        self.done.set()


@final
class ScriptedEngine:
    """Implements `Engine`. Safe to share between any number of requests.

    ``stepped`` needs the clock that `open_scripted_engine` runs.
    """

    def __init__(self, *, model: str, token_delay_s: float = 0.0, stepped: bool = False) -> None:
        self._info = EngineInfo(
            kind="scripted",
            model=model,
            description="scripted engine: deterministic harmony output, no model weights",
        )
        self._token_delay_s = token_delay_s
        self._stepped = stepped and token_delay_s > 0
        self._running: set[str] = set()
        self._on_clock: dict[str, _Stepped] = {}
        self._clock_wanted = trio.Event()

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
        # A plan decodes the prompt and encodes an answer that may echo all of it;
        # a constrained plan builds a schema instance: bounded, but not cheap.
        # Either runs off the loop unless the prompt is short.
        short = request.constraint is None and len(request.prompt_token_ids) <= INLINE_PLAN_TOKENS
        script = await offload(
            0 if short else INLINE_BYTES + 1,
            functools.partial(plan, request.prompt_token_ids, request.constraint),
        )
        self._running.add(request.request_id)
        try:
            if self._stepped and script.delay_s is None:
                return await self._on_the_clock(request, script, sink)
            return await self._play(request, script, sink)
        finally:
            self._running.discard(request.request_id)

    async def _play(
        self, request: GenerationRequest, script: Script, sink: TokenSink
    ) -> GenerationResult:
        """Play the script on this task's own timer."""
        delay = script.delay_s if script.delay_s is not None else self._token_delay_s
        stop = frozenset(request.sampling.stop_token_ids)
        limit = request.sampling.max_tokens
        prompt_tokens = len(request.prompt_token_ids)
        emitted = 0
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

    async def _on_the_clock(
        self, request: GenerationRequest, script: Script, sink: TokenSink
    ) -> GenerationResult:
        """Let the clock play the script; wait for the end (cancellable at once)."""
        state = _Stepped(
            tokens=script.tokens,
            sink=sink,
            context=contextvars.copy_context(),
            stop=frozenset(request.sampling.stop_token_ids),
            limit=request.sampling.max_tokens,
            fail_after=script.fail_after,
        )
        key = request.request_id
        self._on_clock[key] = state
        self._clock_wanted.set()
        try:
            await state.done.wait()
        finally:
            # Synchronous: once this task is cancelled the clock never calls its sink.
            if self._on_clock.get(key) is state:
                del self._on_clock[key]
        if state.error is not None:
            raise state.error
        return GenerationResult(
            state.finish_reason or "stop",
            len(request.prompt_token_ids),
            0,
            state.next_index,
        )

    async def run_clock(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The decode loop of stepped pacing: one tick every ``token_delay_s``.

        Sleeps while no request is on the clock. A tick that ran late is not
        made up for: the next one follows ``token_delay_s`` after it at most.
        """
        task_status.started()
        if not self._stepped:
            return
        delay = self._token_delay_s
        on_clock = self._on_clock
        next_tick = trio.current_time()
        while True:
            if not on_clock:
                self._clock_wanted = trio.Event()
                await self._clock_wanted.wait()
                # A new request's first token comes with the next step.
                next_tick = trio.current_time() + delay
            await trio.sleep_until(next_tick)
            for key, state in list(on_clock.items()):
                # An ended request leaves the clock at once (a cancelled one, in its task).
                if state.step() and on_clock.get(key) is state:
                    del on_clock[key]
            next_tick = max(next_tick + delay, trio.current_time())


@asynccontextmanager
async def open_scripted_engine(
    *, model: str, token_delay_s: float = 0.0, stepped: bool = False
) -> AsyncIterator[ScriptedEngine]:
    """A `ScriptedEngine`, with its clock running when ``stepped`` (see the module)."""
    engine = ScriptedEngine(model=model, token_delay_s=token_delay_s, stepped=stepped)
    if not (stepped and token_delay_s > 0):
        yield engine
        return
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run_clock)
        try:
            yield engine
        finally:
            nursery.cancel_scope.cancel()
