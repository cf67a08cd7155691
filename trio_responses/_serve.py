"""Serving HTTP: hypercorn's trio worker over the quart-trio app.

`serve` runs the whole server inside the caller's nursery::

    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(serve, Config(port=0), shutdown_trigger=stop.wait))
        ...                          # talk to urls[0]
        stop.set()                   # graceful: running responses get shutdown_grace_s

Task tree::

    serve()
    └── open_responses_service()     state, engine, job nursery
        └── hypercorn                listeners and connection handlers
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial

import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig

from ._config import Config
from ._service import ResponsesService, open_responses_service
from .api.app import create_app
from .api.asgi import shield_final_send

logger = logging.getLogger("trio_responses.serve")


def hypercorn_config(config: Config) -> HypercornConfig:
    """Hypercorn settings for ``config`` (bind address, graceful timeout)."""
    hconfig = HypercornConfig()
    host = f"[{config.host}]" if ":" in config.host else config.host
    hconfig.bind = [f"{host}:{config.port}"]
    hconfig.accesslog = None  # the app logs one line per request itself
    # Hypercorn's messages go through logging, configured by the embedding app or the CLI.
    hconfig.errorlog = logging.getLogger("hypercorn.error")
    hconfig.graceful_timeout = config.shutdown_grace_s + config.cleanup_timeout_s
    # Hypercorn listens with a backlog of 100: a burst of new connections beyond it
    # waits for SYN retransmits (1 s, 3 s, 7 s...). Allow bursts of SSE readers.
    hconfig.backlog = 2048
    return hconfig


async def serve_service(
    service: ResponsesService,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``service`` over HTTP until cancelled or until ``shutdown_trigger`` returns.

    Reports the bound URLs (``http://127.0.0.1:PORT``) through ``task_status``.
    When ``shutdown_trigger`` returns, shuts down gracefully: stop accepting
    connections and responses, give running responses ``shutdown_grace_s`` to
    finish, end the rest ``failed`` (``server_shutdown``), then return once
    their streams have ended.
    """
    app = shield_final_send(create_app(service))
    config = hypercorn_config(service.config)
    if shutdown_trigger is None:
        await hypercorn.trio.serve(app, config, task_status=task_status)
        return
    trigger = shutdown_trigger
    stopping = trio.Event()

    async def stop_when_triggered() -> None:
        await trigger()
        stopping.set()  # hypercorn closes its listeners and waits for open streams
        await service.shutdown(service.config.shutdown_grace_s)
        logger.info("all responses ended; closing connections")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_when_triggered)
        urls = await nursery.start(
            partial(hypercorn.trio.serve, app, config, shutdown_trigger=stopping.wait)
        )
        task_status.started(urls)


async def serve(
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the server (state, engine, jobs, HTTP) until cancelled or until
    ``shutdown_trigger`` returns (then it shuts down gracefully, see `serve_service`).

    Use with ``nursery.start``: it returns the bound URLs once listening.
    """
    async with open_responses_service(config) as service:
        await serve_service(service, shutdown_trigger=shutdown_trigger, task_status=task_status)


__all__ = ["hypercorn_config", "serve", "serve_service"]
