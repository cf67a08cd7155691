"""Fixtures shared by every test module."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest
import trio

# openai-harmony downloads its vocab on first use; offline, point it at a local copy.
_SHARED_VOCAB = pathlib.Path(__file__).resolve().parents[2] / "shared" / "harmony"
if "TIKTOKEN_ENCODINGS_BASE" not in os.environ and _SHARED_VOCAB.is_dir():
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(_SHARED_VOCAB)

from tests.support import Server, run_server  # noqa: E402
from trio_responses import Config  # noqa: E402

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
