"""``serve --workers N``: N worker processes on one port, one supervisor, one Redis.

Each test flushes the session's ``redis-server`` (`tests.redis_server`) and starts
``trio-responses serve --workers N --store unix://…`` as a real child process
(`ServeCommand`: the supervisor, which starts the workers). Clients only know
the one port; the kernel (``SO_REUSEPORT``) picks the worker of each new
connection, so every request here goes on a connection of its own
(``Connection: close``) and the worker that answered is read from its
``x-worker-id`` header. What is checked holds whichever worker answers
(docs/operations.md, "Several workers on one machine").
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
import pytest
import trio
from openai import AsyncOpenAI

from tests.processes import ServeCommand
from tests.redis_server import RedisServer
from tests.scenarios.test_redis_replicas import (
    DONE,
    FINISHED,
    LIMIT_S,
    Reader,
    check_recovered_log,
    contiguous,
    one_terminal_last,
)
from tests.support import MODEL, validate_event
from trio_responses._config import Config
from trio_responses._workers import WorkerPolicy, supervise

pytestmark = pytest.mark.slow  # several server processes sharing one Redis

WORKERS = 3
TRIES = 200
"""Most fresh connections opened to meet a worker other than the one wanted (with
three workers each connection has two chances in three)."""
LEASE_S = 1.0
RECOVERY_LIMIT_S = 10.0
"""Most seconds from a worker's death to its responses ending on another worker."""
WORKER_LINE = re.compile(rb"worker (\d+) \(pid (\d+)\) listening")


@asynccontextmanager
async def supervisor(
    nursery: trio.Nursery, redis: RedisServer, workers: int, *flags: str
) -> AsyncIterator[ServeCommand]:
    """``serve --workers N`` on ``redis``, once every worker listens; stopped gracefully
    (SIGTERM) at the end of a passing test, killed with its workers otherwise."""
    command = await ServeCommand.start(
        nursery,
        "--workers",
        str(workers),
        "--store",
        redis.url,
        *flags,
        ready=False,
    )
    try:
        await command.wait_for(rb"%d workers listening" % workers, LIMIT_S)
        await command.wait_ready(LIMIT_S)
        yield command
        assert await command.stop(LIMIT_S) == 0, command.log.decode()
    except BaseException:
        print(f"---- supervisor and workers log ----\n{command.log.decode()}")
        with trio.CancelScope(shield=True):
            # The workers follow their supervisor out (their link to it closes).
            await command.kill()
        raise
    assert b"Traceback" not in command.log, command.log.decode()
    assert b"all workers stopped" in command.log


def pids(log: bytes) -> dict[str, list[int]]:
    """Each worker's pids, in the order they started listening (the supervisor's log)."""
    seen: dict[str, list[int]] = {}
    for worker, pid in WORKER_LINE.findall(log):
        seen.setdefault(worker.decode(), []).append(int(pid))
    return seen


@asynccontextmanager
async def clients(url: str) -> AsyncIterator[tuple[AsyncOpenAI, httpx2.AsyncClient]]:
    """The SDK and a raw HTTP client that open a connection for every request."""
    fresh = {"Connection": "close"}
    sdk = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, default_headers=fresh)
    http = httpx2.AsyncClient(base_url=url, timeout=LIMIT_S, headers=fresh)
    try:
        yield sdk, http
    finally:
        with trio.CancelScope(shield=True):
            await sdk.close()
            await http.aclose()


@dataclass
class WorkerReader(Reader):
    """A `Reader` that notes the worker serving it, and can be stopped."""

    worker: str = ""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    async def run(self, http: httpx2.AsyncClient, *, task_status: trio.TaskStatus[None]) -> None:
        with self.scope:
            try:
                async with http.stream("GET", self.path) as response:
                    self.status = response.status_code
                    self.worker = response.headers["x-worker-id"]
                    task_status.started()
                    async for chunk in response.aiter_bytes():
                        self.raw += chunk
                        if self.done_at is None and self.raw.endswith(DONE):
                            self.done_at = trio.current_time()
                        self._wake()
            finally:
                self.ended.set()
                self._wake()


def background(text: str) -> dict[str, Any]:
    return {"model": MODEL, "input": text, "background": True}


async def create(sdk: AsyncOpenAI, text: str) -> tuple[str, str]:
    """Create a background response: (its id, the worker that took the create)."""
    raw = await sdk.responses.with_raw_response.create(**background(text))
    return raw.parse().id, raw.headers["x-worker-id"]


