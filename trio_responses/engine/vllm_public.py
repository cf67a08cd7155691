"""The vLLM engine's public bridge: a pump per request on ``AsyncLLM.generate``.

Uses vLLM's and trio-asyncio's public API only, so it runs on any version of
either (`engine.vllm` chooses it where the direct bridge, `_vllm_private`, may
not run). A request is one asyncio pump, run from its Trio task with
``trio_asyncio.aio_as_trio``, iterating ``AsyncLLM.generate`` (outputs as deltas,
``RequestOutputKind.DELTA``) and handing each output's new tokens to the
request's sink, in the request's context. vLLM's own asyncio tasks read the
engine core's outputs and fill each request's collector, which wakes its pump.
Each engine step costs an asyncio callback per request it advanced (the pump's
wake-up), each a step of the trio-asyncio loop's Trio task, besides the chain
of about five callbacks of vLLM's own tasks (`bench/vllm_floor.py`).

Cancelling the Trio side cancels the pump (vLLM aborts the request when its
``generate`` is cancelled), stops the sink at once and aborts the request
again, explicitly, shielded and bounded (a step of the job's cleanup,
`cleanup_scope`): the request never depends on garbage collection to end. A
sink that raises stops the pump, which closes vLLM's generator (an abort), and
its exception propagates from `generate`. An error of vLLM's (the engine died,
the request failed) ends the request with `EngineError`.

The parts the direct bridge shares (`_Stream`, `VllmEngine`'s delivery, sampling
parameters, abort and shutdown) are here; `_vllm_private.DirectVllmEngine`
derives from `VllmEngine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
import trio_asyncio
from vllm import SamplingParams
from vllm.inputs.engine import tokens_input
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from .._cleanup import cleanup_scope
from .._exceptions import EngineError
from .._offload import INLINE_BYTES, offload
from .base import (
    EngineInfo,
    GenerationRequest,
    GenerationResult,
    OutputConstraint,
    TokenSink,
    sampling_kwargs,
    structured_outputs_fields,
)
from .script import plan

logger = logging.getLogger("trio_responses.engine.vllm")

PUBLIC_COST = (
    "~100-130 µs of CPU per token at 8 streams and ~500-740 at 1 on a 2-core box, "
    "three times the direct bridge's"
)
"""What the public bridge costs, for its log line (`bench/vllm_floor.py`,
docs/benchmarks.md)."""


@dataclass(eq=False)
class _Stream:
    """One request's outputs on the Trio side."""

    sink: TokenSink
    context: contextvars.Context
    done: trio.Event = field(default_factory=trio.Event)
    ended: bool = False
    """No more outputs go to ``sink`` (vLLM is done with it, or we are)."""
    over_in_vllm: bool = False
    """vLLM has finished the request, or failed it: nothing to abort."""
    error: BaseException | None = None
    finish_reason: str | None = None
    cached: int = 0
    produced: int = 0
    collector: Any = None
    """The direct bridge: vLLM's ``RequestOutputCollector`` of the request."""
    queued: bool = False
    """The direct bridge: on the dispatcher's list (its collector has something)."""


