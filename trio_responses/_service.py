"""The response service: creates jobs, owns their tasks, serves their state.

`open_responses_service` opens the engine, the store and the job nursery; the
`ResponsesService` it yields is the whole API without HTTP::

    async with open_responses_service(Config()) as service:
        job = await service.create({"model": "gpt-oss-scripted", "input": "hello"})
        async for event in service.subscribe(job.id):
            ...
        response = await service.wait(job.id)

Task tree (SPEC §2)::

    open_responses_service          (root nursery)
    └── job nursery: one task per response, foreground and background
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, final

import trio

from ._config import Config
from ._exceptions import (
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
    ServerBusyError,
)
from ._generation import generate_response
from .background.event_log import EventLog
from .background.job import Job
from .background.subscription import Subscription
from .engine import Engine, open_engine
from .harmony.encoding import get_encoding
from .harmony.prompt import build_conversation, render_prompt
from .protocol.builder import request_echo
from .protocol.ids import IdPrefix, new_id
from .protocol.request import (
    CreateRequest,
    InputItem,
    MessageItem,
    parse_create_request,
    parse_input_item,
)
from .store.base import ResponseStore, StoredResponse
from .store.memory import MemoryStore

logger = logging.getLogger("trio_responses.service")

_ITEM_ID_PREFIX: dict[str, IdPrefix] = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "mcp_approval_response": "mcpr",
}


@dataclass(frozen=True)
class ServiceStatistics:
    live_jobs: int
    """Jobs whose state is held in memory (running, or finished and retained)."""
    running_jobs: int
    """Jobs not yet finished (generating or waiting for a slot)."""
    active_jobs: int
    """Jobs generating now."""
    queued_jobs: int
    """Jobs waiting for a generation slot."""
    job_tasks: int
    """Tasks alive in the job nursery."""


@final
class ResponsesService:
    """Create, follow, retrieve responses. Use `open_responses_service` to get one."""

    def __init__(
        self,
        *,
        config: Config,
        engine: Engine,
        store: ResponseStore,
        job_nursery: trio.Nursery,
    ) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self._nursery = job_nursery
        self._jobs: dict[str, Job] = {}
        self._slots = trio.CapacityLimiter(config.max_active_jobs)
        self._admitted = 0  # jobs created and not yet finished

    # -- queries -----------------------------------------------------------------------

    def statistics(self) -> ServiceStatistics:
        """An immutable snapshot of what the service holds right now."""
        return ServiceStatistics(
            live_jobs=len(self._jobs),
            running_jobs=self._admitted,
            active_jobs=self.active_jobs,
            queued_jobs=self.queued_jobs,
            job_tasks=len(self._nursery.child_tasks),
        )

    @property
    def active_jobs(self) -> int:
        """Jobs generating right now."""
        return self._slots.borrowed_tokens

    @property
    def queued_jobs(self) -> int:
        """Jobs waiting for a generation slot."""
        return self._slots.statistics().tasks_waiting

    def get_job(self, response_id: str, *, owner: str | None = None) -> Job | None:
        """The live job of a response (running, or finished and still retained)."""
        job = self._jobs.get(response_id)
        if job is None or job.owner != owner:
            return None
        return job

    # -- create --------------------------------------------------------------------------

    async def create(
        self, request: Mapping[str, Any] | CreateRequest, *, owner: str | None = None
    ) -> Job:
        """Validate ``request`` and start its job; returns at once.

        The job's ``response.created`` event is already in its log when this
        returns, so subscribing from the start never misses anything.

        Raises:
            InvalidRequestError, ModelNotFoundError, NotFoundError: bad request.
            ServerBusyError: every generation slot and queue place is taken.
        """
        if not isinstance(request, CreateRequest):
            request = parse_create_request(
                dict(request) if isinstance(request, Mapping) else request
            )
        config = self.config
        if request.model not in config.model_names:
            served = ", ".join(repr(name) for name in config.model_names)
            raise ModelNotFoundError(
                f"The model {request.model!r} does not exist on this server. "
                f"Served models: {served}.",
                param="model",
            )
        if len(request.tools) > config.max_tools:
            raise InvalidRequestError(
                f"Too many tools: {len(request.tools)}; this server accepts at most "
                f"{config.max_tools}.",
                param="tools",
            )
        context = await self._previous_context(request, owner)
        input_items = [_stored_item(item) for item in request.input_items]
        if len(context) + len(input_items) > config.max_input_items:
            raise InvalidRequestError(
                f"Too many input items: {len(context) + len(input_items)} (including the "
                f"previous response's); this server accepts at most {config.max_input_items}.",
                param="input",
            )
        prompt = self._render(request, context, input_items)
        if self._admitted >= config.max_active_jobs + config.max_queued_jobs:
            raise ServerBusyError(
                "The server is at capacity: every generation slot and queue place is taken. "
                "Retry after a short wait."
            )
        response_id = new_id("resp")
        job = Job(
            response_id=response_id,
            request=request,
            model=config.model_name,
            prompt_tokens=prompt,
            input_items=input_items,
            context=context,
            owner=owner,
            created_at=float(int(time.time())),
            echo=request_echo(request),
            log=EventLog(max_events=config.replay_events, max_bytes=config.replay_bytes),
        )
        self._jobs[response_id] = job
        self._admitted += 1
        job.builder.start()
        logger.info(
            "%s created (background=%s, stream=%s)", response_id, request.background, request.stream
        )
        self._nursery.start_soon(self._run_job, job, name=f"job {response_id}")
        return job

    async def _previous_context(
        self, request: CreateRequest, owner: str | None
    ) -> list[dict[str, Any]]:
        previous_id = request.previous_response_id
        if previous_id is None:
            return []
        job = self.get_job(previous_id, owner=owner)
        if job is not None and not job.builder.finished:
            raise InvalidRequestError(
                f"Previous response {previous_id!r} is still {job.status}; wait until it "
                "has finished before continuing from it.",
                param="previous_response_id",
            )
        record = await self._load(previous_id, owner)
        if record is None:
            raise NotFoundError(
                f"Previous response with id {previous_id!r} not found.",
                param="previous_response_id",
            )
        return record.conversation()

    def _render(
        self,
        request: CreateRequest,
        context: list[dict[str, Any]],
        input_items: list[dict[str, Any]],
    ) -> list[int]:
        items = [parse_input_item(item) for item in (*context, *input_items)]
        date = datetime.datetime.now(datetime.UTC).date().isoformat()
        limit = self.config.max_model_len
        while True:
            prompt = render_prompt(build_conversation(request, items, date=date))
            if len(prompt) < limit:
                return prompt
            if request.truncation != "auto" or len(items) <= 1:
                raise InvalidRequestError(
                    f"The input is {len(prompt)} tokens, which leaves no room for output in "
                    f"this model's context window of {limit} tokens. Shorten the input, or "
                    "set 'truncation' to 'auto' to drop the oldest items.",
                    param="input",
                    code="context_length_exceeded",
                )
            items = _drop_oldest(items)

    # -- run -------------------------------------------------------------------------------

    async def _run_job(self, job: Job) -> None:
        builder = job.builder
        try:
            with job.cancel_scope:
                async with self._slots:
                    await generate_response(
                        job, self.engine, max_model_len=self.config.max_model_len
                    )
        except Exception:
            logger.exception("%s failed with an internal error", job.id)
            if not builder.finished:
                builder.finish(
                    "failed",
                    now=time.time(),
                    error={"code": "server_error", "message": "The server had an internal error."},
                )
        finally:
            if not builder.finished:
                if job.cancel_requested:
                    builder.finish("cancelled", now=time.time())
                else:  # our own nursery is being cancelled: the service is closing
                    builder.finish(
                        "failed",
                        now=time.time(),
                        error={
                            "code": "server_shutdown",
                            "message": "The server shut down before the response finished.",
                        },
                    )
            with trio.CancelScope(shield=True) as cleanup:
                cleanup.deadline = trio.current_time() + self.config.cleanup_timeout_s
                await self._finish(job)

    async def _finish(self, job: Job) -> None:
        self._admitted -= 1
        logger.info("%s %s", job.id, job.status)
        try:
            if job.request.store:
                await self.store.put(_record(job))
        finally:
            job.log.close()
            job.done.set()
            if not job.background:
                self._jobs.pop(job.id, None)

    # -- read ---------------------------------------------------------------------------------

    async def retrieve(self, response_id: str, *, owner: str | None = None) -> dict[str, Any]:
        """The Response object: live while running, from the store afterwards.

        Raises:
            NotFoundError: unknown, deleted, not stored (``store: false``), or
                created with another API key.
        """
        job = self.get_job(response_id, owner=owner)
        if job is not None and job.request.store:
            return job.snapshot()
        record = await self._load(response_id, owner)
        if record is None:
            raise _not_found(response_id)
        return record.response

    async def wait(self, response_id: str, *, owner: str | None = None) -> dict[str, Any]:
        """Wait for the response to finish and return it (even if not stored).

        Cancellation: only the wait is cancelled, never the job.
        """
        job = self.get_job(response_id, owner=owner)
        if job is None:
            return await self.retrieve(response_id, owner=owner)
        await job.done.wait()
        return job.snapshot()

    def subscribe(
        self, response_id: str, *, starting_after: int = -1, owner: str | None = None
    ) -> Subscription:
        """Follow a live job's events after ``starting_after`` (-1: from the start).

        Raises:
            NotFoundError: no live job with this id.
        """
        job = self.get_job(response_id, owner=owner)
        if job is None:
            raise _not_found(response_id)
        return Subscription(job.log, starting_after)

    async def _load(self, response_id: str, owner: str | None) -> StoredResponse | None:
        record = await self.store.get(response_id)
        if record is None or record.owner != owner:
            return None
        return record


def _not_found(response_id: str) -> NotFoundError:
    return NotFoundError(f"Response with id {response_id!r} not found.", param="response_id")


def _record(job: Job) -> StoredResponse:
    return StoredResponse(
        response=job.snapshot(),
        input_items=job.input_items,
        context=job.context,
        owner=job.owner,
    )


def _stored_item(item: InputItem) -> dict[str, Any]:
    """An input item as stored and listed: typed, with an id, content as parts."""
    stored: dict[str, Any] = item.model_dump(exclude_none=True, by_alias=True)
    if isinstance(item, MessageItem):
        stored["type"] = "message"
        part_type = "output_text" if item.role == "assistant" else "input_text"
        if isinstance(item.content, str):
            part: dict[str, Any] = {"type": part_type, "text": item.content}
            if part_type == "output_text":
                part["annotations"] = []
            stored["content"] = [part]
        stored.setdefault("status", "completed")
    if "id" not in stored:
        stored["id"] = new_id(_ITEM_ID_PREFIX.get(stored["type"], "msg"))
    return stored


def _drop_oldest(items: list[InputItem]) -> list[InputItem]:
    """Drop the oldest item, and any tool outputs left without their call."""
    rest = items[1:]
    while rest and getattr(rest[0], "type", None) == "function_call_output":
        rest = rest[1:]
    return rest or items[-1:]


@asynccontextmanager
async def open_responses_service(config: Config) -> AsyncIterator[ResponsesService]:
    """Start the engine, the store and the job nursery; stop them all on exit.

    On exit, running jobs are cancelled and end ``failed`` (``server_shutdown``).
    """
    store = MemoryStore(max_responses=config.max_stored_responses, ttl_s=config.store_ttl_s)
    # Loading the harmony vocabulary takes a few hundred milliseconds (or a download):
    # do it now, off the event loop, rather than inside the first request.
    await trio.to_thread.run_sync(get_encoding)
    try:
        async with open_engine(config) as engine, trio.open_nursery() as nursery:
            service = ResponsesService(
                config=config, engine=engine, store=store, job_nursery=nursery
            )
            logger.info("serving %r with the %s", config.model_name, engine.info.description)
            try:
                yield service
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()
