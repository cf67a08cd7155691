"""Running jobs: admission, generation slots, the registry, recording, shutdown.

`JobRunner.start` starts one job with ``nursery.start``: the job's task
registers the job, records it (``queued``), emits ``response.created`` and only
then reports started. A create that fails or is cancelled before that point
leaves nothing behind: no registered job, no record, no task.

Admission: at most ``max_active_jobs`` responses generate at once and
``max_queued_jobs`` more wait; beyond, 429. With API keys, each key (owner) may
also be held to ``max_active_jobs_per_key`` generating and
``max_queued_jobs_per_key`` more waiting (429 for that key only). A key's
responses wait for one of the key's own slots before they queue for a
server-wide one, so a key holds at most its own number of server slots, and the
responses of other keys go past its queue.

Task tree (SPEC §2)::

    job nursery                     owned by open_responses_service
    └── _run (one per response)     record -> created -> slot -> generate -> record
        └── sessions nursery        recorder.follow, MCP session owners, tool calls
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, final

import trio

from ._cleanup import Cleanup
from ._config import Config
from ._exceptions import RequestTooLargeError, ServerBusyError, ShuttingDownError
from ._faults import faults_handled
from ._generation import PromptPlan, generate_response
from ._lease import ConversationTurn
from ._logging import RESPONSE_ID
from ._prepare import PreparedRequest
from ._principal import Principal
from ._recorder import Recorder
from .background.event_log import EventLog
from .background.job import Job
from .background.subscription import LogSubscription, Subscription
from .engine import Engine
from .metrics import Metrics, ResponseTimer
from .protocol import errors
from .protocol.builder import request_echo
from .protocol.ids import new_id
from .protocol.lifecycle import Status
from .store.base import State, StoredResponse, StoreLimits, first_record_bound, measure_record
from .tools.budget import RunSlots
from .tools.containers import ContainerRuntime, ResponseContainer
from .tools.pool import ToolServerPool
from .tools.toolbox import Toolbox

logger = logging.getLogger("trio_responses.jobs")

SHUTDOWN_ERROR = errors.server_error(
    "The server shut down before the response finished.", errors.SERVER_SHUTDOWN
)
_INTERNAL_ERROR = errors.server_error("The server had an internal error.")
_MAX_UNRECORDED = 10_000
"""Finished jobs kept for another try at recording them, at most (the oldest go)."""
RECENT_JOBS = 100
"""Finished jobs remembered for operator views (`JobRunner.recent`), at most."""


@final
@dataclass(frozen=True)
class FinishedJob:
    """What an operator sees of a job that finished here (`JobRunner.recent`)."""

    id: str
    model: str
    """The model name the request used."""
    owner: str | None
    background: bool
    stored: bool
    status: Status
    created_at: int
    ended_at: float
    """Unix time at which its task ended."""
    output_tokens: int
    usage: dict[str, Any] | None
    error: dict[str, Any] | None


@final
class _Tenant:
    """The jobs of one owner (API key) running here, and its generation slots."""

    def __init__(self, slots: int | None) -> None:
        self.running = 0
        """Its jobs registered and not yet ended."""
        self.slots = trio.CapacityLimiter(slots) if slots is not None else None
        """At most this many of its jobs generate at once (None: no limit of its own)."""


@final
class _Started:
    """A `trio.TaskStatus` that remembers whether its task reported started."""

    def __init__(self, status: trio.TaskStatus[None]) -> None:
        self._status = status
        self.reported = False

    def started(self, value: None = None) -> None:
        self.reported = True
        self._status.started(value)


async def _beside(
    job: Job,
    name: str,
    task: Callable[..., Awaitable[None]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``task``, one of ``job``'s tasks beside its generation (recording it, keeping
    its conversation's lease), as part of the job's fault boundary: once it has
    started, anything it raises (but cancellation and shutdown) ends the response
    ``failed`` (``server_error``), is logged once, and goes no further."""
    status = _Started(task_status)

    def failed(fault: BaseException) -> None:
        if not status.reported:
            raise fault  # before it began: the job's start fails with it
        logger.error("%s: its %s failed", job.id, name, exc_info=fault)
        job.abort(_INTERNAL_ERROR)

    with faults_handled(failed):
        await task(task_status=status)


def _generation_failed(job: Job, fault: BaseException) -> None:
    logger.error("%s failed with an internal error", job.id, exc_info=fault)
    if not job.finished:
        job.finish("failed", error=_INTERNAL_ERROR)