class VllmEngine:
    """Implements `Engine` over one ``AsyncLLM`` (the public bridge). Use `open_vllm_engine`."""

    bridge = "public"

    def __init__(
        self,
        llm: AsyncLLM,
        *,
        model: str,
        scripted: bool,
        cleanup_timeout_s: float = 5.0,
    ) -> None:
        self._llm = llm
        self._cleanup_timeout_s = cleanup_timeout_s
        self._scripted = scripted
        self._info = EngineInfo(
            kind="vllm",
            model=model,
            description=f"vLLM engine ({model})"
            + (" following the scripted model (testing)" if scripted else ""),
        )
        self._running: set[str] = set()
        self._dead = False

    async def start(self, nursery: trio.Nursery) -> None:
        """Start the engine's own Trio tasks in ``nursery`` (the public bridge has none)."""

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def healthy(self) -> bool:
        return not self._dead and not self._llm.errored

    @property
    def running_requests(self) -> frozenset[str]:
        """Requests this engine is generating right now (our side)."""
        return frozenset(self._running)

    def statistics(self) -> dict[str, int]:
        """vLLM's own count of unfinished requests, and ours."""
        return {
            "unfinished": self._llm.get_num_unfinished_requests(),
            "running": len(self._running),
        }

    async def generate(self, request: GenerationRequest, sink: TokenSink) -> GenerationResult:
        if not self.healthy:
            raise EngineError("The inference engine is not running; the server needs a restart.")
        params = await offload(  # a scripted, constrained plan builds a schema instance
            INLINE_BYTES + 1 if self._scripted and request.constraint is not None else 0,
            functools.partial(self._sampling_params, request),
        )
        self._check_open()
        prompt = tokens_input(list(request.prompt_token_ids))
        request_id = request.request_id
        stream = _Stream(sink, contextvars.copy_context())
        self._running.add(request_id)
        try:
            await self._run(request_id, prompt, params, stream)
        finally:
            self._running.discard(request_id)
            stream.ended = True  # from here on nothing calls the sink
            if not stream.over_in_vllm:  # cancelled (maybe mid-add), or the sink raised
                # The job's cleanup begins here when it is cancelled: its deadline.
                with cleanup_scope(self._cleanup_timeout_s):
                    await self._abort(request_id)
        if stream.error is not None:
            raise stream.error
        return GenerationResult(
            finish_reason="length" if stream.finish_reason == "length" else "stop",
            prompt_tokens=len(request.prompt_token_ids),
            cached_tokens=stream.cached,
            output_tokens=stream.produced,
        )

    def _check_open(self) -> None:
        """Raise `EngineError` if the engine no longer takes requests."""

    async def _run(
        self, request_id: str, prompt: Any, params: SamplingParams, stream: _Stream
    ) -> None:
        """Generate ``request_id`` into ``stream`` until vLLM or the stream is done."""
        try:
            await trio_asyncio.aio_as_trio(self._pump)(request_id, prompt, params, stream)
        except asyncio.CancelledError:  # the loop is closing under it (not a Trio cancel)
            if not stream.ended:
                stream.ended = True
                stream.error = EngineError("The inference engine stopped this request.")
        except Exception as error:  # rejected or failed by vLLM (or the engine is dead)
            if not stream.ended:
                # vLLM has aborted it (or it never got in): nothing left to abort.
                stream.ended = stream.over_in_vllm = True
                stream.error = self._engine_error(error)

    async def _pump(
        self, request_id: str, prompt: Any, params: SamplingParams, stream: _Stream
    ) -> None:
        """asyncio: the request's outputs from ``AsyncLLM.generate`` to its sink.

        Stops early when the stream has ended (the sink raised, the output is
        an error): closing the generator aborts the request in vLLM.
        """
        outputs = self._llm.generate(prompt, params, request_id)
        async with contextlib.aclosing(outputs):
            async for output in outputs:
                completion = output.outputs[0]
                self._deliver(
                    stream,
                    completion.token_ids,
                    completion.finish_reason,
                    output.num_cached_tokens or 0,
                )
                if output.finished:
                    self._finished(stream)
                elif stream.ended:
                    return

    def _finished(self, stream: _Stream) -> None:
        """vLLM is done with the request."""
        stream.over_in_vllm = True
        if not stream.ended:
            stream.ended = True
            stream.done.set()

    def _deliver(
        self, stream: _Stream, tokens: Sequence[int], finish_reason: str | None, cached: int
    ) -> None:
        """One output of one request, on the Trio side."""
        if stream.ended:
            return
        if cached:
            stream.cached = cached
        if finish_reason is not None:
            stream.finish_reason = finish_reason
        if finish_reason == "error":
            # e.g. its grammar rejected a token: the output is not valid.
            stream.ended = True
            stream.error = EngineError("The inference engine failed this request.")
            stream.done.set()
            return
        if tokens:
            stream.produced += len(tokens)
            try:
                stream.context.run(stream.sink, tokens)
            except Exception as error:  # raised again in the request's own task
                stream.ended = True
                stream.error = error
                stream.done.set()

    def _sampling_params(self, request: GenerationRequest) -> SamplingParams:
        extra_args: dict[str, Any] | None = None
        if self._scripted:
            script = plan(request.prompt_token_ids, request.constraint)
            extra_args = {"script": list(script.tokens)}
            if script.delay_s:
                extra_args["delay_s"] = script.delay_s
        return SamplingParams(
            **sampling_kwargs(request.sampling),
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            skip_special_tokens=False,
            extra_args=extra_args,
            structured_outputs=structured_outputs(request.constraint),
            skip_clone=True,  # made for this request alone: vLLM copies it shallowly
        )

    async def _abort(self, request_id: str) -> None:
        """Abort the request in vLLM (idempotent there; unknown ids are ignored)."""
        try:
            await trio_asyncio.aio_as_trio(self._llm.abort)(request_id)
        except Exception as error:  # the engine is going (or gone): say so, go on
            logger.warning("could not abort vLLM request %s: %r", request_id, error)

    def _engine_error(self, error: BaseException) -> EngineError:
        if isinstance(error, EngineDeadError) or self._llm.errored:
            self._dead = True
            logger.error("the vLLM engine died: %s", error)
            return EngineError("The inference engine stopped working; the server needs a restart.")
        cause = error.__cause__ or error
        logger.warning("vLLM request failed: %r", cause)
        return EngineError(f"The inference engine failed this request: {cause}")

    async def aclose(self) -> None:
        """Abort what is running, then shut the engine core down (in a thread).

        The abort is bounded by the cleanup budget, the engine core's shutdown
        (processes to stop) by three times that; a shutdown that takes longer is
        left to finish in its thread (the process is on its way out).
        """
        with trio.move_on_after(self._cleanup_timeout_s):
            if self._running:
                with contextlib.suppress(Exception):
                    await trio_asyncio.aio_as_trio(self._llm.abort)(list(self._running))
        with trio.move_on_after(self._cleanup_timeout_s * 3):
            await trio.to_thread.run_sync(self._llm.shutdown, abandon_on_cancel=True)


def structured_outputs(constraint: OutputConstraint | None) -> StructuredOutputsParams | None:
    """vLLM's structured outputs for a constraint (applied to the whole output).

    The prompt ends with a prefilled header, so the grammar starts at the
    message body; once the text is complete it admits only the request's stop
    tokens (vLLM passes ``stop_token_ids`` to the grammar as its end tokens).
    Structured outputs need vLLM's tokenizer: do not set ``skip_tokenizer_init``.
    """
    fields = structured_outputs_fields(constraint)
    return None if fields is None else StructuredOutputsParams(**fields)


def log_public_bridge(reason: str) -> None:
    """The start-up line that says the public bridge runs, why, and what it costs."""
    logger.info(
        "vLLM bridge: public, a pump per request on AsyncLLM.generate (%s); it costs %s "
        "(docs/operations.md)",
        reason,
        PUBLIC_COST,
    )


__all__: Sequence[str] = ["VllmEngine", "log_public_bridge", "structured_outputs"]
