"""`open_responses_service`: the state backend, the engine, the tools and the
service's own tasks, opened together and stopped together (see the task tree in
docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ._config import Config
from ._exceptions import StartupError
from ._files import file_quota
from ._runner import JobRunner
from ._service import ResponsesService
from .engine import EngineInfo, open_engine
from .harmony.encoding import load_encoding
from .metrics import Metrics, instrument_state
from .protocol.json_schema import load_schema_checker
from .sealing import Sealer, load_key
from .store.open import open_state
from .tools.containers import ContainerRuntime
from .tools.pool import ToolServer, ToolServerPool, ToolServerSpec
from .tools.sandbox import Limits, SandboxReport, open_sandbox
from .tools.transport import connect_to
from .webhooks.endpoints import WebhooksAPI
from .webhooks.sender import WebhookSender

logger = logging.getLogger("trio_responses.service")


@asynccontextmanager
async def open_responses_service(config: Config) -> AsyncIterator[ResponsesService]:
    """Open the state backend, the engine and the nurseries; stop them all on exit.

    On start, responses left running by a dead process are recovered (durable
    backends). On exit, running jobs are cancelled and end ``failed``
    (``server_shutdown``); call `ResponsesService.shutdown` first to give them
    time to finish.

    Leaving takes, one after the other: the jobs still running, within
    ``cleanup_timeout_s`` (each job's cleanup ends by one deadline, the budget
    after it began, and no later than the budget after the exit began, or
    after `ResponsesService.shutdown`'s grace period: none are left once it
    has returned); the tool servers, control and maintenance, within
    ``cleanup_timeout_s`` (a polite goodbye to each tool server; retries of
    unrecorded jobs are cancelled at once); the engine (the scripted one at
    once; vLLM aborts what runs within the budget and stops its engine core
    within three times it); the state backend, within ``cleanup_timeout_s``
    (memory: at once). So, with the scripted engine, at most
    ``2 * cleanup_timeout_s`` after `ResponsesService.shutdown` has returned,
    ``3 * cleanup_timeout_s`` without it, and normally at once.

    Raises:
        StoreError: the state backend cannot be opened.
        SandboxUnavailable: ``code_interpreter``, and its sandbox cannot work
            here (``python_sandbox`` is not ``none``).
        StartupError: the harmony vocabulary cannot be loaded, the engine is not
            installed, or ``web_search`` names a provider whose API key is not set.
    """
    browser_env = _browser_env(config)
    sandbox: SandboxReport | None = None
    if config.code_interpreter:
        # Before anything starts: a code interpreter that cannot isolate user code
        # stops the server with a message saying what to install.
        sandbox = await open_sandbox(
            config.python_sandbox,
            Limits(
                cpu_s=config.python_cpu_s,
                memory_bytes=config.python_memory_mb * 1024 * 1024,
                wall_s=config.python_wall_s,
                processes=config.python_processes,
                disk_bytes=config.python_disk_mb * 1024 * 1024,
            ),
            max_concurrent=config.python_max_concurrent,
            max_concurrent_per_key=config.python_max_concurrent_per_key,
            memory_budget_mb=config.python_memory_budget_mb,
        )
    # Loading the harmony vocabulary and the JSON Schema checks takes a few hundred
    # milliseconds each: do it now, off the event loop, rather than inside the
    # first request.
    await trio.to_thread.run_sync(load_encoding)
    await trio.to_thread.run_sync(load_schema_checker)
    sealer = Sealer(await trio.to_thread.run_sync(load_key, config))
    metrics = Metrics(model=config.model_name, engine=config.engine)
    pool = ToolServerPool(
        [
            ToolServer(
                parsed,
                connect=connect_to(parsed.address, env=browser_env)
                if parsed.label == "browser" and browser_env
                else None,
                connect_timeout_s=config.tool_timeout_s,
                close_timeout_s=config.cleanup_timeout_s,
                open_sessions=metrics.configured_mcp_sessions,
            )
            for parsed in map(ToolServerSpec.parse, config.all_tool_servers)
        ]
    )
    async with (
        open_state(config.store_url, config) as state,
        open_engine(config) as engine,
        trio.open_nursery() as root,
    ):
        instrument_state(state, metrics)
        config = _within_engine_context(config, engine.info)
        await root.start(pool.run)
        containers = None
        if sandbox is not None:
            max_live = _max_live_containers(config, sandbox)
            logger.info("code interpreter containers: at most %d running here", max_live)
            containers = ContainerRuntime(
                files=state.files,
                sandbox=sandbox.sandbox,
                limits=sandbox.limits,
                quota=file_quota(config),
                replica=state.control.replica,
                max_live=max_live,
                max_file_bytes=config.max_file_bytes,
                packages=config.python_packages,
            )
            await root.start(containers.run)
        try:
            await WebhooksAPI(store=state.webhooks, sealer=sealer, config=config).install_operator()
        except (ValueError, OSError) as error:
            raise StartupError(f"cannot set up --webhook: {error}") from None
        sender = WebhookSender(
            store=state.webhooks,
            sealer=sealer,
            config=config,
            replica=state.control.replica,
            metrics=metrics,
        )
        background = trio.CancelScope()
        async with trio.open_nursery() as jobs:
            runner = JobRunner(
                config=config,
                engine=engine,
                pool=pool,
                state=state,
                nursery=jobs,
                metrics=metrics,
                python_slots=sandbox.slots if sandbox is not None else None,
                containers=containers,
            )
            runner.background_recorded = sender.wake
            service = ResponsesService(
                config=config,
                engine=engine,
                state=state,
                runner=runner,
                pool=pool,
                sealer=sealer,
                sandbox=sandbox,
                containers=containers,
                metrics=metrics,
            )
            await root.start(_run_in, background, service, runner, sender)
            logger.info(
                "serving %r with the %s; store: %s",
                config.model_name,
                engine.info.description,
                state.kind,
            )
            try:
                yield service
            finally:
                runner.close()  # every job's cleanup ends within the budget from now
                jobs.cancel_scope.cancel()
        # Tool servers get a polite goodbye (bounded); the rest stops now.
        background.cancel()
        pool.close()
        root.cancel_scope.deadline = trio.current_time() + config.cleanup_timeout_s


def _within_engine_context(config: Config, info: EngineInfo) -> Config:
    """``config`` with the engine's context window where that is the smaller."""
    if info.max_model_len is None or info.max_model_len >= config.max_model_len:
        return config
    logger.info(
        "context window: %d tokens, the engine's (not %d)", info.max_model_len, config.max_model_len
    )
    return dataclasses.replace(config, max_model_len=info.max_model_len)