async def until_status(
    sdk: AsyncOpenAI, response_id: str, statuses: frozenset[str]
) -> dict[str, Any]:
    """Retrieve (each time from whichever worker) until the status is one of ``statuses``."""
    with trio.fail_after(LIMIT_S):
        while True:
            response = await sdk.responses.retrieve(response_id)
            if response.status in statuses:
                dumped: dict[str, Any] = response.model_dump(mode="json")
                return dumped
            await trio.sleep(0.02)


async def sdk_events(sdk: AsyncOpenAI, response_id: str, after: int | None) -> list[Any]:
    """The response's events through the SDK's stream (``starting_after``), to the end."""
    if after is None:
        stream = await sdk.responses.retrieve(response_id, stream=True)
    else:
        stream = await sdk.responses.retrieve(response_id, stream=True, starting_after=after)
    with trio.fail_after(LIMIT_S * 3):
        return [event async for event in stream]


async def test_one_port_spreads_connections_over_the_workers_and_any_worker_serves_any_response(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    redis.flush()
    async with (
        supervisor(nursery, redis, WORKERS) as server,
        clients(server.url) as (sdk, http),
    ):
        # Creates through the one port land on every worker.
        created: dict[str, str] = {}  # response id -> the worker that took it
        for _ in range(TRIES):
            response_id, worker = await create(sdk, "tokens:20")
            created[response_id] = worker
            if len(set(created.values())) == WORKERS:
                break
        assert set(created.values()) == {str(n) for n in range(1, WORKERS + 1)}, created
        assert len(pids(server.log)) == WORKERS

        # Each is retrieved whole, and its stored log replayed and resumed, wherever asked;
        # every worker answers for each.
        for response_id in created:
            done = await until_status(sdk, response_id, FINISHED)
            assert done["status"] == "completed", done
            answered_by: set[str] = set()
            for _ in range(TRIES):
                raw = await sdk.responses.with_raw_response.retrieve(response_id)
                assert raw.parse().model_dump(mode="json") == done
                answered_by.add(raw.headers["x-worker-id"])
                if len(answered_by) == WORKERS:
                    break
            assert len(answered_by) == WORKERS, answered_by
            whole = await sdk_events(sdk, response_id, None)
            assert [e.sequence_number for e in whole] == list(range(len(whole)))
            assert whole[-1].type == "response.completed"
            assert whole[-1].response.model_dump(mode="json") == done
            tail = await sdk_events(sdk, response_id, len(whole) - 4)
            assert [e.model_dump(mode="json") for e in tail] == [
                e.model_dump(mode="json") for e in whole[-3:]
            ]

        # A running response is streamed from the start and resumed mid-way on any
        # worker, every reader getting the same events.
        running_id, owner = await create(sdk, "tokens:2000 delay:5")
        await until_status(sdk, running_id, frozenset({"in_progress"}))
        async with trio.open_nursery() as readers:
            whole_reader = Reader(f"/v1/responses/{running_id}?stream=true")
            await readers.start(whole_reader.run, http)
            await whole_reader.wait_for(lambda: whole_reader.raw.count(b"output_text.delta") >= 5)
            resumed_after = len(whole_reader.payloads()) - 1
            resumed = await sdk_events(sdk, running_id, resumed_after)
            whole = await whole_reader.wait_end(LIMIT_S * 3)
        assert contiguous(whole)
        assert one_terminal_last(whole)["type"] == "response.completed"
        assert [(e.sequence_number, e.type) for e in resumed] == [
            (p["sequence_number"], p["type"]) for p in whole[resumed_after + 1 :]
        ]
        assert resumed[-1].response.model_dump(mode="json") == await until_status(
            sdk, running_id, FINISHED
        )
        for payload in whole:
            validate_event(payload)

        # Cancel through the port until a worker other than the one running the
        # response answers; it stops and is recorded cancelled everywhere.
        for _ in range(TRIES):
            response_id, owner = await create(sdk, "tokens:5000 delay:10")
            await until_status(sdk, response_id, frozenset({"in_progress"}))
            raw = await sdk.responses.with_raw_response.cancel(response_id)
            cancelled = raw.parse()
            assert cancelled.status == "cancelled", cancelled
            if raw.headers["x-worker-id"] != owner:
                break
        else:
            pytest.fail("no cancel was answered by another worker than the response's")
        stored = await until_status(sdk, response_id, FINISHED)
        assert stored == cancelled.model_dump(mode="json")
        log = await sdk_events(sdk, response_id, None)
        assert log[-1].type == "response.failed" and log[-1].response.status == "cancelled"
        again = await sdk.responses.cancel(response_id)  # whichever worker: the same answer
        assert again.model_dump(mode="json") == stored
        finished_id, _ = await create(sdk, "tokens:5")
        await until_status(sdk, finished_id, FINISHED)
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.cancel(finished_id)
        assert refused.value.message.endswith("Cannot cancel a completed response.")


async def test_a_killed_worker_is_restarted_and_its_responses_recovered(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    redis.flush()
    flags = ("--job-lease", f"{LEASE_S:g}")
    async with (
        supervisor(nursery, redis, 2, *flags) as server,
        clients(server.url) as (sdk, http),
    ):
        response_id, owner = await create(sdk, "tokens:5000 delay:10")
        await until_status(sdk, response_id, frozenset({"in_progress"}))
        (dead_pid,) = pids(server.log)[owner]

        async with trio.open_nursery() as readers:
            # A reader on the other worker (its stream survives the kill).
            for _ in range(TRIES):
                reader = WorkerReader(f"/v1/responses/{response_id}?stream=true")
                await readers.start(reader.run, http)
                if reader.worker != owner:
                    break
                reader.scope.cancel()
            else:
                pytest.fail("no stream was served by the other worker")
            await reader.wait_for(lambda: reader.raw.count(b"output_text.delta") >= 3)

            killed_at = trio.current_time()
            os.kill(dead_pid, signal.SIGKILL)
            log = await reader.wait_end(RECOVERY_LIMIT_S + LIMIT_S)
        assert reader.done_at is not None
        latency = reader.done_at - killed_at
        print(f"recovery latency (kill -9 worker {owner} -> [DONE] on the other): {latency:.3f} s")
        assert latency < RECOVERY_LIMIT_S
        check_recovered_log(log, response_id)
        stored = await sdk.responses.retrieve(response_id)
        assert stored.status == "failed"
        assert stored.error is not None and str(stored.error.code) == "server_restarted"

        # The supervisor started the worker again: a new process, serving.
        await server.wait_for(rb"worker %s exited with status -9" % owner.encode(), LIMIT_S)
        again = rb"worker %s \(pid (?!%d\))\d+\) listening" % (owner.encode(), dead_pid)
        await server.wait_for(again, LIMIT_S)
        (_, new_pid) = pids(server.log)[owner]
        assert new_pid != dead_pid
        with trio.fail_after(LIMIT_S):
            while True:
                health = (await http.get("/health")).json()
                if health["worker"] == {"id": owner, "pid": new_pid}:
                    break
        # The new worker runs and answers responses like the others.
        for _ in range(TRIES):
            response_id, worker = await create(sdk, "tokens:5")
            if worker == owner:
                break
        else:
            pytest.fail(f"no create reached the restarted worker {owner}")
        assert (await until_status(sdk, response_id, FINISHED))["status"] == "completed"


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie not yet reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_workers_stop_when_their_supervisor_is_killed(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    redis.flush()
    command = await ServeCommand.start(nursery, "--workers", "2", "--store", redis.url, ready=False)
    await command.wait_for(rb"2 workers listening", LIMIT_S)
    workers = [pid for (pid,) in pids(command.log).values()]
    assert len(workers) == 2 and not any(gone(pid) for pid in workers)
    assert await command.kill() == -9
    with trio.fail_after(LIMIT_S):
        while True:  # nothing to wait on: they are no children of this process
            if all(gone(pid) for pid in workers):
                break
            await trio.sleep(0.05)


async def test_a_worker_that_keeps_dying_soon_after_starting_makes_the_supervisor_give_up(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    redis.flush()
    caplog.set_level(logging.INFO, logger="trio_responses.workers")
    config = Config(workers=2, store_url=redis.url, port=0)
    argv = ["serve", "--store", redis.url, "--log-level", "warning"]
    policy = WorkerPolicy(stable_s=600, first_backoff_s=0.1, max_quick_exits=3)
    killed: list[int] = []
    status: int | None = None

    async def run() -> None:
        nonlocal status
        status = await supervise(config, argv, policy=policy)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        with trio.fail_after(LIMIT_S * 3):
            while status is None:  # kill worker 1 each time it listens, until given up
                for pid in pids(caplog.text.encode()).get("1", []):
                    if pid not in killed:
                        killed.append(pid)
                        os.kill(pid, signal.SIGKILL)
                await trio.sleep(0.05)
    assert status == 1
    assert len(killed) == 3
    messages = [record.getMessage() for record in caplog.records]
    assert (
        "worker 1 exited 3 times in a row within 600 s of starting (last status -9): "
        "giving up" in messages
    )
    # Restarted at once after the first death, then after a backoff.
    restarts = [m for m in messages if m.startswith("worker 1 exited with status -9")]
    assert len(restarts) == 2 and restarts[0].endswith("restarting it"), restarts
    assert restarts[1].endswith("restarting it in 0.1 s"), restarts
    # The other worker was stopped gracefully.
    assert not [m for m in messages if m.startswith("worker 2") and "killing" in m]
