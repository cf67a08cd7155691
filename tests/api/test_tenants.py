"""Tenants: what one API key can and cannot take from another, through the real server.

With several ``--api-key``s, the store's bounds (count and bytes) are shared
equally between the keys and a key's responses only ever evict its own; a key
holds at most its job slots (429 beyond, for that key only); ``/health`` shows
its statistics to admin keys only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import openai
import pytest
import trio
from openai import AsyncOpenAI

from tests.conftest import StartServer
from tests.support import MODEL, Server

T = TypeVar("T")

KEYS = ("key-a", "key-b")
LONG = "tokens:5000 delay:10"
"""About 50 s of output: a response that runs until it is cancelled."""
STATUS_LIMIT_S = 30.0
"""Generous bound on a status change the test waits for (a loaded 2-core box)."""


@asynccontextmanager
async def client_of(server: Server, key: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0) as client:
        yield client


async def is_stored(client: AsyncOpenAI, response_id: str) -> bool:
    try:
        await client.responses.retrieve(response_id)
    except openai.NotFoundError:
        return False
    return True


async def poll(read: Callable[[], Awaitable[T]], until: Callable[[T], bool]) -> T:
    """``read()`` until ``until`` holds for what it returns (the server is polled:
    what it is waited for happens inside it)."""
    with trio.fail_after(STATUS_LIMIT_S):
        while True:
            value = await read()
            if until(value):
                return value
            await trio.sleep(0.02)


async def wait_status(client: AsyncOpenAI, response_id: str, status: str) -> None:
    await poll(lambda: client.responses.retrieve(response_id), lambda r: r.status == status)


async def admin_jobs(server: Server) -> dict[str, int]:
    reply = await server.http.get("/health", headers={"Authorization": "Bearer admin"})
    jobs: dict[str, int] = reply.json()["jobs"]
    return jobs


def assert_error(reply: Any, status: int, *, type_: str, param: str | None, code: str) -> str:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert (body["error"]["type"], body["error"]["param"], body["error"]["code"]) == (
        type_,
        param,
        code,
    )
    message: str = body["error"]["message"]
    return message


# -- the store's bounds ------------------------------------------------------------------


async def test_one_key_cannot_evict_another_keys_responses(
    start_server: StartServer, store_url: str
) -> None:
    # Four finished responses in all: two for each key.
    server = await start_server(store_url=store_url, api_keys=KEYS, max_stored_responses=4)
    async with client_of(server, "key-b") as b:
        theirs = [(await b.responses.create(model=MODEL, input=f"b{n}")).id for n in range(2)]
        mine = [
            (await server.client.responses.create(model=MODEL, input=f"a{n}")).id for n in range(5)
        ]
        # key-a's own oldest made room for its newest; key-b lost nothing.
        assert [await is_stored(server.client, rid) for rid in mine] == [False] * 3 + [True] * 2
        assert [await is_stored(b, rid) for rid in theirs] == [True, True]
        assert (await b.responses.retrieve(theirs[0])).output_text == "You said: b0"


async def test_each_key_keeps_its_share_of_the_stores_bytes(
    start_server: StartServer, store_url: str
) -> None:
    # 50 kB for each key; a response below takes about 21 kB (its input, as stored).
    server = await start_server(store_url=store_url, api_keys=KEYS, max_store_bytes=100_000)
    large = "tokens:1 " + "x" * 20_000
    async with client_of(server, "key-b") as b:
        theirs = [(await b.responses.create(model=MODEL, input=f"b{n}")).id for n in range(3)]
        mine = [
            (await server.client.responses.create(model=MODEL, input=large)).id for n in range(4)
        ]
        assert [await is_stored(server.client, rid) for rid in mine] == [False] * 2 + [True] * 2
        assert [await is_stored(b, rid) for rid in theirs] == [True] * 3

        # A response whose output takes it past the key's share (about 60 kB: its
        # input and the echo of it) is kept, alone: the key's older ones make room.
        echoed = await server.client.responses.create(model=MODEL, input="word " * 6_000)
        assert echoed.status == "completed"
        retrieved = await server.client.responses.retrieve(echoed.id)
        assert retrieved.output_text == "You said: " + "word " * 6_000
        assert [await is_stored(server.client, rid) for rid in mine] == [False] * 4
        assert [await is_stored(b, rid) for rid in theirs] == [True] * 3


async def test_an_input_larger_than_the_keys_share_is_refused_before_it_runs(
    start_server: StartServer,
) -> None:
    server = await start_server(api_keys=KEYS, max_store_bytes=100_000)
    body = {"model": MODEL, "input": "x" * 60_000, "background": True}
    refused = await server.http.post(
        "/v1/responses", json=body, headers={"Authorization": "Bearer key-a"}
    )
    message = assert_error(
        refused,
        413,
        type_="invalid_request_error",
        param="input",
        code="store_limit_exceeded",
    )
    assert "store: false" in message and "50000 bytes" in message
    statistics = server.service.statistics()
    assert statistics.running_jobs == 0 and statistics.job_tasks == 0
    # Not stored, it fits: the same input is answered.
    unstored = await server.client.responses.create(
        model=MODEL, input="tokens:3 " + "x" * 60_000, store=False
    )
    assert unstored.status == "completed"
    with pytest.raises(openai.APIStatusError) as raised:
        await server.client.responses.create(model=MODEL, input="x" * 60_000)
    assert raised.value.status_code == 413


# -- job slots ---------------------------------------------------------------------------


async def test_a_key_at_its_job_limits_gets_429_and_other_keys_go_on(
    start_server: StartServer,
) -> None:
    server = await start_server(
        api_keys=KEYS,
        admin_keys=("admin",),
        max_active_jobs=2,
        max_active_jobs_per_key=1,
        max_queued_jobs_per_key=1,
    )
    a = server.client

    async def create_long() -> Any:
        return await a.responses.create(model=MODEL, input=LONG, background=True)

    first = await create_long()
    await wait_status(a, first.id, "in_progress")
    second = await create_long()  # waits for key-a's only slot
    assert second.status == "queued"

    # A third would wait as well: key-a has used its allowance, 429 for key-a only.
    refused = await server.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": LONG, "background": True},
        headers={"Authorization": "Bearer key-a"},
    )
    message = assert_error(
        refused, 429, type_="server_busy", param=None, code="rate_limit_exceeded"
    )
    assert "API key" in message
    with pytest.raises(openai.RateLimitError):
        await a.responses.create(model=MODEL, input="hello")

    async with client_of(server, "key-b") as b:
        # key-b takes the server's other slot at once: key-a's queue is not in its way.
        with trio.fail_after(STATUS_LIMIT_S):
            answered = await b.responses.create(model=MODEL, input="hello")
        assert answered.output_text == "You said: hello"
        in_background = await b.responses.create(model=MODEL, input="tokens:5", background=True)
        await wait_status(b, in_background.id, "completed")

    assert (await a.responses.retrieve(second.id)).status == "queued"
    # Once key-b's last job is recorded and gone:
    jobs = await poll(lambda: admin_jobs(server), lambda jobs: jobs["running"] == 2)
    assert jobs["active"] == 1 and jobs["queued"] == 1

    # Once key-a's first ends, its second gets the slot, and key-a may create again.
    await a.responses.cancel(first.id)
    await wait_status(a, second.id, "in_progress")
    third = await create_long()
    assert third.status == "queued"
    for response_id in (second.id, third.id):
        await a.responses.cancel(response_id)
    with trio.fail_after(STATUS_LIMIT_S):
        await server.service.wait_idle()


async def test_counting_and_compacting_take_a_place_under_the_keys_limits(
    start_server: StartServer,
) -> None:
    server = await start_server(api_keys=KEYS, max_active_jobs_per_key=1, max_queued_jobs_per_key=0)
    a = server.client
    running = await a.responses.create(model=MODEL, input=LONG, background=True)
    await wait_status(a, running.id, "in_progress")
    body = {"model": MODEL, "input": "hello", "instructions": "x" * 50_000}
    for path in ("/v1/responses/input_tokens", "/v1/responses/compact"):
        refused = await server.http.post(path, json=body, headers={"Authorization": "Bearer key-a"})
        assert_error(refused, 429, type_="server_busy", param=None, code="rate_limit_exceeded")
        answered = await server.http.post(
            path, json=body, headers={"Authorization": "Bearer key-b"}
        )
        assert answered.status_code == 200, answered.text[:300]
    await a.responses.cancel(running.id)
    with trio.fail_after(STATUS_LIMIT_S):
        await server.service.wait_idle()
    counted = await a.responses.input_tokens.count(model=MODEL, input="hello")
    assert counted.input_tokens > 0


# -- /health -------------------------------------------------------------------------------


async def test_health_statistics_need_an_admin_key(start_server: StartServer) -> None:
    server = await start_server(api_keys=KEYS, admin_keys=("admin-1", "admin-2"))
    liveness = await server.http.get("/health")
    assert liveness.status_code == 200
    assert liveness.json() == {"status": "ok"}

    for admin in ("admin-1", "admin-2"):
        full = await server.http.get("/health", headers={"Authorization": f"Bearer {admin}"})
        assert full.status_code == 200
        statistics = full.json()
        assert statistics["status"] == "ok"
        assert statistics["engine"]["kind"] == "scripted"
        assert statistics["jobs"]["running"] == 0
        assert statistics["store"]["kind"] == "memory"

    # An API key is no admin key, and a wrong key is refused, not taken for none.
    for key in ("key-a", "nope"):
        refused = await server.http.get("/health", headers={"Authorization": f"Bearer {key}"})
        assert_error(refused, 401, type_="authentication_error", param=None, code="invalid_api_key")
    # An admin key is no API key.
    async with client_of(server, "admin-1") as as_admin:
        with pytest.raises(openai.AuthenticationError):
            await as_admin.responses.create(model=MODEL, input="hello")


async def test_without_api_keys_health_shows_everything(start_server: StartServer) -> None:
    server = await start_server(admin_keys=("admin",))
    health = (await server.http.get("/health")).json()
    assert health["status"] == "ok"
    assert health["engine"]["kind"] == "scripted" and health["jobs"]["running"] == 0
