"""Fixtures shared by every test module."""

from __future__ import annotations

import pathlib
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import pytest
import trio

from tests.redis_server import RedisServer, running_redis
from tests.support import Server, run_server
from trio_responses import Config

StartServer = Callable[..., Awaitable[Server]]


@pytest.fixture
def start_server(nursery: trio.Nursery) -> StartServer:
    """Start a server with Config overrides; it stops when the test ends."""

    async def start(**overrides: Any) -> Server:
        config = Config(port=0, **overrides)
        server: Server = await nursery.start(partial(run_server, config))
        return server

    return start


@pytest.fixture
async def server(start_server: StartServer) -> Server:
    return await start_server()


@pytest.fixture(scope="session")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the whole session; tests flush it before use."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    """The ``--store`` URL of each backend in turn (an empty one for every test)."""
    kind: str = request.param
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'responses.db'}"
    server: RedisServer = request.getfixturevalue("redis")
    server.flush()
    return server.url
