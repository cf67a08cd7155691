"""The response service: creates jobs, owns their tasks, serves their state.

`open_responses_service` opens the engine, the store and the nurseries; the
`ResponsesService` it yields is the whole API without HTTP::

    async with open_responses_service(Config()) as service:
        job = await service.create({"model": "gpt-oss-scripted", "input": "hello"})
        async for event in await service.subscribe(job.id):
            ...
        response = await service.wait(job.id)

Task tree (SPEC §2)::

    open_responses_service                  service nursery
    ├── maintenance                         expires retained logs and stored responses
    └── job nursery                         one task per response, foreground and background
        └── _run_job                        admission -> generate_response -> persist
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, final

import trio

from ._config import Config
from ._exceptions import (
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
    ServerBusyError,
    ShuttingDownError,
)
from ._generation import PromptPlan, generate_response
from .background.event_log import EventLog
from .background.job import Job
from .background.retention import StreamRetention
from .background.subscription import Subscription
from .engine import Engine, open_engine
from .harmony.encoding import get_encoding
from .harmony.prompt import PromptTools, ToolNamespace, render_request_prompt, tool_description
from .protocol.builder import request_echo
from .protocol.ids import IdPrefix, new_id
from .protocol.request import (
    CodeInterpreterTool,
    CreateRequest,
    InputItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpListToolsItem,
    MessageItem,
    WebSearchTool,
    check_includes,
    parse_create_request,
    parse_input_item,
)
from .store.base import ResponseStore, StoredResponse
from .store.memory import MemoryStore
from .tools.pool import ToolServer, ToolServerPool, ToolServerSpec
from .tools.toolbox import McpServerUse, Toolbox, check_request_tools

logger = logging.getLogger("trio_responses.service")

_ITEM_ID_PREFIX: dict[str, IdPrefix] = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "mcp_approval_response": "mcpr",
}

_CANNOT_CANCEL = {
    "completed": "Cannot cancel a completed response.",
    "failed": "Cannot cancel a failed response.",
    "incomplete": "Cannot cancel an incomplete response.",
}


@dataclass(frozen=True)
class ServiceStatistics:
    running_jobs: int
    """Jobs not yet finished (generating or waiting for a slot)."""
    active_jobs: int
    """Jobs generating now."""
    queued_jobs: int
    """Jobs waiting for a generation slot."""
    job_tasks: int
    """Tasks alive in the job nursery."""
    retained_streams: int
    """Finished background event logs kept for replay."""
    retained_stream_bytes: int
    """Bytes held by those logs."""
    subscribers: int
    """Open subscriptions on running or retained logs."""


@final
class ResponsesService:
    """Create, follow, retrieve, cancel and delete responses.

    Not constructed directly: use `open_responses_service`.
    """

    def __init__(
        self,
        *,
        config: Config,
        engine: Engine,
        store: ResponseStore,
        job_nursery: trio.Nursery,
        pool: ToolServerPool | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self.pool = pool or ToolServerPool([])
        self._nursery = job_nursery
        self._running: dict[str, Job] = {}
        self._retained = StreamRetention(
            max_streams=config.max_retained_streams,
            max_bytes=config.retained_stream_bytes,
            retention_s=config.stream_retention_s,
        )
        self._slots = trio.CapacityLimiter(config.max_active_jobs)
        self._accepting = True
        self._idle = trio.Event()
        self._idle.set()

    # -- queries -----------------------------------------------------------------------

    def statistics(self) -> ServiceStatistics:
        """An immutable snapshot of what the service holds right now."""
        jobs = [*self._running.values(), *self._retained]
        return ServiceStatistics(
            running_jobs=len(self._running),
            active_jobs=self._slots.borrowed_tokens,
            queued_jobs=self._slots.statistics().tasks_waiting,
            job_tasks=len(self._nursery.child_tasks),
            retained_streams=len(self._retained),
            retained_stream_bytes=self._retained.retained_bytes,
            subscribers=sum(job.log.subscribers for job in jobs),
        )

    async def wait_idle(self) -> None:
        """Wait until no job is running (every job task has ended)."""
        await self._idle.wait()

    def get_job(self, response_id: str, *, owner: str | None = None) -> Job | None:
        """The live job of a response: running, or finished with its log retained."""
        job = self._running.get(response_id) or self._retained.get(response_id)
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
            ShuttingDownError: `shutdown` has begun.
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
        check_request_tools(request, self.pool, config.mcp_allow_hosts)
        context = await self._previous_context(request, owner)
        input_items = [_stored_item(item) for item in request.input_items]
        if len(context) + len(input_items) > config.max_input_items:
            raise InvalidRequestError(
                f"Too many input items: {len(context) + len(input_items)} (including the "
                f"previous response's); this server accepts at most {config.max_input_items}.",
                param="input",
            )
        plan = self._plan(request, context, input_items)
        prompt = render_request_prompt(
            request,
            plan.items,
            date=plan.date,
            max_model_len=config.max_model_len,
            tools=plan.tools,
        )
        if not self._accepting:
            raise ShuttingDownError("The server is shutting down; retry on another replica.")
        if len(self._running) >= config.max_active_jobs + config.max_queued_jobs:
            raise ServerBusyError(
                f"The server is at capacity ({config.max_active_jobs} responses generating, "
                f"{config.max_queued_jobs} queued). Retry after a short wait."
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
        self._running[response_id] = job
        if self._idle.is_set():
            self._idle = trio.Event()
        job.builder.start()
        logger.info(
            "%s created (background=%s, stream=%s)",
            response_id,
            request.background,
            request.stream,
        )
        if request.background:
            await self.store.put(_record(job))
        self._nursery.start_soon(self._run_job, job, plan, name=f"job {response_id}")
        return job

    async def _previous_context(
        self, request: CreateRequest, owner: str | None
    ) -> list[dict[str, Any]]:
        previous_id = request.previous_response_id
        if previous_id is None:
            return []
        running = self._running.get(previous_id)
        if running is not None and running.owner == owner:
            if not running.finished:
                raise InvalidRequestError(
                    f"Previous response {previous_id!r} is still {running.status}; wait until "
                    "it has finished before continuing from it.",
                    param="previous_response_id",
                )
            await running.done.wait()  # finished: its final state is being stored now
        record = await self._load(previous_id, owner)
        if record is None:
            raise NotFoundError(
                f"Previous response with id {previous_id!r} not found.",
                param="previous_response_id",
            )
        return record.conversation()

    def _plan(
        self,
        request: CreateRequest,
        context: list[dict[str, Any]],
        input_items: list[dict[str, Any]],
    ) -> PromptPlan:
        """What the prompt needs: known tool namespaces, listings and approvals to do."""
        items = [parse_input_item(item) for item in (*context, *input_items)]
        hidden = request.tool_choice == "none"
        listed = {
            item.server_label: item.tools
            for item in items
            if isinstance(item, McpListToolsItem) and item.error is None
        }
        namespaces: list[ToolNamespace] = []
        to_list: list[str] = []
        for tool in [] if hidden else request.mcp_tools:
            use = McpServerUse.of(tool)
            if use.label not in listed:
                to_list.append(use.label)
                continue
            namespaces.append(
                ToolNamespace(
                    use.label,
                    use.description,
                    [
                        tool_description(
                            str(t.get("name")), t.get("description"), t.get("input_schema")
                        )
                        for t in listed[use.label]
                        if use.allows(str(t.get("name")))
                    ],
                )
            )
        requests = {item.id: item for item in items if isinstance(item, McpApprovalRequestItem)}
        labels = {tool.server_label for tool in request.mcp_tools}
        approvals = []
        for index, item in enumerate(request.input_items):
            if not isinstance(item, McpApprovalResponseItem):
                continue
            approval_request = requests.get(item.approval_request_id)
            if approval_request is None:
                raise InvalidRequestError(
                    f"No mcp_approval_request with id {item.approval_request_id!r} in this "
                    "conversation; answer a request from the previous response.",
                    param=f"input[{index}].approval_request_id",
                )
            if approval_request.server_label not in labels:
                raise InvalidRequestError(
                    f"The approved call is for MCP server {approval_request.server_label!r}; "
                    "declare that server in 'tools' again.",
                    param="tools",
                )
            approvals.append((item, approval_request))
        return PromptPlan(
            items=items,
            date=datetime.datetime.now(datetime.UTC).date().isoformat(),
            tools=PromptTools(
                python=not hidden
                and any(isinstance(t, CodeInterpreterTool) for t in request.tools),
                browser=not hidden and any(isinstance(t, WebSearchTool) for t in request.tools),
                namespaces=tuple(namespaces),
            ),
            to_list=tuple(to_list),
            approvals=tuple(approvals),
        )

    # -- run -------------------------------------------------------------------------------

    async def _run_job(self, job: Job, plan: PromptPlan) -> None:
        config = self.config
        try:
            async with trio.open_nursery() as sessions:
                toolbox = Toolbox(
                    job.request,
                    self.pool,
                    nursery=sessions,
                    tool_timeout_s=config.tool_timeout_s,
                    close_timeout_s=config.cleanup_timeout_s,
                )
                try:
                    with job.cancel_scope:
                        async with self._slots:
                            await generate_response(
                                job, self.engine, toolbox, plan, max_model_len=config.max_model_len
                            )
                except Exception:
                    logger.exception("%s failed with an internal error", job.id)
                    if not job.finished:
                        job.finish(
                            "failed",
                            error={
                                "code": "server_error",
                                "message": "The server had an internal error.",
                            },
                        )
                finally:
                    if not job.finished:  # our own nursery is being cancelled: shutting down
                        job.finish("failed", error=_SHUTDOWN_ERROR)
                    with trio.CancelScope(shield=True) as cleanup:
                        cleanup.deadline = trio.current_time() + config.cleanup_timeout_s * 2
                        await self._persist(job)
                        await toolbox.aclose()
                    sessions.cancel_scope.cancel()
        finally:
            del self._running[job.id]
            if job.background:
                self._retained.add(job)
            job.ended.set()
            if not self._running:
                self._idle.set()

    async def _persist(self, job: Job) -> None:
        logger.info("%s %s", job.id, job.status)
        try:
            if job.request.store:
                await self.store.put(_record(job))
        finally:
            job.done.set()

    # -- read ---------------------------------------------------------------------------------

    async def retrieve(self, response_id: str, *, owner: str | None = None) -> dict[str, Any]:
        """The Response object: live while running, from the store afterwards.

        Raises:
            NotFoundError: unknown, deleted, not stored (``store: false``), or
                created with another API key.
        """
        job = self.get_job(response_id, owner=owner)
        if job is not None and job.request.store and not job.done.is_set():
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

    async def subscribe(
        self, response_id: str, *, starting_after: int = -1, owner: str | None = None
    ) -> Subscription:
        """Follow a response's events after ``starting_after`` (-1: from the start).

        Replays what the log still holds, then follows live until the terminal
        event. Any response can be followed while it runs; once finished, only
        a background response's log is kept (``stream_retention_s``).

        Raises:
            NotFoundError: unknown response.
            InvalidRequestError: a finished foreground response, a log that is
                no longer retained, or ``starting_after`` older than the oldest
                retained event.
        """
        if starting_after < -1:
            raise InvalidRequestError(
                "'starting_after' must be a sequence number (>= 0).", param="starting_after"
            )
        job = self.get_job(response_id, owner=owner)
        if job is None:
            record = await self._load(response_id, owner)
            if record is None:
                raise _not_found(response_id)
            if not record.response.get("background"):
                raise _not_streamable(response_id)
            raise InvalidRequestError(
                f"The event stream of response {response_id!r} is no longer available: "
                f"events are kept {self.config.stream_retention_s:g} s after a response "
                "finishes. Retrieve the response without 'stream' instead.",
                param="stream",
                code="stream_expired",
            )
        oldest = job.log.oldest_sequence_number
        if starting_after + 1 < oldest:
            raise InvalidRequestError(
                f"Events up to {oldest - 1} of response {response_id!r} are no longer "
                f"retained; resume with starting_after >= {oldest - 1}.",
                param="starting_after",
                code="stream_expired",
            )
        return Subscription(job.log, starting_after)

    async def subscribe_background(
        self, response_id: str, *, starting_after: int = -1, owner: str | None = None
    ) -> Subscription:
        """`subscribe`, for ``GET ?stream=true``: background responses only."""
        job = self.get_job(response_id, owner=owner)
        if job is not None and not job.background:
            raise _not_streamable(response_id)
        return await self.subscribe(response_id, starting_after=starting_after, owner=owner)

    async def list_input_items(
        self,
        response_id: str,
        *,
        owner: str | None = None,
        after: str | None = None,
        limit: int = 20,
        order: Literal["asc", "desc"] = "desc",
        include: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """A page of the response's input items (OpenAI list shape)."""
        if not 1 <= limit <= 100:
            raise InvalidRequestError(
                f"Invalid 'limit': {limit}. It must be between 1 and 100.", param="limit"
            )
        check_includes(include)
        job = self.get_job(response_id, owner=owner)
        if job is not None and job.request.store:
            items = job.input_items
        else:
            record = await self._load(response_id, owner)
            if record is None:
                raise _not_found(response_id)
            items = record.input_items
        ordered = items if order == "asc" else items[::-1]
        start = 0
        if after is not None:
            positions = [i for i, item in enumerate(ordered) if item["id"] == after]
            if not positions:
                raise InvalidRequestError(
                    f"No input item with id {after!r} in response {response_id!r}.",
                    param="after",
                )
            start = positions[0] + 1
        page = ordered[start : start + limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(ordered),
        }

    # -- change ---------------------------------------------------------------------------------

    async def cancel(self, response_id: str, *, owner: str | None = None) -> dict[str, Any]:
        """Cancel a background response: it ends ``cancelled`` at once.

        Every reader gets the terminal event immediately; aborting the engine
        request and closing tool sessions happen in the job's own cleanup, which
        this never waits for. Cancelling a cancelled response returns it again.

        Raises:
            NotFoundError: unknown response.
            InvalidRequestError: a foreground response, or one that already
                completed, failed or ended incomplete.
        """
        job = self.get_job(response_id, owner=owner)
        if job is not None:
            response = job.snapshot()
        else:
            record = await self._load(response_id, owner)
            if record is None:
                raise _not_found(response_id)
            response = record.response
        if not response.get("background"):
            raise InvalidRequestError("Cannot cancel a synchronous response.", param="response_id")
        status = response["status"]
        if status in _CANNOT_CANCEL:
            raise InvalidRequestError(_CANNOT_CANCEL[status], param="response_id")
        if job is not None and not job.finished:
            job.cancel()
            logger.info("%s cancelled by request", job.id)
            return job.snapshot()
        return response

    async def delete(self, response_id: str, *, owner: str | None = None) -> dict[str, Any]:
        """Delete a finished stored response (and its retained event log).

        Raises:
            NotFoundError: unknown response.
            InvalidRequestError: the response is still running.
        """
        running = self._running.get(response_id)
        if running is not None and running.owner == owner and not running.finished:
            raise InvalidRequestError(
                f"Response {response_id!r} is still {running.status}; cancel it or wait for "
                "it to finish before deleting it.",
                param="response_id",
            )
        if running is not None and running.owner == owner:
            await running.done.wait()  # finished: let its final state land first
        if await self._load(response_id, owner) is None:
            raise _not_found(response_id)
        await self.store.delete(response_id)
        self._retained.discard(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    # -- lifecycle ------------------------------------------------------------------------------

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking responses, give running ones ``grace_s`` to finish, then end them.

        Responses still running after the grace period end ``failed`` with code
        ``server_shutdown`` (their readers get that terminal event) and are
        persisted. Returns once every job task has finished its cleanup.
        """
        self._accepting = False
        with trio.move_on_after(grace_s):
            await self.wait_idle()
        for job in list(self._running.values()):
            job.abort(_SHUTDOWN_ERROR["code"], _SHUTDOWN_ERROR["message"])
        with trio.move_on_after(self.config.cleanup_timeout_s * 3):
            await self.wait_idle()

    async def _maintain(self) -> None:
        """Expire retained logs and stored responses. Never returns unless cancelled."""
        interval = min(max(self.config.stream_retention_s / 10, 0.05), 30.0)
        while True:
            await trio.sleep(interval)
            self._retained.expire()
            expire = getattr(self.store, "expire", None)
            if expire is not None:
                expire()

    async def _load(self, response_id: str, owner: str | None) -> StoredResponse | None:
        record = await self.store.get(response_id)
        if record is None or record.owner != owner:
            return None
        return record


_SHUTDOWN_ERROR = {
    "code": "server_shutdown",
    "message": "The server shut down before the response finished.",
}


def _not_found(response_id: str) -> NotFoundError:
    return NotFoundError(f"Response with id {response_id!r} not found.", param="response_id")


def _not_streamable(response_id: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Response {response_id!r} was not created with background=true; only background "
        "responses can be streamed again. Retrieve it without 'stream'.",
        param="stream",
    )


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


@asynccontextmanager
async def open_responses_service(config: Config) -> AsyncIterator[ResponsesService]:
    """Start the engine, the store and the nurseries; stop them all on exit.

    On exit, running jobs are cancelled and end ``failed`` (``server_shutdown``);
    call `ResponsesService.shutdown` first to give them time to finish.
    """
    store = MemoryStore(max_responses=config.max_stored_responses, ttl_s=config.store_ttl_s)
    # Loading the harmony vocabulary takes a few hundred milliseconds (or a download):
    # do it now, off the event loop, rather than inside the first request.
    await trio.to_thread.run_sync(get_encoding)
    pool = ToolServerPool(
        [
            ToolServer(
                ToolServerSpec.parse(spec),
                connect_timeout_s=config.tool_timeout_s,
                close_timeout_s=config.cleanup_timeout_s,
            )
            for spec in config.all_tool_servers
        ]
    )
    try:
        async with open_engine(config) as engine, trio.open_nursery() as root:
            await root.start(pool.run)
            maintenance = trio.CancelScope()
            async with trio.open_nursery() as jobs:
                service = ResponsesService(
                    config=config, engine=engine, store=store, job_nursery=jobs, pool=pool
                )
                root.start_soon(_run_in, maintenance, service._maintain)
                logger.info("serving %r with the %s", config.model_name, engine.info.description)
                try:
                    yield service
                finally:
                    jobs.cancel_scope.cancel()
            # Tool servers get a polite goodbye (bounded); the rest stops now.
            maintenance.cancel()
            pool.close()
            root.cancel_scope.deadline = trio.current_time() + config.cleanup_timeout_s
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()


async def _run_in(scope: trio.CancelScope, function: Callable[[], Awaitable[None]]) -> None:
    with scope:
        await function()