def _browser_env(config: Config) -> dict[str, str]:
    """What the bundled browser's child needs of this environment: its provider's key.

    Raises:
        StartupError: ``web_search`` names a provider whose key is not set.
    """
    if config.web_search is None:
        return {}
    # Only a server with --web-search needs the browser's module (and the MCP server side).
    from .tools.browser import KEY_VARIABLES, ProviderError, parse_provider

    try:
        provider = parse_provider(config.web_search, os.environ)
    except ProviderError as error:
        raise StartupError(f"cannot start web search: {error}") from None
    variable = KEY_VARIABLES.get(provider.name)
    return {variable: provider.key} if variable is not None and provider.key else {}


def _max_live_containers(config: Config, sandbox: SandboxReport) -> int:
    """``max_live_containers``, but no more than fit the code runs' memory budget: an
    idle container's process holds what its code left in memory, and its own
    ``/tmp`` (a tmpfs of ``python_disk_mb``) besides what one run may hold."""
    budget = sandbox.slots.budget if sandbox.slots is not None else None
    if budget is None or budget.per_run_bytes is None:
        return config.max_live_containers
    per_container = budget.per_run_bytes
    if sandbox.sandbox.memory_bound == "rlimit":
        per_container += sandbox.limits.disk_bytes
    return max(1, min(config.max_live_containers, budget.budget_bytes // per_container))


async def _run_in(
    scope: trio.CancelScope,
    service: ResponsesService,
    runner: JobRunner,
    sender: WebhookSender,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The service's own long-lived tasks: control, maintenance and the webhook
    sender, under ``scope``."""
    with scope:
        await service.recover_interrupted()
        async with trio.open_nursery() as nursery:
            await nursery.start(sender.run)
            await nursery.start(service.state.control.run, runner.cancel)
            nursery.start_soon(service._maintain)
            task_status.started()
