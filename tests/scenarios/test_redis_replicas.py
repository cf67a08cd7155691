"""Several replicas on one Redis: real server processes, the SDK and raw HTTP.

Each test flushes the session's ``redis-server`` (`tests.redis_server`), starts
two or three ``trio-responses serve --store unix://…?db=0`` children
(`ServeCommand`) and checks what a client sees when a response runs on one
replica and is read, streamed, cancelled, deleted or continued on another, and
when the replica running it dies (SPEC §4, §12; docs/operations.md, "Several
replicas"). Every child is killed when its test ends, passed or failed.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
import pytest
import trio
from openai import AsyncOpenAI
from openai.types.responses import Response

from tests.processes import ServeCommand
from tests.redis_server import RedisServer
from tests.support import (
    MODEL,
    SSEEvent,
    check_stream,
    parse_sse,
    validate_event,
    validate_response,
)

pytestmark = pytest.mark.slow  # several server processes sharing one Redis

LIMIT_S = 60
"""Most seconds a test waits for a status or for the end of a short stream."""
FOLLOW_LIMIT_S = 180
"""Most seconds to follow a long response (``tokens:3000 delay:5``, 15 s when idle) to its
end: on a loaded 2-core machine it takes twice as long or more."""
CANCEL_LIMIT_S = 1.0
"""SPEC §4: a cancelled job stops, and its readers get the terminal event, within 1 s."""
LEASE_S = 1.0
"""``--job-lease`` where a replica's death matters."""
RECOVERY_LIMIT_S = 10.0
"""Most seconds from a replica's death to its responses ending on a survivor."""
FINISHED = frozenset({"completed", "incomplete", "failed", "cancelled"})
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
DONE = b"data: [DONE]\n\n"


@dataclass
class Replica:
    """One server process with the SDK and a raw HTTP client on it."""

    name: str
    command: ServeCommand
    sdk: AsyncOpenAI
    http: httpx2.AsyncClient

    @property
    def url(self) -> str:
        return self.command.url

    async def health(self) -> dict[str, Any]:
        reply = await self.http.get("/health")
        assert reply.status_code == 200, reply.text
        health: dict[str, Any] = reply.json()
        return health

    async def get_json(self, response_id: str) -> dict[str, Any]:
        """``GET /v1/responses/{id}`` as sent (200 expected)."""
        reply = await self.http.get(f"/v1/responses/{response_id}")
        assert reply.status_code == 200, reply.text
        response: dict[str, Any] = reply.json()
        return response


@asynccontextmanager
async def sdk_client(url: str, api_key: str) -> AsyncIterator[AsyncOpenAI]:
    sdk = AsyncOpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0)
    try:
        yield sdk
    finally:
        with trio.CancelScope(shield=True):
            await sdk.close()


@asynccontextmanager
async def replicas(
    nursery: trio.Nursery, redis: RedisServer, count: int, *flags: str, api_key: str = "unused"
) -> AsyncIterator[list[Replica]]:
    """``count`` replicas on ``redis`` (started together); all killed on exit.

    On failure, their logs are printed (pytest shows them with the failure).
    """
    names = "ABCDEFGH"[:count]
    commands: list[ServeCommand] = []
    try:
        for _ in names:
            commands.append(
                await ServeCommand.start(
                    nursery, "--store", redis.url, *flags, ready=False, timeout_s=LIMIT_S
                )
            )
        for command in commands:
            await command.wait_ready(LIMIT_S)
        async with AsyncExitStack() as stack:
            started = []
            for name, command in zip(names, commands, strict=True):
                sdk = await stack.enter_async_context(sdk_client(command.url, api_key))
                http = await stack.enter_async_context(
                    httpx2.AsyncClient(
                        base_url=command.url,
                        timeout=LIMIT_S,
                        headers={"Authorization": f"Bearer {api_key}"},
                    )
                )
                started.append(Replica(name, command, sdk, http))
            yield started
    except BaseException:
        for name, command in zip(names, commands, strict=False):
            print(f"---- replica {name} ({command.url}) log ----\n{command.log.decode()}")
        raise
    finally:
        with trio.CancelScope(shield=True):
            for command in commands:
                await command.kill()
    for command in commands:
        assert b"Traceback" not in command.log, command.log.decode()