@final
class _GenerationSlot:
    """Holds, for one job, its owner's slot (if limited) and then a server-wide one.

    The owner's slot comes first, so a job waiting for it stays out of the
    server-wide queue, where it would hold up the responses of other owners.
    Entered and exited by the job's own task (a `trio.CapacityLimiter` borrower).
    """

    def __init__(self, server: trio.CapacityLimiter, tenant: trio.CapacityLimiter | None) -> None:
        self._server = server
        self._tenant = tenant

    async def __aenter__(self) -> None:
        if self._tenant is not None:
            await self._tenant.acquire()
        try:
            await self._server.acquire()
        except BaseException:
            if self._tenant is not None:
                self._tenant.release()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._server.release()
        if self._tenant is not None:
            self._tenant.release()


@final
@dataclass(frozen=True)
class ResponseHandle:
    """A response its creator has just started. Returned by `ResponsesService.create`.

    The creator may follow it from its first event, wait for it, or, for a
    foreground response, abandon it (its client went away).
    """

    id: str
    background: bool
    stream: bool
    _job: Job = field(repr=False, compare=False)
    _created: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, job: Job, created: dict[str, Any] | None = None) -> ResponseHandle:
        return cls(job.id, job.background, job.request.stream, job, created)

    @property
    def created(self) -> dict[str, Any]:
        """The Response object as created (``queued``), what a background create
        without ``stream`` returns: its job may have begun by the time the creator
        answers. As it stands now for a handle not made by the create."""
        return self._created if self._created is not None else self._job.snapshot()

    @property
    def status(self) -> Status:
        """The status now."""
        return self._job.status

    @property
    def response(self) -> dict[str, Any]:
        """The Response object as it stands now."""
        return self._job.snapshot()

    def subscribe(self) -> Subscription:
        """Follow the response from its first event (``response.created``)."""
        return LogSubscription(self._job.log, -1)

    async def wait(self) -> dict[str, Any]:
        """Wait until the response is finished and recorded; return it.

        Cancellation: only the wait is cancelled, never the response.
        """
        await self._job.done.wait()
        return self._job.snapshot()

    async def wait_closed(self) -> None:
        """Wait until the job's task is gone (tool sessions closed, engine request ended)."""
        await self._job.ended.wait()

    def abandon(self) -> None:
        """The client of a foreground response went away: stop it. No-op for background."""
        if not self.background:
            self._job.cancel()


