"""`open_state`: the backend named by ``--store URL``.

======================  ==============================================
``memory://``           this process only (the default)
``sqlite:///PATH``      one file; survives restarts; one process per file
``redis://HOST:PORT/N`` shared by several replicas (``rediss://`` for TLS)
``unix:///PATH?db=N``   Redis over a unix socket
======================  ==============================================

Backends are imported only when chosen.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .._config import Config, sqlite_path, store_kind
from .base import State


@asynccontextmanager
async def open_state(url: str, config: Config) -> AsyncIterator[State]:
    """Open the state backend named by ``url``; close it on exit.

    Raises:
        ValueError: ``url`` names no backend.
        StoreError: the backend cannot be reached or opened.
    """
    kind = store_kind(url)
    if kind == "memory":
        from .memory import open_memory_state

        async with open_memory_state(config) as state:
            yield state
    elif kind == "sqlite":
        from .sqlite import open_sqlite_state

        async with open_sqlite_state(sqlite_path(url), config) as state:
            yield state
    else:
        from .redis import open_redis_state

        async with open_redis_state(url, config) as state:
            yield state