@dataclass
class Reader:
    """One ``GET /v1/responses/{id}?stream=true`` read to its end by a task of its own."""

    path: str
    status: int = 0
    raw: bytes = b""
    done_at: float | None = None
    """`trio.current_time` when ``data: [DONE]`` arrived."""
    ended: trio.Event = field(default_factory=trio.Event)
    _grew: trio.Event = field(default_factory=trio.Event)

    async def run(self, http: httpx2.AsyncClient, *, task_status: trio.TaskStatus[None]) -> None:
        """Read the body; reports started once the status line and headers are in."""
        try:
            async with http.stream("GET", self.path) as response:
                self.status = response.status_code
                if self.status != 200:
                    self.raw = await response.aread()
                    task_status.started()
                    return
                task_status.started()
                async for chunk in response.aiter_bytes():
                    self.raw += chunk
                    if self.done_at is None and self.raw.endswith(DONE):
                        self.done_at = trio.current_time()
                    self._wake()
        finally:
            self.ended.set()
            self._wake()

    def _wake(self) -> None:
        self._grew.set()
        self._grew = trio.Event()

    def events(self) -> list[SSEEvent]:
        """The complete events read so far (comments skipped)."""
        return parse_sse(self.raw[: self.raw.rfind(b"\n\n") + 2])

    def payloads(self) -> list[dict[str, Any]]:
        """The events' JSON payloads (``[DONE]`` left out); checks ``event`` = ``type``."""
        payloads = []
        for event in self.events():
            if event.data == "[DONE]":
                continue
            payload = event.json()
            assert event.event == payload["type"], event
            payloads.append(payload)
        return payloads

    async def wait_for(self, condition: Callable[[], bool], limit_s: float = LIMIT_S) -> None:
        with trio.fail_after(limit_s):
            while not condition():
                assert not self.ended.is_set(), f"the stream ended first: {self.raw[-400:]!r}"
                await self._grew.wait()

    async def wait_end(self, limit_s: float = LIMIT_S) -> list[dict[str, Any]]:
        """Wait for the end of the body; it must end with ``[DONE]``. Returns the payloads."""
        with trio.fail_after(limit_s):
            await self.ended.wait()
        assert self.raw.endswith(DONE), self.raw[-400:]
        assert self.raw.count(DONE) == 1
        return self.payloads()


async def follow_any(
    nursery: trio.Nursery, replica: Replica, response_id: str, starting_after: int | None = None
) -> Reader:
    """Start reading ``response_id``'s event stream from ``replica`` (any status)."""
    path = f"/v1/responses/{response_id}?stream=true"
    if starting_after is not None:
        path += f"&starting_after={starting_after}"
    reader = Reader(path)
    await nursery.start(reader.run, replica.http)
    return reader


async def follow(
    nursery: trio.Nursery, replica: Replica, response_id: str, starting_after: int | None = None
) -> Reader:
    """Start reading ``response_id``'s event stream from ``replica`` (200 expected)."""
    reader = await follow_any(nursery, replica, response_id, starting_after)
    assert reader.status == 200, reader.raw
    return reader


async def poll(
    retrieve: Callable[[], Any], until: Callable[[Any], bool], limit_s: float = LIMIT_S
) -> Any:
    """Call ``retrieve`` until ``until`` holds for its result (at most ``limit_s``)."""
    with trio.fail_after(limit_s):
        while True:
            value = await retrieve()
            if until(value):
                return value
            await trio.sleep(0.01)


async def poll_status(
    replica: Replica, response_id: str, statuses: frozenset[str], limit_s: float = LIMIT_S
) -> Response:
    response: Response = await poll(
        lambda: replica.sdk.responses.retrieve(response_id),
        lambda r: r.status in statuses,
        limit_s,
    )
    return response


def contiguous(payloads: list[dict[str, Any]], first: int = 0) -> bool:
    return [p["sequence_number"] for p in payloads] == list(range(first, first + len(payloads)))


