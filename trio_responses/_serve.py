"""Serving HTTP: hypercorn's trio worker over the quart-trio app.

`serve` runs the whole server inside the caller's nursery::

    async with trio.open_nursery() as nursery:
        urls = await nursery.start(serve, Config(port=0))
        ...                          # talk to urls[0]
        nursery.cancel_scope.cancel()

Task tree::

    serve()
    └── open_responses_service()     engine, store, job nursery
        └── hypercorn                listeners and connection handlers
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

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
    """Serve ``service`` over HTTP until cancelled or ``shutdown_trigger`` returns.

    Reports the bound URLs (``http://127.0.0.1:PORT``) through ``task_status``.
    """
    app = shield_final_send(create_app(service))
    await hypercorn.trio.serve(
        app,
        hypercorn_config(service.config),
        shutdown_trigger=shutdown_trigger,
        task_status=task_status,
    )


async def serve(
    config: Config,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Run the server (engine, jobs, HTTP) until cancelled.

    Use with ``nursery.start``: it returns the bound URLs once listening.
    This function never returns unless cancelled.
    """
    async with open_responses_service(config) as service:
        await serve_service(service, task_status=task_status)
    raise RuntimeError("the HTTP server stopped without being cancelled")  # pragma: no cover


__all__ = ["hypercorn_config", "serve", "serve_service"]