@final
class JobRunner:
    """Owns the job tasks. Not constructed directly: `open_responses_service` makes one."""

    def __init__(
        self,
        *,
        config: Config,
        engine: Engine,
        pool: ToolServerPool,
        state: State,
        nursery: trio.Nursery,
        metrics: Metrics | None = None,
        python_slots: RunSlots | None = None,
        containers: ContainerRuntime | None = None,
    ) -> None:
        """``python_slots``: what bounds the bundled code interpreter's runs at once
        (None: nothing here; the tool server's own limits, if any); ``containers``:
        where its calls run (``--code-interpreter``)."""
        self._config = config
        self._python_slots = python_slots
        self._containers = containers
        self._engine = engine
        self._pool = pool
        self._state = state
        self._nursery = nursery
        self._metrics = metrics or Metrics(
            model=config.model_name, engine=config.engine, process=False
        )
        self._running: dict[str, Job] = {}
        self._unrecorded: dict[str, Recorder] = {}
        """Finished jobs whose final state the store refused; maintenance retries them."""
        self._slots = trio.CapacityLimiter(config.max_active_jobs)
        self._store_limits = StoreLimits.of(config)
        per_key = bool(config.api_keys)
        self._key_slots = config.max_active_jobs_per_key if per_key else None
        """Most jobs of one owner generating at once (None: no limit of its own)."""
        self._key_jobs: int | None = None
        """Most unfinished jobs of one owner (None: no limit of its own)."""
        if per_key and (
            config.max_active_jobs_per_key is not None or config.max_queued_jobs_per_key is not None
        ):
            self._key_jobs = (config.max_active_jobs_per_key or config.max_active_jobs) + (
                config.max_queued_jobs
                if config.max_queued_jobs_per_key is None
                else config.max_queued_jobs_per_key
            )
        self._tenants: dict[str | None, _Tenant] = {}
        """Owners with jobs (or `counted` work) here (none without)."""
        self._counted = 0
        """Work under `counted`, which takes a place as a job would."""
        self._recent: deque[FinishedJob] = deque(maxlen=RECENT_JOBS)
        self._finished_tokens: dict[str, int] = {}
        """Output tokens of the jobs that finished here, by requested model name."""
        self._accepting = True
        self._closing = Cleanup(config.cleanup_timeout_s)
        """The service's closing: once it begins (`close`), every job's cleanup ends
        within the cleanup budget of that moment."""
        self._idle = trio.Event()
        self.background_recorded: Callable[[], None] = lambda: None
        """Called when a background response's final record has been written (the
        webhook sender looks at the outbox at once, instead of at its next poll)."""
        self._idle.set()

    # -- queries ------------------------------------------------------------------------

    def get(self, response_id: str, who: Principal, *, stored_only: bool = True) -> Job | None:
        """The job of ``response_id`` if it runs here and ``who`` may see it.

        A ``store: false`` response is nobody's to look up by id (only its creator,
        through its handle, sees it), unless ``stored_only`` is False.
        """
        job = self._running.get(response_id)
        if job is None or not who.may_see(job.owner) or (stored_only and not job.request.store):
            return None
        return job

    def jobs(self) -> list[Job]:
        """Every job running here, whoever owns it (operator views)."""
        return list(self._running.values())

    def recent(self) -> list[FinishedJob]:
        """The jobs that finished here last (at most `RECENT_JOBS`), newest first."""
        return list(reversed(self._recent))

    def output_tokens(self) -> dict[str, int]:
        """Output tokens generated here since start, by requested model name (running
        jobs' tokens so far included): a counter that only grows."""
        totals = dict(self._finished_tokens)
        for job in self._running.values():
            model = job.request.model
            totals[model] = totals.get(model, 0) + job.generated_tokens
        return totals

    def owner_of(self, response_id: str) -> tuple[str | None] | None:
        """``(owner,)`` of a response running or recently finished here, else None."""
        job = self._running.get(response_id)
        if job is not None:
            return (job.owner,)
        for finished in self._recent:
            if finished.id == response_id:
                return (finished.owner,)
        return None

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def unrecorded(self) -> int:
        """Finished jobs whose final state waits for another try (`retry_unrecorded`)."""
        return len(self._unrecorded)

    @property
    def active(self) -> int:
        return int(self._slots.borrowed_tokens)

    @property
    def queued(self) -> int:
        """Jobs waiting for a generation slot: their owner's or a server-wide one."""
        waiting = self._slots.statistics().tasks_waiting
        for tenant in self._tenants.values():
            if tenant.slots is not None:
                waiting += tenant.slots.statistics().tasks_waiting
        return waiting

    @property
    def tasks(self) -> int:
        return len(self._nursery.child_tasks)

    @property
    def subscribers(self) -> int:
        return sum(job.log.subscribers for job in self._running.values())

    async def wait_idle(self) -> None:
        """Wait until no job is running (every job task has ended)."""
        await self._idle.wait()

    # -- start ---------------------------------------------------------------------------

    async def start(
        self,
        prepared: PreparedRequest,
        *,
        owner: str | None,
        turn: ConversationTurn | None = None,
    ) -> ResponseHandle:
        """Start the job of ``prepared``; returns once it is recorded and has emitted
        ``response.created``.

        ``turn``: the conversation the response runs on (its lock, taken for
        ``turn.response_id``, the response's id): the job renews it while it runs
        and, once its final state is recorded, lets it update the conversation.

        Raises:
            ServerBusyError: every generation slot and queue place is taken (code
                ``server_busy``), or every one of this owner's (API key's) is
                (code ``rate_limit_exceeded``).
            RequestTooLargeError: the response is to be stored and its record is
                larger than this owner's share of the store before any output.
            ShuttingDownError: `shutdown` has begun.
            StoreError: the response could not be recorded.
        """
        config = self._config
        self._admit(owner)
        request = prepared.request
        response_id = new_id("resp") if turn is None else turn.response_id
        job = Job(
            response_id=response_id,
            request=request,
            model=config.model_name,
            prompt_tokens=prepared.prompt_tokens,
            input_items=prepared.input_items,
            owner=owner,
            created_at=int(time.time()),
            echo=request_echo(request),
            log=EventLog(
                max_events=config.replay_events,
                max_bytes=config.replay_bytes,
                flush_s=config.stream_flush_ms / 1000,
            ),
        )
        job.builder.seal_reasoning = prepared.seal_reasoning
        container = self._container_of(prepared, owner)
        if container is not None:
            job.builder.item_fields.update(container.item_fields())
        if request.store:
            await self._check_store_share(job, prepared.request_bytes)
            self._admit(owner)  # again: other creates may have been admitted meanwhile
        # Registered before the next checkpoint, so concurrent creates see its place
        # taken; from its first step on, the job's task owns the registration.
        self._register(job)
        task_began = False

        async def run(*, task_status: trio.TaskStatus[dict[str, Any] | None]) -> None:
            nonlocal task_began
            task_began = True
            await self._run(job, prepared.plan, turn, container, task_status=task_status)

        try:
            created = await self._nursery.start(run, name=f"job {response_id}")
        except BaseException:
            if not task_began:
                self._unregister(job)
            elif not job.background and self._running.get(job.id) is job:
                job.cancel()  # cancelled just after it started: its creator is gone
            raise
        return ResponseHandle.of(job, created)

    def _admit(self, owner: str | None) -> None:
        """Refuse a new job when the server, or this owner, has no place for it."""
        config = self._config
        if not self._accepting:
            raise ShuttingDownError("The server is shutting down; retry on another replica.")
        if len(self._running) + self._counted >= config.max_active_jobs + config.max_queued_jobs:
            raise ServerBusyError(
                f"The server is at capacity ({config.max_active_jobs} responses generating, "
                f"{config.max_queued_jobs} queued). Retry after a short wait."
            )
        tenant = self._tenants.get(owner)
        if self._key_jobs is not None and tenant is not None and tenant.running >= self._key_jobs:
            raise ServerBusyError(
                f"This API key has {tenant.running} unfinished responses, as many as one key "
                f"may have at once ({self._key_jobs}: --max-active-jobs-per-key generating "
                "plus --max-queued-jobs-per-key waiting). Retry once some have finished, or "
                "cancel a background response.",
                code=errors.RATE_LIMIT_EXCEEDED,
            )

    async def _check_store_share(self, job: Job, request_bytes: int | None) -> None:
        """Refuse a response whose record, as first stored, would not fit its owner's
        share of the store: it would evict everything the owner has and still be
        over the bound. (One that grows past the share as it generates is kept,
        alone: see `StoreLimits`.) ``request_bytes``: the size of the request's
        JSON, where known; when its bound fits, nothing is measured."""
        limits = self._store_limits
        if (
            request_bytes is not None
            and first_record_bound(request_bytes, len(job.input_items)) <= limits.share_bytes
        ):
            return
        size = await measure_record(StoredResponse(job.snapshot(), job.input_items, job.owner))
        if size <= limits.share_bytes:
            return
        if limits.per_owner:
            share = (
                f"the {limits.share_bytes} bytes each API key may keep stored "
                f"(--max-store-bytes {limits.max_bytes} shared between {limits.keys} keys)"
            )
        else:
            share = f"the {limits.share_bytes} bytes the store keeps (--max-store-bytes)"
        raise RequestTooLargeError(
            f"This response would take {size} bytes in the response store before any "
            f"output, more than {share}. Send less input, or create it with store: false.",
            param="input",
            code=errors.STORE_LIMIT_EXCEEDED,
        )

    @contextmanager
    def counted(self, owner: str | None) -> Iterator[None]:
        """Hold a job's place for ``owner`` while work that is not a job runs for it
        (counting input tokens, preparing a compaction: rendering that a client
        could otherwise repeat at will), against the server's and the owner's
        limits alike.

        Raises:
            ServerBusyError, ShuttingDownError: as `start`, no place is free.
        """
        self._admit(owner)
        self._counted += 1
        self._enter_tenant(owner)
        try:
            yield
        finally:
            self._counted -= 1
            self._leave_tenant(owner)

    def _register(self, job: Job) -> None:
        self._running[job.id] = job
        self._enter_tenant(job.owner)
        if self._idle.is_set():
            self._idle = trio.Event()

    def _unregister(self, job: Job) -> None:
        del self._running[job.id]
        self._leave_tenant(job.owner)
        job.ended.set()
        if not self._running:
            self._idle.set()
        if job.finished:
            self._remember(job)

    def _enter_tenant(self, owner: str | None) -> None:
        tenant = self._tenants.get(owner)
        if tenant is None:
            tenant = self._tenants[owner] = _Tenant(self._key_slots)
        tenant.running += 1

    def _leave_tenant(self, owner: str | None) -> None:
        tenant = self._tenants[owner]
        tenant.running -= 1
        if not tenant.running:
            del self._tenants[owner]

    def _remember(self, job: Job) -> None:
        """Keep what operators see of a finished job, and count its tokens."""
        model = job.request.model
        self._finished_tokens[model] = self._finished_tokens.get(model, 0) + job.generated_tokens
        response = job.snapshot()
        self._recent.append(
            FinishedJob(
                id=job.id,
                model=model,
                owner=job.owner,
                background=job.background,
                stored=job.request.store,
                status=job.status,
                created_at=int(response["created_at"]),
                ended_at=time.time(),
                output_tokens=job.generated_tokens,
                usage=response["usage"],
                error=response["error"],
            )
        )

    def _container_of(
        self, prepared: PreparedRequest, owner: str | None
    ) -> ResponseContainer | None:
        """Where the response's code interpreter calls run, if the server runs them."""
        plan = prepared.container
        if plan is None or self._containers is None:
            return None
        return ResponseContainer(
            self._containers,
            plan.container_id,
            owner,
            plan.ensure,
            include=tuple(prepared.request.include),
        )

    async def _run(
        self,
        job: Job,
        plan: PromptPlan,
        turn: ConversationTurn | None,
        container: ResponseContainer | None,
        *,
        task_status: trio.TaskStatus[dict[str, Any] | None],
    ) -> None:
        RESPONSE_ID.set(job.id)  # this task's log lines (and its children's) name the job
        cleanup = Cleanup(self._config.cleanup_timeout_s, within=self._closing)
        cleanup.enter()  # for every cleanup step of this task and its children
        recorder = Recorder(job, self._state, budget_s=self._config.cleanup_timeout_s)
        try:
            try:
                await recorder.start()  # the queued record
                if not self._accepting:  # shutdown began while it was being recorded
                    raise ShuttingDownError(
                        "The server is shutting down; retry on another replica."
                    )
                job.builder.start()  # response.created (and response.queued)
                await recorder.publish_created()  # readers anywhere find the log at once
            except BaseException:
                await recorder.forget()
                raise
            logger.info(
                "%s created (background=%s, stream=%s)",
                job.id,
                job.request.background,
                job.request.stream,
                extra={
                    "response_status": job.status,
                    "background": job.request.background,
                    "stream": job.request.stream,
                },
            )
            timer = self._metrics.response_created(background=job.background)
            # What a background create answers: the response before its task goes on.
            task_status.started(
                job.snapshot() if job.background and not job.request.stream else None
            )
            # A fault of another task of the job (a tool session's): the job ended
            # with it; the server goes on.
            with faults_handled(
                lambda fault: logger.error(
                    "%s: a task of the response failed", job.id, exc_info=fault
                )
            ):
                await self._generate(job, plan, recorder, timer, cleanup, turn, container)
        finally:
            self._unregister(job)

    async def _generate(
        self,
        job: Job,
        plan: PromptPlan,
        recorder: Recorder,
        timer: ResponseTimer,
        cleanup: Cleanup,
        turn: ConversationTurn | None = None,
        container: ResponseContainer | None = None,
    ) -> None:
        config = self._config
        async with trio.open_nursery() as sessions:
            if recorder.follows:  # a task only where there is something to write
                await sessions.start(_beside, job, "recording", recorder.follow)
            if turn is not None:
                await sessions.start(_beside, job, "conversation lease", turn.keep)
            toolbox = Toolbox(
                job.request,
                self._pool,
                nursery=sessions,
                tool_timeout_s=config.tool_timeout_s,
                close_timeout_s=config.cleanup_timeout_s,
                allow_hosts=config.mcp_allow_hosts,
                open_sessions=self._metrics.request_mcp_sessions,
                python_slots=self._python_slots,
                owner=job.owner,
                response_id=job.id,
                container=container,
            )
            try:
                # An exception, or a panic in native code: that response fails.
                with faults_handled(partial(_generation_failed, job)), job.cancel_scope:
                    async with _GenerationSlot(self._slots, self._tenants[job.owner].slots):
                        await generate_response(
                            job,
                            self._engine,
                            toolbox,
                            plan,
                            max_model_len=config.max_model_len,
                            metrics=self._metrics,
                            timer=timer,
                        )
            finally:
                if not job.finished:  # our own nursery is being cancelled: shutting down
                    job.finish("failed", error=SHUTDOWN_ERROR)
                # The whole cleanup by one deadline (its steps have the budget each at
                # most): from when it began, the engine's abort included if cancelled.
                recorded = False
                with trio.CancelScope(deadline=cleanup.begin(), shield=True):
                    try:
                        await recorder.stop()
                        recorded = await recorder.finish()
                        if turn is not None:
                            await turn.finish(job)  # before done: a next turn sees it
                    finally:
                        if not recorded:  # refused, or cut short: maintenance retries it
                            self._keep_unrecorded(recorder)
                        elif job.background:
                            self.background_recorded()
                        job.done.set()
                        self._finished(job)
                    await toolbox.aclose()
                sessions.cancel_scope.cancel()

    def _finished(self, job: Job) -> None:
        """Log and count the outcome of a job that reached its terminal status."""
        builder = job.builder
        usage = builder.usage
        error_code = builder.error.get("code") if builder.error else None
        self._metrics.response_finished(
            job.status,
            background=job.background,
            error_code=error_code,
            input_tokens=usage.input_tokens,
            cached_tokens=usage.cached_tokens,
            output_tokens=usage.output_tokens,
            reasoning_tokens=usage.reasoning_tokens,
        )
        logger.info(
            "%s %s",
            job.id,
            job.status,
            extra={
                "response_status": job.status,
                "input_tokens": usage.input_tokens,
                "cached_tokens": usage.cached_tokens,
                "output_tokens": usage.output_tokens,
                "reasoning_tokens": usage.reasoning_tokens,
                "error_code": error_code,
            },
        )

    def _keep_unrecorded(self, recorder: Recorder) -> None:
        self._unrecorded[recorder.response_id] = recorder
        while len(self._unrecorded) > _MAX_UNRECORDED:
            lost = next(iter(self._unrecorded))
            del self._unrecorded[lost]
            logger.error("%s: giving up on recording its final state", lost)

    async def retry_unrecorded(self) -> int:
        """Try again to record the final state of jobs the store refused (maintenance).

        Returns how many are still waiting. Until their record is written, readers on
        other replicas (and a restarted process) see them still running.

        A retry is not cleanup: it is not shielded, so closing the service cancels it
        at once (each try is bounded by the cleanup budget, and a write it cut short
        is written whole by the next try, or recovered as interrupted after a
        restart).
        """
        for response_id, recorder in list(self._unrecorded.items()):
            if await recorder.finish():
                del self._unrecorded[response_id]
                logger.info("%s: final state recorded after all", response_id)
        return len(self._unrecorded)

    # -- change -----------------------------------------------------------------------------

    def cancel(self, response_id: str) -> bool:
        """Cancel the job of ``response_id`` if it runs here (a `Control` cancel request)."""
        job = self._running.get(response_id)
        if job is None or job.finished:
            return False
        job.cancel()
        logger.info("%s cancelled by request", job.id)
        return True

    def close(self) -> float:
        """Stop taking jobs and begin closing: from now on every job's cleanup, begun
        or not, ends within the cleanup budget (``cleanup_timeout_s``) of this moment,
        or by its own earlier deadline. Returns that deadline; the first call decides
        it. Does not stop a job: cancel it (or its nursery) for that."""
        self._accepting = False
        return self._closing.begin()

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking jobs, give running ones ``grace_s`` to finish, then end them.

        Jobs still running after the grace period end ``failed`` with code
        ``server_shutdown`` (their readers get that terminal event at once) and
        are recorded. Returns once every job task has ended, or
        ``grace_s + cleanup_timeout_s`` after it was called, whichever comes
        first. By then every job's cleanup is over, whatever the store or the
        engine do meanwhile: each (engine abort, final writes, conversation,
        tool sessions) ends by one deadline, the cleanup budget after it began
        and no later than the budget after the grace period (`close`); a job
        cut short there still unwinds, without waiting on anything.
        """
        self._accepting = False
        with trio.move_on_after(grace_s):
            await self.wait_idle()
        deadline = self.close()
        for job in list(self._running.values()):
            if job.builder.next_sequence_number:  # created; the others refuse to start
                job.abort(SHUTDOWN_ERROR)
        with trio.move_on_at(deadline):
            await self.wait_idle()