def one_terminal_last(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """The terminal event, which must be the only one and the last."""
    terminals = [p for p in payloads if p["type"] in TERMINAL]
    assert len(terminals) == 1 and terminals[0] is payloads[-1], [p["type"] for p in terminals]
    return terminals[0]


def sdk_shaped(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with our ``server_restarted`` error code (not in the SDK's literal)
    replaced by ``server_error``, so that the rest of it validates strictly."""
    response = payload.get("response")
    if isinstance(response, dict) and (response.get("error") or {}).get("code") == (
        "server_restarted"
    ):
        error = {**response["error"], "code": "server_error"}
        return {**payload, "response": {**response, "error": error}}
    return payload


def dump(response: Response) -> dict[str, Any]:
    return response.model_dump(mode="json")


def background(text: str) -> dict[str, Any]:
    return {"model": MODEL, "input": text, "background": True}


# -- 1. retrieve and stream on B what runs on A ------------------------------------------------


async def test_a_response_running_on_one_replica_is_retrieved_and_streamed_on_another(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    redis.flush()
    async with replicas(nursery, redis, 2) as (a, b):
        created = await a.sdk.responses.create(**background("tokens:3000 delay:5"))
        assert created.status == "queued" and created.output == []
        async with trio.open_nursery() as readers:
            on_a = await follow(readers, a, created.id)
            # Streamed on B from the start once B sees it running (streaming it on B
            # at once is `test_…_as_soon_as_it_is_created`).
            await poll_status(b, created.id, frozenset({"in_progress"}))
            whole_on_b = await follow(readers, b, created.id)
            # B sees it running, with the items finished so far (the reasoning).
            running_json: dict[str, Any] = await poll(
                lambda: b.get_json(created.id),
                lambda r: r["status"] != "queued" and len(r["output"]) >= 1,
            )
            running = validate_response(running_json)
            assert running.status == "in_progress", running
            assert running.usage is None and running.completed_at is None
            assert running.background is True
            assert [item.type for item in running.output] == ["reasoning"]
            # Resume on B from the middle of what has been written: a replay, then live.
            after = 3
            tail_on_b = await follow(readers, b, created.id, starting_after=after)
            await tail_on_b.wait_for(lambda: len(tail_on_b.payloads()) >= 1)
            still = await b.sdk.responses.retrieve(created.id)
            assert still.status == "in_progress"  # what follows the replay comes live
            with trio.fail_after(FOLLOW_LIMIT_S):
                async with b.sdk.responses.stream(
                    response_id=created.id, starting_after=after
                ) as sdk_stream:
                    sdk_numbers = [event.sequence_number async for event in sdk_stream]
                    sdk_final = await sdk_stream.get_final_response()
            full_on_a = await on_a.wait_end(FOLLOW_LIMIT_S)
            full_on_b = await whole_on_b.wait_end(FOLLOW_LIMIT_S)
            tail = await tail_on_b.wait_end(FOLLOW_LIMIT_S)

        check_stream(full_on_b)
        assert full_on_b[-1]["type"] == "response.completed"
        # A's stream (its own ring) and B's (the Redis Stream) carry the same events.
        assert whole_on_b.events() == on_a.events()
        assert full_on_b == full_on_a
        assert tail == full_on_b[after + 1 :]
        assert contiguous(tail, after + 1)
        assert sdk_numbers == list(range(after + 1, len(full_on_b)))

        final = await b.sdk.responses.retrieve(created.id)
        assert final.status == "completed"
        assert dump(final) == dump(await a.sdk.responses.retrieve(created.id))
        final_json = await b.get_json(created.id)
        assert final_json == full_on_b[-1]["response"]
        assert sdk_final.id == created.id and sdk_final.output_text == final.output_text
        # The item B showed while running is the item the stream finished, and stays first.
        first_done = next(p for p in full_on_b if p["type"] == "response.output_item.done")
        assert running_json["output"] == [first_done["item"]]
        assert final_json["output"][0] == first_done["item"]
        assert final.usage is not None and final.usage.output_tokens >= 3000


async def test_a_response_can_be_streamed_on_another_replica_as_soon_as_it_is_created(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    # Behind a load balancer without stickiness, the create and the stream of one
    # client may land on different replicas, one right after the other.
    redis.flush()
    async with replicas(nursery, redis, 2) as (a, b):
        refusals: list[tuple[int, int, str]] = []
        for attempt in range(30):
            created = await a.sdk.responses.create(**background("tokens:5"))
            async with trio.open_nursery() as readers:
                reader = await follow_any(readers, b, created.id)
                if reader.status != 200:
                    refusals.append((attempt, reader.status, reader.raw.decode()))
                    continue
                log = await reader.wait_end()
            check_stream(log)
            assert log[0]["type"] == "response.created"
        assert refusals == [], refusals


# -- 2. cancel on B what runs on A --------------------------------------------------------------


async def test_cancel_on_another_replica_stops_the_job_within_a_second(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    redis.flush()
    async with replicas(nursery, redis, 2, "--max-active-jobs", "1") as (a, b):
        created = await a.sdk.responses.create(**background("tokens:5000 delay:10"))
        await poll_status(b, created.id, frozenset({"in_progress"}))
        async with trio.open_nursery() as readers:
            on_a = await follow(readers, a, created.id)
            on_b = await follow(readers, b, created.id)
            await on_b.wait_for(lambda: b"event: response.output_text.delta" in on_b.raw)
            await on_a.wait_for(lambda: b"event: response.output_text.delta" in on_a.raw)
            running = await b.sdk.responses.retrieve(created.id)
            assert running.status == "in_progress"

            # A response waiting for A's only slot is cancelled from B as well.
            waiting = await a.sdk.responses.create(**background("tokens:5"))
            assert (await b.sdk.responses.retrieve(waiting.id)).status == "queued"
            assert (await a.health())["jobs"]["queued"] == 1
            on_b_waiting = await follow(readers, b, waiting.id)
            withdrawn = await b.sdk.responses.cancel(waiting.id)
            assert withdrawn.status == "cancelled" and withdrawn.output == []
            waiting_log = await on_b_waiting.wait_end()
            assert [p["type"] for p in waiting_log] == [
                "response.created",
                "response.queued",
                "response.failed",
            ]
            assert waiting_log[-1]["response"]["status"] == "cancelled"
            assert (await a.sdk.responses.retrieve(waiting.id)).status == "cancelled"

            health = await poll(a.health, lambda h: h["jobs"]["running"] == 1)
            assert health["jobs"]["queued"] == 0 and health["jobs"]["active"] == 1
            assert health["engine"]["statistics"]["running"] == 1

            started = trio.current_time()
            cancelled = await b.sdk.responses.cancel(created.id)
            returned = trio.current_time() - started
            assert cancelled.status == "cancelled", cancelled
            assert cancelled.id == created.id
            assert returned < CANCEL_LIMIT_S, f"cancel on B took {returned:.3f} s"

            await poll(a.health, lambda h: h["jobs"]["running"] == 0, CANCEL_LIMIT_S)
            stopped = trio.current_time() - started
            health = await a.health()
            assert health["engine"]["statistics"]["running"] == 0, health
            assert health["jobs"]["active"] == 0 and health["jobs"]["queued"] == 0
            log_a = await on_a.wait_end(CANCEL_LIMIT_S)
            log_b = await on_b.wait_end(CANCEL_LIMIT_S)
        assert on_a.done_at is not None and on_b.done_at is not None
        latencies = {
            "cancel call": returned,
            "job gone on A": stopped,
            "[DONE] on A": on_a.done_at - started,
            "[DONE] on B": on_b.done_at - started,
        }
        print("cancel latencies (s):", {k: round(v, 3) for k, v in latencies.items()})
        assert max(latencies.values()) < CANCEL_LIMIT_S, latencies

        for log in (log_a, log_b):
            assert contiguous(log)
            terminal = one_terminal_last(log)
            assert terminal["type"] == "response.failed"
            assert terminal["response"]["status"] == "cancelled"
            assert terminal["response"]["id"] == created.id
            for payload in log:
                validate_event(payload)
        assert log_a == log_b
        assert log_b[-1]["response"] == await b.get_json(created.id)

        # Both replicas show it cancelled; cancelling it again returns it again.
        for replica in (a, b):
            stored = await replica.sdk.responses.retrieve(created.id)
            assert dump(stored) == dump(cancelled)
            assert dump(await replica.sdk.responses.cancel(created.id)) == dump(cancelled)
        # The stored log replays the same events from either replica.
        async with trio.open_nursery() as readers:
            again = await follow(readers, b, created.id)
            assert await again.wait_end() == log_b
        # A finished response cannot be cancelled, wherever it ran.
        done = await a.sdk.responses.create(**background("tokens:5"))
        await poll_status(a, done.id, FINISHED)
        with pytest.raises(openai.BadRequestError) as refused:
            await b.sdk.responses.cancel(done.id)
        assert refused.value.message.endswith("Cannot cancel a completed response.")


# -- 3. delete on B --------------------------------------------------------------------------------


async def test_delete_on_another_replica_waits_for_the_end_of_the_response(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    redis.flush()
    async with replicas(nursery, redis, 2) as (a, b):
        finishing = await a.sdk.responses.create(**background("tokens:1000 delay:5"))
        cancelling = await a.sdk.responses.create(**background("tokens:5000 delay:10"))
        for response_id in (finishing.id, cancelling.id):
            await poll_status(b, response_id, frozenset({"in_progress"}))
            with pytest.raises(openai.BadRequestError) as refused:
                await b.sdk.responses.delete(response_id)
            assert refused.value.status_code == 400
            assert refused.value.param == "response_id"
            assert "still in_progress" in refused.value.message, refused.value.message
            # Refused means untouched: it still runs on A.
            assert (await a.sdk.responses.retrieve(response_id)).status == "in_progress"

        await poll_status(b, finishing.id, FINISHED)
        assert (await b.sdk.responses.cancel(cancelling.id)).status == "cancelled"

        for response_id in (finishing.id, cancelling.id):
            deleted = await b.http.delete(f"/v1/responses/{response_id}")
            assert deleted.status_code == 200, deleted.text
            assert deleted.json() == {
                "id": response_id,
                "object": "response.deleted",
                "deleted": True,
            }
            for replica in (a, b):
                with pytest.raises(openai.NotFoundError):
                    await replica.sdk.responses.retrieve(response_id)
                streamed = await replica.http.get(f"/v1/responses/{response_id}?stream=true")
                assert streamed.status_code == 404, streamed.text
                assert streamed.json()["error"]["code"] == "not_found"
                with pytest.raises(openai.NotFoundError):
                    await replica.sdk.responses.input_items.list(response_id)
            with pytest.raises(openai.NotFoundError):
                await a.sdk.responses.delete(response_id)
        health = await a.health()
        assert health["jobs"]["running"] == 0


# -- 4. previous_response_id across replicas ----------------------------------------------------


async def test_previous_response_id_across_replicas(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    redis.flush()
    async with replicas(nursery, redis, 2) as (a, b):
        first = await a.sdk.responses.create(model=MODEL, input="My name is Ada.")
        assert first.status == "completed" and first.usage is not None
        second = await b.sdk.responses.create(
            model=MODEL, input="What is my name?", previous_response_id=first.id
        )
        assert second.status == "completed" and second.usage is not None
        assert second.previous_response_id == first.id
        assert second.usage.input_tokens > first.usage.input_tokens
        assert second.output_text == "You said: What is my name?"
        # And back on A, from B's response: the whole chain is there.
        third = await a.sdk.responses.create(
            model=MODEL, input="Thanks.", previous_response_id=second.id
        )
        assert third.usage is not None
        assert third.usage.input_tokens > second.usage.input_tokens
        # Each record holds only its own input.
        items = [item async for item in b.sdk.responses.input_items.list(second.id)]
        assert len(items) == 1 and items[0].type == "message"

        running = await a.sdk.responses.create(**background("tokens:1000 delay:5"))
        await poll_status(b, running.id, frozenset({"in_progress"}))
        with pytest.raises(openai.BadRequestError) as refused:
            await b.sdk.responses.create(
                model=MODEL, input="Go on.", previous_response_id=running.id
            )
        assert refused.value.status_code == 400
        assert refused.value.param == "previous_response_id"
        assert "still in_progress" in refused.value.message, refused.value.message
        # Once it has finished, B continues from it.
        finished = await poll_status(b, running.id, FINISHED)
        assert finished.status == "completed" and finished.usage is not None
        follow_up = await b.sdk.responses.create(
            model=MODEL, input="Go on.", previous_response_id=running.id
        )
        assert follow_up.status == "completed" and follow_up.usage is not None
        assert follow_up.usage.input_tokens > finished.usage.input_tokens
        with pytest.raises(openai.NotFoundError):
            await b.sdk.responses.create(
                model=MODEL, input="x", previous_response_id="resp_" + "0" * 32
            )


# -- 5. a replica dies ---------------------------------------------------------------------------


async def kill_and_wait_for_recovery(
    dead: Replica, survivors: list[Replica], response_id: str, readers: list[Reader]
) -> float:
    """SIGKILL ``dead``; returns the seconds until every reader got ``[DONE]``."""
    assert dead.command.process.returncode is None
    killed_at = trio.current_time()
    assert await dead.command.kill() == -9
    for reader in readers:
        await reader.wait_end(RECOVERY_LIMIT_S + LIMIT_S)
    assert all(reader.done_at is not None for reader in readers)
    latency = max(reader.done_at or 0 for reader in readers) - killed_at
    for survivor in survivors:
        stored = await survivor.sdk.responses.retrieve(response_id)
        assert stored.status == "failed", stored
        assert stored.error is not None and str(stored.error.code) == "server_restarted"
    return latency


def check_recovered_log(log: list[dict[str, Any]], response_id: str) -> dict[str, Any]:
    assert contiguous(log)
    terminal = one_terminal_last(log)
    assert terminal["type"] == "response.failed"
    assert terminal["response"]["id"] == response_id
    assert terminal["response"]["status"] == "failed"
    assert terminal["response"]["error"]["code"] == "server_restarted"
    for payload in log:
        validate_event(sdk_shaped(payload))
    return terminal


RECOVERED_LINE = re.compile(rb"(resp_\w+) failed: the server running it stopped")


async def test_a_dead_replicas_response_fails_on_a_survivor(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    redis.flush()
    flags = ("--job-lease", f"{LEASE_S:g}")
    async with replicas(nursery, redis, 2, *flags) as (a, b):
        created = await a.sdk.responses.create(**background("tokens:5000 delay:10"))
        await poll_status(b, created.id, frozenset({"in_progress"}))
        async with trio.open_nursery() as readers:
            on_b = await follow(readers, b, created.id)
            await on_b.wait_for(lambda: on_b.raw.count(b"event: response.output_text.delta") >= 5)
            latency = await kill_and_wait_for_recovery(a, [b], created.id, [on_b])
        print(f"recovery latency (kill -9 A -> [DONE] on B): {latency:.3f} s")
        assert latency < RECOVERY_LIMIT_S
        # The lease runs out before anyone may recover it.
        assert latency > LEASE_S / 3

        log = on_b.payloads()
        terminal = check_recovered_log(log, created.id)
        assert [p["type"] for p in log[:3]] == [
            "response.created",
            "response.queued",
            "response.in_progress",
        ]
        assert await b.get_json(created.id) == terminal["response"]
        # A replay from B gives the same log, ending the same way.
        async with trio.open_nursery() as readers:
            again = await follow(readers, b, created.id)
            assert await again.wait_end() == log
            tail = await follow(readers, b, created.id, starting_after=len(log) - 3)
            assert await tail.wait_end() == log[-2:]
        with pytest.raises(openai.BadRequestError):
            await b.sdk.responses.cancel(created.id)
        assert RECOVERED_LINE.findall(b.command.log) == [created.id.encode()]
        assert (await b.health())["jobs"]["running"] == 0


async def test_of_two_survivors_exactly_one_ends_the_dead_replicas_response(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    redis.flush()
    flags = ("--job-lease", f"{LEASE_S:g}")
    async with replicas(nursery, redis, 3, *flags) as (a, b, c):
        created = await a.sdk.responses.create(**background("tokens:5000 delay:10"))
        await poll_status(b, created.id, frozenset({"in_progress"}))
        async with trio.open_nursery() as readers:
            on_b = await follow(readers, b, created.id)
            on_c = await follow(readers, c, created.id)
            for reader in (on_b, on_c):
                await reader.wait_for(
                    lambda r=reader: r.raw.count(b"event: response.output_text.delta") >= 5
                )
            latency = await kill_and_wait_for_recovery(a, [b, c], created.id, [on_b, on_c])
        print(f"recovery latency with two survivors: {latency:.3f} s")
        assert latency < RECOVERY_LIMIT_S

        log_b = on_b.payloads()
        check_recovered_log(log_b, created.id)
        assert on_c.payloads() == log_b
        # The stored log itself ends with exactly one terminal event.
        async with trio.open_nursery() as readers:
            for replica in (b, c):
                replayed = await follow(readers, replica, created.id)
                assert await replayed.wait_end() == log_b
        # One survivor claimed it; the other found it ended. Both go on recovering
        # every job_lease / 2: a window of several rounds in which a second terminal
        # event would have to show (this waits for no state; it looks for an absence).
        await trio.sleep(3 * LEASE_S)
        async with trio.open_nursery() as readers:
            replayed = await follow(readers, b, created.id)
            assert await replayed.wait_end() == log_b
        claims = RECOVERED_LINE.findall(b.command.log) + RECOVERED_LINE.findall(c.command.log)
        assert claims == [created.id.encode()], claims
        for replica in (b, c):
            stored = await replica.sdk.responses.retrieve(created.id)
            assert dump(stored)["error"]["code"] == "server_restarted"
            assert await replica.get_json(created.id) == log_b[-1]["response"]


# -- 6. owners across replicas -------------------------------------------------------------------


async def test_a_response_is_visible_only_to_its_key_on_every_replica(
    nursery: trio.Nursery, redis: RedisServer
) -> None:
    redis.flush()
    keys = ("--api-key", "k1", "--api-key", "k2")
    async with (
        replicas(nursery, redis, 2, *keys, api_key="k1") as (a, b),
        sdk_client(b.url, "k2") as other_on_b,
        sdk_client(a.url, "k2") as other_on_a,
    ):
        finished = await a.sdk.responses.create(model=MODEL, input="mine")
        running = await a.sdk.responses.create(**background("tokens:5000 delay:10"))
        await poll_status(b, running.id, frozenset({"in_progress"}))

        for response_id in (finished.id, running.id):
            # k1 sees it on B...
            assert (await b.sdk.responses.retrieve(response_id)).id == response_id
            # ...k2 sees nothing, on either replica, whatever it asks.
            for other in (other_on_b, other_on_a):
                with pytest.raises(openai.NotFoundError):
                    await other.responses.retrieve(response_id)
                with pytest.raises(openai.NotFoundError):
                    await other.responses.input_items.list(response_id)
                with pytest.raises(openai.NotFoundError):
                    await other.responses.cancel(response_id)
                with pytest.raises(openai.NotFoundError):
                    await other.responses.delete(response_id)
                with pytest.raises(openai.NotFoundError):
                    await other.responses.create(
                        model=MODEL, input="x", previous_response_id=response_id
                    )
            streamed = await b.http.get(
                f"/v1/responses/{response_id}?stream=true",
                headers={"Authorization": "Bearer k2"},
            )
            assert streamed.status_code == 404, streamed.text
            assert streamed.json()["error"]["code"] == "not_found"
            anonymous = await b.http.get(
                f"/v1/responses/{response_id}", headers={"Authorization": ""}
            )
            assert anonymous.status_code == 401
        # k2's attempts changed nothing: it still runs, and k1 can end it from B.
        assert (await a.sdk.responses.retrieve(running.id)).status == "in_progress"
        assert (await b.sdk.responses.cancel(running.id)).status == "cancelled"
        assert (await b.sdk.responses.retrieve(finished.id)).output_text == "You said: mine"
        # k2's own responses are its own, on every replica.
        theirs = await other_on_b.responses.create(model=MODEL, input="theirs")
        assert (await other_on_a.responses.retrieve(theirs.id)).id == theirs.id
        with pytest.raises(openai.NotFoundError):
            await a.sdk.responses.retrieve(theirs.id)
