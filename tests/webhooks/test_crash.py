"""A server killed (kill -9) after a background response's final state is recorded,
before its webhook got through: the event is delivered after the restart (SQLite),
or by the other replica (Redis), once, with the same ``webhook-id``.

Real ``trio-responses serve`` children (`ServeCommand`), a real receiver on a
loopback port that holds the first delivery open (the server is mid-delivery
when it dies), the openai SDK for endpoints and ``client.webhooks.unwrap``.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from openai import AsyncOpenAI

from tests.processes import ServeCommand
from tests.redis_server import RedisServer
from tests.support import MODEL
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.slow  # server processes

ALL_TYPES: Any = ["response.completed", "response.failed"]
FLAGS = ("--webhook-allow-host", "127.0.0.1", "--webhook-timeout", "2", "--job-lease", "1")
"""A delivery's lease: twice the timeout and ten seconds (14 s)."""


@asynccontextmanager
async def sdk(command: ServeCommand) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=command.url + "/v1", api_key="-", max_retries=0) as client:
        yield client


async def _ended(client: AsyncOpenAI, response_id: str) -> str:
    with trio.fail_after(60):
        while True:
            response = await client.responses.retrieve(response_id)
            if response.status not in ("queued", "in_progress"):
                return response.status
            await trio.sleep(0.05)


async def _receiver(nursery: trio.Nursery) -> Receiver:
    receiver = Receiver()
    receiver.script.append("hang")  # the first delivery never gets an answer
    await nursery.start(receiver.run)
    return receiver


async def _deliver_once_more(receiver: Receiver, client: AsyncOpenAI, secret: str) -> str:
    """Wait for the delivery that gets through; check it is the same event, once."""
    await receiver.wait_for(1, delivered=True)
    hung, delivered = receiver.received
    assert hung.answered is None and delivered.answered == 200
    assert hung.headers["webhook-id"] == delivered.headers["webhook-id"]
    event = client.webhooks.unwrap(delivered.body, delivered.headers, secret=secret)
    with trio.move_on_after(1):
        await receiver.wait_for(3)
    assert len(receiver.received) == 2
    return str(event.data.id)


async def test_sqlite_delivers_after_a_restart(
    nursery: trio.Nursery, tmp_path: pathlib.Path
) -> None:
    receiver = await _receiver(nursery)
    store = ("--store", f"sqlite:///{tmp_path / 'responses.db'}", *FLAGS)
    first = await ServeCommand.start(nursery, *store)
    async with sdk(first) as client:
        endpoint = await client.webhooks.create(name="h", url=receiver.url, event_types=ALL_TYPES)
        response = await client.responses.create(model=MODEL, input="hello", background=True)
        await receiver.wait_for(1)  # the server is posting it now
        assert await _ended(client, response.id) == "completed"
    await first.kill()

    second = await ServeCommand.start(nursery, *store)
    async with sdk(second) as client:
        assert await _deliver_once_more(receiver, client, endpoint.signing_secret) == response.id


async def test_redis_another_replica_delivers(nursery: trio.Nursery, redis: RedisServer) -> None:
    redis.flush()
    receiver = await _receiver(nursery)
    store = ("--store", redis.url, *FLAGS)
    dying = await ServeCommand.start(nursery, *store)
    async with sdk(dying) as client:
        endpoint = await client.webhooks.create(name="h", url=receiver.url, event_types=ALL_TYPES)
        response = await client.responses.create(model=MODEL, input="hello", background=True)
        await receiver.wait_for(1)  # the replica posting it holds its lease
        assert await _ended(client, response.id) == "completed"
    # The survivor starts after the claim: the dying replica is the one posting it.
    survivor = await ServeCommand.start(nursery, *store)
    await dying.kill()
    async with sdk(survivor) as client:
        assert await _deliver_once_more(receiver, client, endpoint.signing_secret) == response.id
