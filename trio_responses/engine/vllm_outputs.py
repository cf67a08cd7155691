"""vLLM's engine-core outputs, read by one Trio task instead of vLLM's asyncio tasks.

``AsyncLLM`` reads what its engine core process sends with two asyncio tasks:
one receives each message from the ZMQ output socket and queues it, the other
takes it from the queue and has the output processor fill every request's
collector. On the trio-asyncio loop an engine step then costs a chain of about
five asyncio callbacks (the socket's reader, pyzmq's bookkeeping, two task
wake-ups) and the Trio task steps that run them, and then a wake-up of our
dispatcher: more than ``AsyncLLM`` costs on plain asyncio
(`bench/vllm_floor.py`).

`OutputReader` does the same work in one Trio task: it waits on the socket's
file descriptor, receives and decodes each message, and hands its outputs to
`Steps.process` (`VllmEngine.process`: our requests' tokens straight to their
sinks, anything else through vLLM's output processor) in the same step. It
follows what vLLM 0.32's ``AsyncLLM._run_output_handler`` and
``AsyncMPClient._ensure_output_queue_task`` do: utility results go to their
futures, the engine's death message and a closed socket fail every request with
``EngineDeadError``, stop-string aborts go to the engine core, long batches are
processed in chunks of ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` with a checkpoint
between them.

It is used only where that is all there is to do (`claim_outputs`): vLLM 0.32,
one engine core client (no data parallelism), no stats logging, no fault
tolerance, no multi-modal cache. Elsewhere vLLM's own tasks read the outputs, as
before, and the log says why. Any failure of the reader (the socket's, the
decoder's, the processor's) fails every running request and leaves the engine
unhealthy, as a failure of vLLM's own tasks does; it never escapes into the
service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Protocol, final

import trio
import trio_asyncio
import vllm
import zmq
import zmq.asyncio
from vllm import envs
from vllm.v1.engine import EngineCoreOutput, core_client
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

logger = logging.getLogger("trio_responses.engine.vllm")


class Steps(Protocol):
    """What the engine does with each engine step's outputs (`VllmEngine` is one)."""

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

    Call before the first request (vLLM starts its tasks then). ``None``, and
    vLLM's own tasks read the outputs, for configurations it does not cover.
    """
    try:
        reason = _unsupported(llm)
    except AttributeError as error:  # vLLM's internals are not what this follows
        reason = f"vLLM's internals differ: {error}"
    if reason is not None:
        logger.info("vLLM's own asyncio tasks read its outputs (%s)", reason)
        return None
    logger.info("vLLM's outputs are read by a Trio task")
    return OutputReader(llm, loop)


FOLLOWS = "0.32."
"""The vLLM release whose output tasks `OutputReader` does the work of: other
releases keep their own tasks until the reader is checked against them."""


def _unsupported(llm: AsyncLLM) -> str | None:
    """Why `OutputReader` cannot replace vLLM's output tasks for ``llm``; ``None`` if it can."""
    if not vllm.__version__.startswith(FOLLOWS):
        return f"vLLM {vllm.__version__}; the reader follows {FOLLOWS}x"
    client: Any = llm.engine_core
    if type(client) is not core_client.AsyncMPClient:
        return f"engine core client {type(client).__name__}"
    if not callable(getattr(core_client, "_process_utility_output", None)):
        return "no _process_utility_output in vLLM"
    if not callable(getattr(llm.output_processor, "_finish_request", None)):
        return "no OutputProcessor._finish_request in vLLM"
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


__all__: Sequence[str] = ["OutputReader", "SocketMessages", "claim_outputs"]
