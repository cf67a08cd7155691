"""The response service: the whole API without HTTP.

`open_responses_service` opens the state backend, the engine, the tool
servers and the nurseries; the `ResponsesService` it yields creates responses
(through the `JobRunner`) and answers queries from the running jobs and the
state backend::

    async with open_responses_service(Config()) as service:
        handle = await service.create({"model": "gpt-oss-scripted", "input": "hello"})
        with handle.subscribe() as subscription:
            async for event in subscription:
                ...
        response = await handle.wait()

Task tree (SPEC §2)::

    open_responses_service                  root nursery
    ├── tool-server owners                  the configured MCP servers (pool)
    ├── control                             heartbeat, cancel requests from other replicas
    ├── maintenance                         expiry, recovery of interrupted responses
    └── job nursery                         one task per response (see _runner.py)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal, NoReturn, final

import trio

from ._compaction import compacted_response, parse_compact_request, summarizing_request
from ._config import Config
from ._conversations import Conversations, context_ids
from ._exceptions import InvalidRequestError, NotFoundError
from ._files import FilesAPI
from ._offload import INLINE_BYTES, INLINE_TOKENIZED, estimated_size, offload
from ._prepare import PreparedRequest, check_request, prepare
from ._principal import Principal
from ._runner import FinishedJob, JobRunner, ResponseHandle
from ._sealed_items import INCLUDE_REASONING, item_opener, reasoning_sealer
from .background.event_log import SubscriberLagged
from .background.job import Job
from .background.subscription import LogSubscription, Subscription
from .engine import Engine
from .engine.base import upstream_health
from .metrics import Metrics, Snapshot
from .protocol import errors
from .protocol.grammar import grammar_cost
from .protocol.ids import new_id
from .protocol.lists import list_page
from .protocol.request import (
    CreateRequest,
    check_includes,
    parse_create_request,
)
from .protocol.shape import request_shape
from .sealing import Sealer
from .store.base import State, StoredResponse, StoreError
from .tools.builtin.code_interpreter import CodeInterpreterTool
from .tools.containers import ContainerRuntime
from .tools.pool import ToolServerPool
from .tools.sandbox import SandboxReport
from .webhooks.endpoints import WebhooksAPI

logger = logging.getLogger("trio_responses.service")

_CANNOT_CANCEL = {
    "completed": "Cannot cancel a completed response.",
    "failed": "Cannot cancel a failed response.",
    "incomplete": "Cannot cancel an incomplete response.",
}


@dataclass(frozen=True)
class ServiceStatistics:
    """A snapshot of what the service holds (`ResponsesService.statistics`)."""

    running_jobs: int
    """Jobs not yet finished here (generating or waiting for a slot)."""
    active_jobs: int
    """Jobs generating now."""
    queued_jobs: int
    """Jobs waiting for a generation slot."""
    job_tasks: int
    """Tasks alive in the job nursery."""
    retained_streams: int
    """Finished background event logs kept for replay (as far as this process knows)."""
    retained_stream_bytes: int
    """Bytes held by those logs."""
    subscribers: int
    """Open subscriptions on this process's rings."""
    unrecorded_jobs: int = 0
    """Finished jobs whose final state the store refused, waiting for another try."""


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
        state: State,
        runner: JobRunner,
        pool: ToolServerPool,
        sealer: Sealer,
        sandbox: SandboxReport | None = None,
        containers: ContainerRuntime | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.state = state
        self.pool = pool
        self.sealer = sealer
        """Seals and opens ``encrypted_content`` (reasoning and compaction items)."""
        self.sandbox = sandbox
        """The bundled code interpreter's sandbox (None without ``code_interpreter``)."""
        self._runner = runner
        self.conversations = Conversations(
            config=config, store=state.conversations, responses=state.store
        )
        """The Conversations API (``/v1/conversations``): see `_conversations.py`."""
        self.files = FilesAPI(
            config=config, files=state.files, responses=state.store, runtime=containers
        )
        """The Files and Containers APIs (``/v1/files``, ``/v1/containers``): `_files.py`."""
        self.webhooks = WebhooksAPI(store=state.webhooks, sealer=sealer, config=config)
        """The webhook endpoints API (``/v1/webhook_endpoints``): `webhooks.endpoints`."""
        self.metrics = metrics or Metrics(model=config.model_name, engine=config.engine)
        """This service's Prometheus metrics (``/metrics``)."""
        self.metrics.watch(self._metrics_snapshot)

    # -- queries -----------------------------------------------------------------------

    def _metrics_snapshot(self) -> Snapshot:
        stats = self.statistics()
        return Snapshot(
            running_jobs=stats.running_jobs,
            active_jobs=stats.active_jobs,
            queued_jobs=stats.queued_jobs,
            subscribers=stats.subscribers,
            retained_streams=stats.retained_streams,
            retained_stream_bytes=stats.retained_stream_bytes,
            tool_servers_ready={
                label: health["state"] == "ready" for label, health in self.pool.health().items()
            },
            upstreams=tuple(
                (upstream.url, upstream.up, upstream.outstanding)
                for upstream in upstream_health(self.engine)
            ),
            **self._container_counts(),
        )

    def _container_counts(self) -> dict[str, int]:
        runtime = self.files.runtime
        if runtime is None:
            return {}
        health = runtime.health()
        return {"containers_live": health["live"], "containers_started": health["started"]}

    def statistics(self) -> ServiceStatistics:
        runner = self._runner
        logs = self.state.logs.statistics()
        return ServiceStatistics(
            running_jobs=runner.running,
            active_jobs=runner.active,
            queued_jobs=runner.queued,
            job_tasks=runner.tasks,
            retained_streams=logs.retained_streams,
            retained_stream_bytes=logs.retained_bytes,
            subscribers=runner.subscribers + logs.subscribers,
            unrecorded_jobs=runner.unrecorded,
        )

    async def wait_idle(self) -> None:
        """Wait until no job is running here."""
        await self._runner.wait_idle()

    def running(self, response_id: str, *, owner: str | None = None) -> ResponseHandle | None:
        """The handle of a response whose job runs in this process, if any."""
        job = self._runner.get(response_id, Principal(owner), stored_only=False)
        return None if job is None else ResponseHandle.of(job)

    # -- operator views (every owner's responses; see api/dashboard.py) ------------------

    def jobs(self) -> list[Job]:
        """Every job running in this process, whoever owns it."""
        return self._runner.jobs()

    def recent(self) -> list[FinishedJob]:
        """The responses that finished in this process last, newest first (bounded)."""
        return self._runner.recent()

    def output_tokens(self) -> dict[str, int]:
        """Output tokens generated in this process since start, by requested model."""
        return self._runner.output_tokens()

    def _scope(self, response_id: str, who: Principal) -> str | None:
        """The owner to look ``response_id`` up as in the stores: ``who``'s own, or
        for an operator the response's own owner, as this process knows it.

        Raises:
            NotFoundError: an operator, and the response neither runs here nor is one
                of those that finished here last (`recent`).
        """
        if not who.admin:
            return who.owner
        known = self._runner.owner_of(response_id)
        if known is None:
            raise NotFoundError(
                f"Response with id {response_id!r} is not running here and is not one of "
                "the responses that finished here last.",
                param="response_id",
            )
        return known[0]

    # -- create --------------------------------------------------------------------------

    async def create(
        self,
        request: Mapping[str, Any] | CreateRequest,
        *,
        owner: str | None = None,
        local: Mapping[str, StoredResponse] | None = None,
        size: int | None = None,
    ) -> ResponseHandle:
        """Validate ``request`` and start its job; returns once the job runs.

        The job's ``response.created`` event is already in its log when this
        returns, so `ResponseHandle.subscribe` never misses anything.
        ``local``: finished responses kept by the caller (a WebSocket
        connection), looked up by ``previous_response_id`` before the store,
        so a conversation continues from them even with ``store: false``.
        ``size``: the bytes of the JSON that ``request`` was decoded from, where
        the caller has them (it saves estimating them; see `estimated_size`).

        Raises:
            InvalidRequestError, ModelNotFoundError, NotFoundError: bad request.
            RequestTooLargeError: a stored response whose record, before any
                output, is larger than ``owner``'s share of the store.
            ServerBusyError: every generation slot and queue place is taken, the
                server's or (with API keys) ``owner``'s.
            ShuttingDownError: `shutdown` has begun.
            StoreError: the state backend is unavailable.
        """
        prepared = await self.prepare(request, owner=owner, local=local, size=size)
        return await self.start(prepared, owner=owner)

    async def prepare(
        self,
        request: Mapping[str, Any] | CreateRequest,
        *,
        owner: str | None = None,
        local: Mapping[str, StoredResponse] | None = None,
        size: int | None = None,
    ) -> PreparedRequest:
        """The first half of `create`: validate ``request``, load the conversation
        before it (``local`` first, see `create`) and render its prompt. Nothing
        starts and nothing is stored. ``size``: as `create`.

        Raises:
            InvalidRequestError, ModelNotFoundError, NotFoundError: bad request.
            StoreError: the state backend is unavailable.
        """
        return await self._prepare(request, owner, local, size)

    async def start(self, prepared: PreparedRequest, *, owner: str | None = None) -> ResponseHandle:
        """The second half of `create`: start the job of ``prepared``.

        Raises:
            RequestTooLargeError, ServerBusyError, ShuttingDownError, StoreError:
                as `create`.
        """
        response_id = new_id("resp")
        # Under the conversation's lock, the conversation is checked to be the one the
        # prompt was rendered from (another response may have finished meanwhile).
        turn = await self.conversations.begin(prepared, owner, response_id)
        try:
            return await self._runner.start(prepared, owner=owner, turn=turn)
        except BaseException:
            if turn is not None:
                await turn.release()
            raise

    async def count_input_tokens(
        self, request: Mapping[str, Any] | CreateRequest, *, owner: str | None = None
    ) -> int:
        """The prompt tokens ``request`` would give the model, without running it.

        The request is validated and rendered exactly as `create` does (with
        the conversation before ``previous_response_id``), so the count is
        the ``usage.input_tokens`` of a response whose model answers in one
        turn. Nothing is stored and no job starts. Without ``model`` (it is
        optional here), the served model is meant. MCP tools whose listing is
        not in the input yet are not counted: listing them needs their server,
        which only a response contacts.

        Raises:
            InvalidRequestError, ModelNotFoundError, NotFoundError: bad request.
            ServerBusyError: the server, or this owner (API key), has as many
                unfinished responses as it may have: counting takes a place too.
            StoreError: the state backend is unavailable (``previous_response_id``).
        """
        if isinstance(request, Mapping) and request.get("model") is None:
            request = {**request, "model": self.config.model_name}
        with self._runner.counted(owner):
            prepared = await self._prepare(request, owner)
        return len(prepared.prompt_tokens)

    async def _prepare(
        self,
        request: Mapping[str, Any] | CreateRequest,
        owner: str | None,
        local: Mapping[str, StoredResponse] | None = None,
        size: int | None = None,
    ) -> PreparedRequest:
        """Validate ``request``, load the conversation before it, render its prompt."""
        # Validating and rendering a large request takes long enough to stall every
        # stream: both run in a worker thread when the input is large (pure work).
        # The request's size, where known in full (an estimate stops at the limit).
        known: int | None = size
        if size is None:
            size = estimated_size(request)
            known = size if size <= INLINE_BYTES else None
        if not isinstance(request, CreateRequest):
            body = dict(request) if isinstance(request, Mapping) else request
            # A custom tool's grammar is compiled while parsing: off the loop.
            cost = max(size, grammar_cost(body))
            request = await offload(cost, partial(parse_create_request, body))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("request: %s", request_shape(request))
        check_request(request, self.config, self.pool)
        resolved = await self.conversations.resolve_references(request, owner)
        if resolved is not request:  # stored items took the place of references
            request, size = resolved, estimated_size(resolved)
            known = size if size <= INLINE_BYTES else None
        context = await self._previous_context(request, owner, local)
        context_param = "previous_response_id"
        if request.conversation_id is not None:
            context = await self.conversations.context(request.conversation_id, owner)
            self.conversations.check_room(request, context)
            context_param = "conversation"
        # Sealed reasoning and compaction items open for their owner only (400 otherwise).
        unseal = item_opener(self.sealer, owner, context_param=context_param)
        prepared = await offload(  # renders the prompt: tokenizes client text
            size + estimated_size(context, limit=INLINE_TOKENIZED),
            partial(
                prepare, request, context, config=self.config, unseal=unseal, request_bytes=known
            ),
            inline=INLINE_TOKENIZED,
        )
        if request.conversation_id is not None:
            prepared = replace(prepared, context_ids=context_ids(context))
        if INCLUDE_REASONING in request.include:
            prepared = replace(prepared, seal_reasoning=reasoning_sealer(self.sealer, owner))
        if self.files.runtime is not None:
            for index, tool in enumerate(request.tools):
                if isinstance(tool, CodeInterpreterTool):
                    plan = await self.files.plan(
                        tool.container,
                        owner=owner,
                        previous_container=_last_container(context),
                        param=f"tools[{index}].container",
                    )
                    prepared = replace(prepared, container=plan)
                    break
        return prepared

    async def compact(self, body: Mapping[str, Any], *, owner: str | None = None) -> dict[str, Any]:
        """Compact a conversation (``input`` and/or ``previous_response_id``) into its
        user messages and a sealed summary the model wrote (``response.compaction``).

        The summary is written by an internal, unstored response: it takes a
        generation slot like any other and stops if this call is cancelled.

        Raises:
            InvalidRequestError, ModelNotFoundError, NotFoundError: bad request.
            ServerBusyError: no generation slot or queue place for the summary.
            ServerError: the model wrote no summary.
            ShuttingDownError: the server is shutting down.
            StoreError: the state backend is unavailable (``previous_response_id``).
        """
        fields = dict(body) if isinstance(body, Mapping) else body
        request = await offload(
            estimated_size(fields),
            partial(parse_compact_request, fields, default_model=self.config.model_name),
        )
        with self._runner.counted(owner):
            prepared = await self._prepare(summarizing_request(request), owner)
        handle = await self._runner.start(prepared, owner=owner)
        try:
            response = await handle.wait()
        except BaseException:
            handle.abandon()  # the caller went away: stop writing the summary
            raise
        return compacted_response(prepared, response, sealer=self.sealer, owner=owner)

    async def _previous_context(
        self,
        request: CreateRequest,
        owner: str | None,
        local: Mapping[str, StoredResponse] | None = None,
    ) -> list[dict[str, Any]]:
        """The conversation before ``request``: its predecessors' inputs and outputs."""
        previous_id = request.previous_response_id
        if previous_id is None:
            return []
        if local is not None and (kept := local.get(previous_id)) is not None:
            return await self._conversation(kept, owner, local)
        running = self._runner.get(previous_id, Principal(owner))
        if running is not None:
            if not running.finished:
                raise _previous_running(previous_id, running.status)
            await running.done.wait()  # finished: its final state is being recorded now
        record = await self._load(previous_id, owner)
        if record is None:
            raise NotFoundError(
                f"Previous response with id {previous_id!r} not found.",
                param="previous_response_id",
            )
        if record.running:
            raise _previous_running(previous_id, record.status)
        return await self._conversation(record, owner)

    async def _conversation(
        self,
        last: StoredResponse,
        owner: str | None,
        local: Mapping[str, StoredResponse] | None = None,
    ) -> list[dict[str, Any]]:
        """Every item of the chain that ends with ``last``, oldest first.

        Records reference their predecessor (found in ``local`` first, then in
        the store); the walk stops with a 400 once the chain holds more items
        than a request may.
        """
        chain = [last]
        count = len(last.input_items) + len(last.response["output"])
        while (previous_id := chain[-1].previous_response_id) is not None:
            if count > self.config.max_input_items:
                break  # prepare() says "too many input items"
            record = local.get(previous_id) if local is not None else None
            if record is None:
                record = await self._load(previous_id, owner)
            if record is None:
                raise NotFoundError(
                    f"Response {previous_id!r}, an earlier turn of this conversation, is no "
                    "longer stored, so the conversation cannot be continued.",
                    param="previous_response_id",
                )
            chain.append(record)
            count += len(record.input_items) + len(record.response["output"])
        return [
            item
            for record in reversed(chain)
            for item in (*record.input_items, *record.response["output"])
        ]

    # -- read ---------------------------------------------------------------------------------

    async def retrieve(
        self, response_id: str, *, owner: str | None = None, admin: bool = False
    ) -> dict[str, Any]:
        """The Response object: live while it runs here, else as stored.

        With ``admin``, ``owner`` is ignored: any owner's response running or
        recently finished here is found.

        Raises:
            NotFoundError: unknown, deleted, not stored (``store: false``), or
                created with another API key.
        """
        who = Principal(owner, admin)
        owner = self._scope(response_id, who)
        job = self._runner.get(response_id, who)
        if job is not None and not job.done.is_set():
            return job.snapshot()
        record = await self._load(response_id, owner)
        if record is None:
            raise _not_found(response_id)
        return record.response

    async def wait(self, response_id: str, *, owner: str | None = None) -> dict[str, Any]:
        """Wait for a response running here to finish and return it; else `retrieve`.

        Cancellation: only the wait is cancelled, never the job.
        """
        job = self._runner.get(response_id, Principal(owner), stored_only=False)
        if job is None:
            return await self.retrieve(response_id, owner=owner)
        await job.done.wait()
        return job.snapshot()

    async def subscribe(
        self,
        response_id: str,
        *,
        starting_after: int = -1,
        owner: str | None = None,
        background_only: bool = False,
        admin: bool = False,
    ) -> Subscription:
        """Follow a response's events after ``starting_after`` (-1: from the start).

        Replays what the log still holds, then follows live until the terminal
        event. A response running here can be followed whether or not it is a
        background one; otherwise only a background response's log is kept
        (``stream_retention_s``), in whatever backend holds it. With
        ``background_only`` (``GET ?stream=true``), foreground responses are refused.
        With ``admin``, ``owner`` is ignored: any owner's response running or
        recently finished here can be followed.

        Raises:
            NotFoundError: unknown response.
            InvalidRequestError: a foreground response (finished, or with
                ``background_only``), a log that is no longer retained, or
                ``starting_after`` older than the oldest retained event.
        """
        if starting_after < -1:
            raise InvalidRequestError(
                "'starting_after' must be a sequence number (>= 0).", param="starting_after"
            )
        who = Principal(owner, admin)
        owner = self._scope(response_id, who)
        job = self._runner.get(response_id, who)
        try:
            if job is not None:
                if background_only and not job.background:
                    raise _not_streamable(response_id)
                log = job.log
                if starting_after + 1 < log.oldest_sequence_number:
                    raise SubscriberLagged(starting_after + 1, log.oldest_sequence_number)
                return LogSubscription(log, starting_after)
            subscription = await self.state.logs.open(
                response_id, owner=owner, starting_after=starting_after
            )
        except SubscriberLagged as lagged:
            raise InvalidRequestError(
                f"Events up to {lagged.oldest - 1} of response {response_id!r} are no longer "
                f"retained; resume with starting_after >= {lagged.oldest - 1}.",
                param="starting_after",
                code=errors.STREAM_EXPIRED,
            ) from None
        if subscription is not None:
            return subscription
        record = await self._load(response_id, owner)
        if record is None:
            raise _not_found(response_id)
        if not record.background:
            raise _not_streamable(response_id)
        raise InvalidRequestError(
            f"The event stream of response {response_id!r} is no longer available: "
            f"events are kept {self.config.stream_retention_s:g} s after a response "
            "finishes. Retrieve the response without 'stream' instead.",
            param="stream",
            code=errors.STREAM_EXPIRED,
        )

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
        job = self._runner.get(response_id, Principal(owner))
        if job is not None:
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
        return list_page(ordered[start : start + limit], has_more=start + limit < len(ordered))

    # -- change ---------------------------------------------------------------------------------

    async def cancel(
        self, response_id: str, *, owner: str | None = None, admin: bool = False
    ) -> dict[str, Any]:
        """Cancel a background response wherever it runs: it ends ``cancelled``.

        Here, every reader gets the terminal event at once; aborting the engine
        request and closing tool sessions happen in the job's own cleanup,
        which this never waits for. On another replica, the request goes
        through `Control` and this waits (up to the cleanup budget) for that
        replica to record the outcome: on its stored event log, whose terminal
        event follows the final record (the store reading only when there is
        no log). Cancelling a cancelled response returns
        it again. With ``admin``, ``owner`` is ignored: any owner's response
        running or recently finished here can be cancelled.

        Raises:
            NotFoundError: unknown response.
            InvalidRequestError: a foreground response, or one that already
                completed, failed or ended incomplete.
        """
        who = Principal(owner, admin)
        owner = self._scope(response_id, who)
        job = self._runner.get(response_id, who)
        record = None
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
        if job is not None:
            self._runner.cancel(response_id)
            return job.snapshot()
        if record is not None and record.running:
            return await self._cancel_elsewhere(record, owner)
        return response

    async def _cancel_elsewhere(self, record: StoredResponse, owner: str | None) -> dict[str, Any]:
        """Cancel a job another replica runs, and return its recorded outcome."""
        if not await self.state.control.request_cancel(record):
            # Nobody runs it any more: recovery ends it (failed, server_restarted).
            await self.recover_interrupted()
        current: StoredResponse | None = record
        delay = 0.01
        with trio.move_on_after(self.config.cleanup_timeout_s):
            # Its log ends with the terminal event, written after the final record.
            await self._until_logged_to_the_end(record.id, owner)
            current = await self._load(record.id, owner)
            while current is not None and current.running:  # no log to wait on
                await trio.sleep(delay)
                delay = min(delay * 1.5, 0.2)
                current = await self._load(record.id, owner)
        if current is None:
            raise _not_found(record.id)
        if current.status in _CANNOT_CANCEL:  # it finished before the cancel reached it
            raise InvalidRequestError(_CANNOT_CANCEL[current.status], param="response_id")
        return current.response

    async def _until_logged_to_the_end(self, response_id: str, owner: str | None) -> None:
        """Wait until the stored event log of ``response_id`` holds its terminal event
        (the backend's own wait: Redis ``XREAD BLOCK``); at once when there is no log
        to read, or it is behind what is retained."""
        try:
            subscription = await self.state.logs.open(response_id, owner=owner, starting_after=-1)
            if subscription is None:
                return
            with subscription:
                while await subscription.receive_frames():
                    pass
        except SubscriberLagged:
            return

    async def delete(self, response_id: str, *, owner: str | None = None) -> dict[str, Any]:
        """Delete a finished stored response (and its retained event log).

        Raises:
            NotFoundError: unknown response.
            InvalidRequestError: the response is still running.
        """
        job = self._runner.get(response_id, Principal(owner))
        if job is not None:
            if not job.finished:
                raise _cannot_delete_running(response_id, job.status)
            await job.done.wait()  # finished: let its final state land first
        record = await self._load(response_id, owner)
        if record is None:
            raise _not_found(response_id)
        if record.running:
            raise _cannot_delete_running(response_id, record.status)
        await self.state.store.delete(response_id, owner=owner)
        await self.state.logs.delete(response_id, owner=owner)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    # -- lifecycle ------------------------------------------------------------------------------

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking responses, give running ones ``grace_s`` to finish, then end them.

        Responses still running after the grace period end ``failed`` with code
        ``server_shutdown`` (their readers get that terminal event) and are
        recorded. Returns once every job task has finished its cleanup, and
        ``grace_s + cleanup_timeout_s`` after it was called at the latest,
        whatever the store or the engine do (see `JobRunner.shutdown`).
        """
        await self._runner.shutdown(grace_s)

    async def recover_interrupted(self) -> int:
        """End responses left running by processes that are gone; returns how many.

        Each becomes ``failed`` (``server_restarted``) and its event log ends
        with that terminal event, so no reader waits for it forever.
        """
        recovered = await self.state.store.recover_interrupted()
        for record in recovered:
            await self.state.logs.terminate(record)
            logger.warning("%s failed: the server running it stopped (server_restarted)", record.id)
        return len(recovered)

    async def _maintain(self) -> NoReturn:
        """Expire records, logs and conversations, recover interrupted responses.

        This function never returns unless cancelled.
        """
        config = self.config
        interval = min(
            max(config.stream_retention_s / 10, 0.05), max(config.job_lease_s / 4, 0.05), 30.0
        )
        while True:
            await trio.sleep(interval)
            try:
                await self._runner.retry_unrecorded()
                await self.state.logs.expire()
                await self.state.store.expire()
                await self.state.conversations.expire()
                await self.state.webhooks.expire(now=time.time(), ttl_s=config.store_ttl_s)
                await self.recover_interrupted()
            except StoreError as error:
                logger.warning("state maintenance failed (retrying later): %s", error)

    async def _load(self, response_id: str, owner: str | None) -> StoredResponse | None:
        return await self.state.store.get(response_id, owner=owner)


def _not_found(response_id: str) -> NotFoundError:
    return NotFoundError(f"Response with id {response_id!r} not found.", param="response_id")


def _previous_running(response_id: str, status: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Previous response {response_id!r} is still {status}; wait until it has finished "
        "before continuing from it.",
        param="previous_response_id",
    )


def _cannot_delete_running(response_id: str, status: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Response {response_id!r} is still {status}; cancel it or wait for it to finish "
        "before deleting it.",
        param="response_id",
    )


def _not_streamable(response_id: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Response {response_id!r} was not created with background=true; only background "
        "responses can be streamed again. Retrieve it without 'stream'.",
        param="stream",
    )


def _last_container(context: Sequence[Mapping[str, Any]]) -> str | None:
    """The container of the conversation's last code interpreter call, if any."""
    for item in reversed(context):
        if item.get("type") == "code_interpreter_call":
            container_id = item.get("container_id")
            if isinstance(container_id, str) and container_id.startswith("cntr_"):
                return container_id
    return None
