"""The Redis backend's own behaviour, on a real redis-server (tests/redis_server.py).

What every backend must do is in the contract suite; here: the key layout and
TTLs, the count and byte bounds (their indexes, and members whose keys expired),
two replicas sharing one server (records, live logs, cancels, recovery of a dead
replica), trimming, bounded reads, and the safety of cancelled blocking reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from tests.redis_server import RedisServer
from trio_responses import Config
from trio_responses.background.event_log import EventLog, SubscriberLagged
from trio_responses.background.subscription import Subscription
from trio_responses.protocol.builder import ResponseBuilder, request_echo
from trio_responses.protocol.codec import decode_event, is_terminal_frame
from trio_responses.protocol.request import parse_create_request
from trio_responses.store import redis as redis_backend
from trio_responses.store.base import State, StoredResponse, StoreError
from trio_responses.store.redis import PREFIX, open_redis_state
from trio_responses.store.redis import _logs as redis_logs

OWNER = "owner-digest"
UNUSED_LOG = EventLog(max_events=1, max_bytes=1)  # `finish` ignores it on Redis


@pytest.fixture
def url(redis: RedisServer) -> str:
    redis.flush()
    return redis.url


@asynccontextmanager
async def replica(url: str, **overrides: Any) -> AsyncIterator[State]:
    async with open_redis_state(url, Config(**overrides)) as state:
        yield state


class Job:
    """A background response's frames, made by the real `ResponseBuilder`."""

    def __init__(self, response_id: str = "resp_1") -> None:
        self.frames: list[bytes] = []
        self.builder = ResponseBuilder(
            response_id=response_id,
            model="m",
            created_at=1.0,
            echo=request_echo(parse_create_request({"model": "m", "background": True})),
            background=True,
            emit=self.frames.append,
        )
        self.builder.start()
        self.builder.mark_in_progress()
        self.builder.open_message()
        self.written = 0

    def tokens(self, count: int) -> list[bytes]:
        """Emit ``count`` deltas; return the frames not handed out yet."""
        for index in range(count):
            self.builder.delta(f"tok{index} ")
        return self.take()

    def complete(self) -> list[bytes]:
        self.builder.close_item()
        self.builder.finish("completed", now=2.0)
        return self.take()

    def take(self) -> list[bytes]:
        batch = self.frames[self.written :]
        self.written = len(self.frames)
        return batch

    def record(self, replica: str | None) -> StoredResponse:
        return StoredResponse(
            response=self.builder.snapshot(), input_items=[], owner=OWNER, replica=replica
        )


async def append(state: State, job: Job, frames: list[bytes]) -> None:
    first = job.written - len(frames)
    await state.logs.append(job.builder.id, frames, first=first, owner=OWNER)


async def read_all(subscription: Subscription) -> list[bytes]:
    frames: list[bytes] = []
    with subscription:
        while batch := await subscription.receive_frames():
            frames.extend(batch)
    return frames


def sequence_numbers(frames: list[bytes]) -> list[int]:
    return [decode_event(frame)["sequence_number"] for frame in frames]


def pttl(redis: RedisServer, key: str) -> int:
    return int(redis.cli("PTTL", PREFIX + key))


# -- records ---------------------------------------------------------------------


async def test_record_round_trip_and_owner_scoping(url: str) -> None:
    job = Job()
    job.complete()
    record = job.record(None)
    async with replica(url) as state:
        await state.store.put(record)
        stored = await state.store.get(record.id, owner=OWNER)
        assert stored == record
        assert stored is not None and stored.updated_at > 0
        assert await state.store.get(record.id, owner="someone else") is None
        assert await state.store.get(record.id, owner=None) is None
        assert await state.store.get("resp_unknown", owner=OWNER) is None
        assert not await state.store.delete(record.id, owner="someone else")
        assert await state.store.delete(record.id, owner=OWNER)
        assert await state.store.get(record.id, owner=OWNER) is None
        assert not await state.store.delete(record.id, owner=OWNER)
        assert await state.store.expire() == 0


async def test_running_records_have_no_ttl_and_are_listed(url: str, redis: RedisServer) -> None:
    job = Job()
    async with replica(url, store_ttl_s=60.0) as state:
        running = job.record(state.control.replica)
        await state.store.put(running)
        assert pttl(redis, f"response:{running.id}") == -1  # never expires
        assert redis.cli("HGET", PREFIX + "running", running.id) == state.control.replica

        job.complete()
        await state.store.put(job.record(None))
        assert 0 < pttl(redis, f"response:{running.id}") <= 60_000
        assert redis.cli("HEXISTS", PREFIX + "running", running.id) == "0"

        await state.store.put(running)  # back to running (a test, not the service)
        assert await state.store.delete(running.id, owner=OWNER)
        assert redis.cli("HLEN", PREFIX + "running") == "0"


def finished_index(redis: RedisServer) -> list[str]:
    """The ids in ``finished``, oldest first."""
    listed = redis.cli("ZRANGE", PREFIX + "finished", "0", "-1")
    return listed.split() if listed else []


def retained_index(redis: RedisServer) -> list[str]:
    """The ids in ``retained``, oldest first."""
    listed = redis.cli("ZRANGE", PREFIX + "retained", "0", "-1")
    return listed.split() if listed else []


async def test_finished_records_are_bounded_by_count(url: str, redis: RedisServer) -> None:
    async with replica(url, max_stored_responses=3) as state:
        store = state.store
        runners = [Job(f"resp_run_{n}") for n in range(2)]
        for runner in runners:
            await store.put(runner.record(state.control.replica))
        done = [Job(f"resp_done_{n}") for n in range(5)]
        for job in done:
            job.complete()
            await store.put(job.record(None))
        # The oldest finished went first; running records are not even candidates.
        present = [await store.get(job.builder.id, owner=OWNER) is not None for job in done]
        assert present == [False, False, True, True, True]
        assert finished_index(redis) == [job.builder.id for job in done[2:]]
        for runner in runners:
            assert await store.get(runner.builder.id, owner=OWNER) is not None
        assert redis.cli("EXISTS", PREFIX + f"response:{done[0].builder.id}") == "0"

        # A running record that finishes is the newest finished one.
        running = runners[0].record(state.control.replica)
        runners[0].complete()
        await store.put(runners[0].record(None))
        assert finished_index(redis) == [
            done[3].builder.id,
            done[4].builder.id,
            runners[0].builder.id,
        ]
        assert await store.get(done[2].builder.id, owner=OWNER) is None
        # A finished record is final: a late write (a replica that stalled past its
        # lease, a retry) changes nothing, running or finished.
        await store.put(running)
        await store.put(done[3].record(None))
        assert finished_index(redis) == [
            done[3].builder.id,
            done[4].builder.id,
            runners[0].builder.id,
        ]
        again = await store.get(runners[0].builder.id, owner=OWNER)
        assert again is not None and not again.running
        assert await store.delete(done[4].builder.id, owner=OWNER)
        assert finished_index(redis) == [done[3].builder.id, runners[0].builder.id]
        for runner in runners:
            assert await store.get(runner.builder.id, owner=OWNER) is not None


async def test_records_their_ttl_removed_leave_the_index(url: str, redis: RedisServer) -> None:
    async with replica(url, max_stored_responses=3, store_ttl_s=0.2) as state:
        store = state.store
        old = [Job(f"resp_old_{n}") for n in range(3)]
        for job in old:
            job.complete()
            await store.put(job.record(None))
        # A member whose key is gone already (expired, or removed by hand) is harmless.
        redis.cli("ZADD", PREFIX + "finished", "1", "resp_ghost")
        await trio.sleep(0.3)
        assert redis.cli("EXISTS", PREFIX + f"response:{old[0].builder.id}") == "0"
        assert await store.expire() == 4
        assert finished_index(redis) == []

    async with replica(url, max_stored_responses=2) as state:
        store = state.store
        redis.cli("ZADD", PREFIX + "finished", "1", "resp_ghost")
        new = [Job(f"resp_new_{n}") for n in range(3)]
        for job in new:
            job.complete()
            await store.put(job.record(None))
        # The ghost was popped first (deleting a missing key), then the oldest record.
        assert finished_index(redis) == [job.builder.id for job in new[1:]]
        assert await store.get(new[0].builder.id, owner=OWNER) is None
        assert await store.expire() == 0


async def test_a_record_put_by_one_replica_is_read_by_another(url: str) -> None:
    job = Job()
    async with replica(url) as a, replica(url) as b:
        assert a.kind == b.kind == "redis" and a.durable
        assert a.control.replica != b.control.replica
        await a.store.put(job.record(a.control.replica))
        stored = await b.store.get(job.builder.id, owner=OWNER)
        assert stored is not None and stored.replica == a.control.replica


async def test_open_reports_unreachable_server(tmp_path: Any) -> None:
    with pytest.raises(StoreError, match="Cannot use Redis"):
        async with replica(f"unix://{tmp_path}/nothing.sock?db=0"):
            pass  # pragma: no cover


async def test_body_exceptions_leave_unwrapped(url: str) -> None:
    with pytest.raises(ValueError, match="mine"):
        async with replica(url):
            raise ValueError("mine")


# -- event logs ------------------------------------------------------------------


async def test_another_replica_follows_a_log_live(url: str) -> None:
    job = Job()
    received: list[bytes] = []
    delays: list[float] = []
    async with replica(url) as a, replica(url) as b:
        await append(a, job, job.take())  # created, queued, in_progress, item/part added
        subscription = await b.logs.open(job.builder.id, owner=OWNER, starting_after=-1)
        assert subscription is not None

        async def follow() -> None:
            with subscription:
                while batch := await subscription.receive_frames():
                    received.extend(batch)
                    if sent_at:
                        delays.append(time.perf_counter() - sent_at[-1])

        sent_at: list[float] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            for _ in range(20):
                await trio.sleep(0.01)
                batch = job.tokens(25)
                sent_at.append(time.perf_counter())
                await append(a, job, batch)
            await append(a, job, job.complete())
            await a.logs.finish(job.builder.id, UNUSED_LOG, owner=OWNER)
    assert received == job.frames
    assert sequence_numbers(received) == list(range(len(job.frames)))
    assert is_terminal_frame(received[-1])
    delays.sort()
    # Each batch reaches the other replica within a few ms (loosely: a loaded box).
    assert delays[len(delays) // 2] < 0.05, delays


async def test_open_scopes_by_owner_and_resumes_after_a_cursor(url: str) -> None:
    job = Job()
    async with replica(url) as state:
        await append(state, job, job.tokens(10))
        await append(state, job, job.complete())
        await state.logs.finish(job.builder.id, UNUSED_LOG, owner=OWNER)
        logs = state.logs
        assert await logs.open(job.builder.id, owner="other", starting_after=-1) is None
        assert await logs.open("resp_unknown", owner=OWNER, starting_after=-1) is None
        for cursor in (-1, 3, 7, len(job.frames) - 2):
            subscription = await logs.open(job.builder.id, owner=OWNER, starting_after=cursor)
            assert subscription is not None
            assert await read_all(subscription) == job.frames[cursor + 1 :]
        # At the terminal event already: ends at once, without waiting.
        last = len(job.frames) - 1
        subscription = await logs.open(job.builder.id, owner=OWNER, starting_after=last)
        assert subscription is not None
        with trio.fail_after(0.5):
            assert await read_all(subscription) == []


async def test_append_is_idempotent_and_finish_sets_the_retention(
    url: str, redis: RedisServer
) -> None:
    job = Job()
    async with replica(url, stream_retention_s=30.0, store_ttl_s=3600.0) as state:
        batch = job.tokens(5)
        await append(state, job, batch)
        await append(state, job, batch)  # a retried call
        assert redis.cli("XLEN", f"{PREFIX}log:{job.builder.id}") == "1"
        assert 30_000 < pttl(redis, f"log:{job.builder.id}") <= 3_600_000
        assert state.logs.statistics().retained_streams == 1

        await append(state, job, job.complete())
        await state.logs.finish(job.builder.id, UNUSED_LOG, owner=OWNER)
        for key in (f"log:{job.builder.id}", f"logmeta:{job.builder.id}"):
            assert 0 < pttl(redis, key) <= 30_000
        statistics = state.logs.statistics()
        assert statistics.retained_streams == 1
        assert statistics.retained_bytes == sum(map(len, job.frames))
        assert await state.logs.expire() == 0

        await state.logs.delete(job.builder.id, owner=OWNER)
        assert await state.logs.open(job.builder.id, owner=OWNER, starting_after=-1) is None


async def finish_log(state: State, job: Job) -> None:
    await append(state, job, job.take())
    await append(state, job, job.complete())
    await state.logs.finish(job.builder.id, UNUSED_LOG, owner=OWNER)


async def test_finished_logs_are_bounded_by_count_and_bytes(url: str, redis: RedisServer) -> None:
    jobs = [Job(f"resp_{n}") for n in range(6)]
    for job in jobs:
        job.tokens(20)
        job.complete()
        job.written = 0  # nothing appended yet
    size = sum(map(len, jobs[0].frames))  # the same for each (ids of the same length)
    assert {sum(map(len, job.frames)) for job in jobs} == {size}
    async with replica(url, max_retained_streams=3, retained_stream_bytes=2 * size + 10) as state:
        running = Job("resp_running")
        await append(state, running, running.tokens(3))
        for job in jobs:
            await append(state, job, job.take())
            await state.logs.finish(job.builder.id, UNUSED_LOG, owner=OWNER)
        # The byte limit holds two of these logs; the oldest went, with their keys.
        assert retained_index(redis) == ["resp_4", "resp_5"]
        for job in jobs[:4]:
            assert await state.logs.open(job.builder.id, owner=OWNER, starting_after=-1) is None
            assert redis.cli("EXISTS", f"{PREFIX}log:{job.builder.id}") == "0"
            assert redis.cli("EXISTS", f"{PREFIX}logmeta:{job.builder.id}") == "0"
        assert redis.cli("HKEYS", PREFIX + "retained:bytes").split() == ["resp_4", "resp_5"]
        assert int(redis.cli("HGET", PREFIX + "retained:bytes", "resp_5")) == size
        assert int(redis.cli("GET", PREFIX + "retained:total")) == 2 * size
        statistics = state.logs.statistics()
        assert statistics.retained_streams == 2 + 1  # and the running one
        assert statistics.retained_bytes == 2 * size + sum(map(len, running.frames))
        # Running logs are never evicted.
        subscription = await state.logs.open("resp_running", owner=OWNER, starting_after=-1)
        assert subscription is not None
        with subscription:
            assert await subscription.receive_frames() == running.frames

        await state.logs.delete("resp_4", owner=OWNER)
        assert retained_index(redis) == ["resp_5"]
        assert int(redis.cli("GET", PREFIX + "retained:total")) == size
        assert state.logs.statistics().retained_streams == 1 + 1

        # A log larger than the byte limit stays while it is the newest.
        big = Job("resp_big")
        await append(state, big, big.tokens(200))
        await finish_log(state, big)
        assert retained_index(redis) == ["resp_big"]
        assert await state.logs.open("resp_big", owner=OWNER, starting_after=-1) is not None


async def test_logs_their_ttl_removed_leave_the_index(url: str, redis: RedisServer) -> None:
    async with replica(url, stream_retention_s=0.2) as state:
        for n in range(3):
            await finish_log(state, Job(f"resp_{n}"))
        # A member whose keys are gone already (expired, or removed by hand) is harmless.
        redis.cli("ZADD", PREFIX + "retained", "1", "resp_ghost")
        assert state.logs.statistics().retained_streams == 3  # as the last finish reported
        await trio.sleep(0.3)
        assert await state.logs.expire() == 4
        assert retained_index(redis) == []
        assert redis.cli("HLEN", PREFIX + "retained:bytes") == "0"
        assert redis.cli("GET", PREFIX + "retained:total") == "0"
        assert state.logs.statistics().retained_streams == 0

    async with replica(url, max_retained_streams=1) as state:
        redis.cli("ZADD", PREFIX + "retained", "1", "resp_ghost")
        await finish_log(state, Job("resp_new"))
        assert retained_index(redis) == ["resp_new"]


async def test_recovery_and_terminate_keep_the_bounds(url: str, redis: RedisServer) -> None:
    async with replica(url, max_stored_responses=1, max_retained_streams=1) as state:
        cut = Job("resp_cut")
        await append(state, cut, cut.tokens(3))
        await state.logs.terminate(cut.record("gone").interrupted())
        assert retained_index(redis) == ["resp_cut"]
        dead = Job("resp_dead")
        await state.store.put(dead.record("gone-replica"))
        await append(state, dead, dead.tokens(3))
        assert [record.id for record in await state.store.recover_interrupted()] == ["resp_dead"]
        assert finished_index(redis) == ["resp_dead"]
        assert retained_index(redis) == ["resp_dead"]  # resp_cut evicted by the claim
        assert redis.cli("EXISTS", f"{PREFIX}log:resp_cut") == "0"


async def test_a_trimmed_log_reports_lag(url: str, redis: RedisServer) -> None:
    job = Job()
    async with replica(url, replay_events=100) as state:
        for _ in range(100):
            await append(state, job, job.tokens(10))
        total = len(job.frames)
        # The log's byte count follows the trimming: the entries kept, exactly.
        kept = redis.cli("XLEN", f"{PREFIX}log:{job.builder.id}")
        stored = int(redis.cli("HGET", f"{PREFIX}logmeta:{job.builder.id}", "bytes"))
        assert stored == sum(map(len, job.frames[total - int(kept) * 10 :]))
        with pytest.raises(SubscriberLagged) as lagged:
            await state.logs.open(job.builder.id, owner=OWNER, starting_after=-1)
        oldest = lagged.value.oldest
        assert lagged.value.wanted == 0
        # About replay_events kept (approximate trimming keeps a little more).
        assert 0 < oldest <= total - 100
        subscription = await state.logs.open(job.builder.id, owner=OWNER, starting_after=oldest - 1)
        assert subscription is not None
        with subscription:
            frames = await subscription.receive_frames()
        assert sequence_numbers(frames)[0] == oldest


async def test_resuming_in_the_middle_of_a_long_log_is_fast(url: str) -> None:
    job = Job()
    async with replica(url) as state:
        while len(job.frames) < 20_000:
            await append(state, job, job.tokens(100))
        timings = []
        for _ in range(3):
            started = time.perf_counter()
            subscription = await state.logs.open(job.builder.id, owner=OWNER, starting_after=12_345)
            assert subscription is not None
            with subscription:
                frames = await subscription.receive_frames()
            timings.append(time.perf_counter() - started)
            assert sequence_numbers(frames)[0] == 12_346
    assert min(timings) < 0.05, timings


async def test_a_large_batch_is_stored_as_several_entries(
    url: str, redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_logs, "_ENTRY_BYTES", 2_000)
    job = Job()
    async with replica(url) as state:
        batch = job.tokens(30)  # about 8 KB
        await append(state, job, batch)
        await append(state, job, batch)  # a retried call: all of it or nothing
        log = f"{PREFIX}log:{job.builder.id}"
        entries = int(redis.cli("XLEN", log))
        assert 4 <= entries <= 6
        assert redis.cli("XREVRANGE", log, "+", "-", "COUNT", "1").split()[0] == (
            f"0-{len(job.frames)}"
        )
        meta = f"{PREFIX}logmeta:{job.builder.id}"
        assert int(redis.cli("HGET", meta, "bytes")) == sum(map(len, job.frames))
        await append(state, job, job.complete())
        await state.logs.finish(job.builder.id, UNUSED_LOG, owner=OWNER)
        for cursor in (-1, 3, 17, 30):
            subscription = await state.logs.open(job.builder.id, owner=OWNER, starting_after=cursor)
            assert subscription is not None
            assert await read_all(subscription) == job.frames[cursor + 1 :]


async def test_reads_are_bounded_by_bytes(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    budget = 8_000
    monkeypatch.setattr(redis_logs, "_READ_BYTES", budget)
    job = Job()
    entries: list[list[bytes]] = []
    async with replica(url) as state:
        # Entries of 1 to 60 frames (a frame is about 270 bytes).
        for count in (1, 2, 40, 3, 1, 60, 5, 5, 5, 5, 5, 5, 20, 1, 1, 1, 30, 2):
            batch = job.tokens(count)
            entries.append(batch)
            await append(state, job, batch)
        await append(state, job, job.complete())
        await state.logs.finish(job.builder.id, UNUSED_LOG, owner=OWNER)
        assert max(sum(map(len, entry)) for entry in entries) > budget
        for cursor in (-1, 0, 5, 44, 100, 111, 150):
            subscription = await state.logs.open(job.builder.id, owner=OWNER, starting_after=cursor)
            assert subscription is not None
            received: list[bytes] = []
            with subscription:
                while batch := await subscription.receive_frames():
                    # Entries over the budget are cut: each read stays within it.
                    assert sum(map(len, batch)) <= budget
                    received.extend(batch)
            assert received == job.frames[cursor + 1 :]
        # A frame larger than the budget is still handed out, alone.
        monkeypatch.setattr(redis_logs, "_READ_BYTES", 10)
        subscription = await state.logs.open(job.builder.id, owner=OWNER, starting_after=50)
        assert subscription is not None
        with subscription:
            assert await subscription.receive_frames() == job.frames[51:52]
            assert await subscription.receive_frames() == job.frames[52:53]
        monkeypatch.setattr(redis_logs, "_READ_BYTES", budget)
        # Small entries are gathered up to the budget (after 111: entries of 5 frames).
        subscription = await state.logs.open(job.builder.id, owner=OWNER, starting_after=111)
        assert subscription is not None
        with subscription:
            batch = await subscription.receive_frames()
        assert len(batch) >= 20 and sum(map(len, batch)) <= budget


async def test_cancelled_blocking_reads_leave_the_clients_healthy(
    url: str, redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small blocking pool: a leaked slot per cancelled read would exhaust it.
    monkeypatch.setattr(redis_backend, "_BLOCKING_CONNECTIONS", 4)
    job = Job()
    async with replica(url) as state:
        await append(state, job, job.take())
        subscription = await state.logs.open(job.builder.id, owner=OWNER, starting_after=-1)
        assert subscription is not None
        with subscription:
            assert await subscription.receive_frames() == job.frames
            cancelled = 0
            for attempt in range(60):
                with trio.move_on_after(0.001 * (attempt % 7)) as scope:
                    # Other commands on the clients while reads are cut short.
                    records = [Job(f"resp_{attempt}_{n}") for n in range(3)]
                    async with trio.open_nursery() as nursery:
                        for other in records:
                            nursery.start_soon(state.store.put, other.record(None))
                        nursery.start_soon(subscription.receive_frames)
                cancelled += scope.cancelled_caught
                for other in records:
                    stored = await state.store.get(other.builder.id, owner=OWNER)
                    assert stored is None or stored.id == other.builder.id
            assert cancelled > 40
            # Nothing was consumed by the cancelled reads, and the next one still works.
            await append(state, job, job.tokens(3))
            # Generous: on a loaded machine a slot may come back only at the pool timeout.
            with trio.fail_after(15):
                frames = await subscription.receive_frames()
            assert frames == job.frames[-3:]
        for attempt in range(20):
            probe = Job(f"resp_probe_{attempt}")
            await state.store.put(probe.record(None))
            stored = await state.store.get(probe.builder.id, owner=OWNER)
            assert stored is not None and stored.id == probe.builder.id
    clients = int(redis.cli("INFO", "clients").split("connected_clients:")[1].split()[0])
    assert clients <= 2  # every connection closed (redis-cli's own, at most one left)


# -- control and recovery ------------------------------------------------------------


async def test_a_cancel_request_reaches_the_replica_running_the_job(
    url: str, redis: RedisServer
) -> None:
    job = Job()
    cancelled: list[str] = []
    arrived = trio.Event()

    def on_cancel(response_id: str) -> None:
        cancelled.append(response_id)
        arrived.set()

    async with replica(url, job_lease_s=1.0) as a, replica(url) as b:
        async with trio.open_nursery() as nursery:
            await nursery.start(a.control.run, on_cancel)
            lease = f"lease:{a.control.replica}"
            assert 0 < pttl(redis, lease) <= 1_000
            await trio.sleep(1.2)  # outlive one lease: the heartbeat keeps it
            assert 0 < pttl(redis, lease) <= 1_000
            record = job.record(a.control.replica)
            assert await b.control.request_cancel(record)
            with trio.fail_after(10):
                await arrived.wait()
            assert cancelled == [job.builder.id]
            assert not await b.control.request_cancel(job.record("a-replica-gone"))
            assert not await b.control.request_cancel(job.record(None))
            nursery.cancel_scope.cancel()
        assert redis.cli("EXISTS", PREFIX + lease) == "0"  # removed on the way out
        assert not await b.control.request_cancel(record)


async def test_the_control_loop_survives_lost_connections(url: str, redis: RedisServer) -> None:
    arrived = trio.Event()
    async with (
        replica(url, job_lease_s=1.0) as a,
        replica(url) as b,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(a.control.run, lambda _: arrived.set())
        await trio.sleep(0.05)
        redis.cli("CLIENT", "KILL", "TYPE", "normal")  # both replicas' connections
        with trio.fail_after(10):
            sent = False
            while not sent:
                try:
                    sent = await b.control.request_cancel(Job().record(a.control.replica))
                except StoreError:  # pragma: no cover - coredis usually reconnects
                    await trio.sleep(0.05)
            await arrived.wait()
        nursery.cancel_scope.cancel()


async def test_a_dead_replicas_job_is_recovered_once(url: str, redis: RedisServer) -> None:
    job = Job()
    async with replica(url, job_lease_s=0.5) as a:
        async with trio.open_nursery() as nursery:
            await nursery.start(a.control.run, lambda _: None)
            await a.store.put(job.record(a.control.replica))
            await append(a, job, job.tokens(5))
            alive = Job("resp_alive")
            await a.store.put(alive.record(a.control.replica))
            async with replica(url) as b:
                # A is alive: its jobs are its own.
                assert await b.store.recover_interrupted() == []
            nursery.cancel_scope.cancel()  # A stops heart-beating (and drops its lease)
        await a.store.delete(alive.builder.id, owner=OWNER)

    async with replica(url) as b, replica(url) as c, trio.open_nursery() as controls:
        await controls.start(b.control.run, lambda _: None)
        await controls.start(c.control.run, lambda _: None)
        own = Job("resp_own")
        await b.store.put(own.record(b.control.replica))  # a live replica's: untouched
        results: dict[str, list[StoredResponse]] = {}

        async def recover(name: str, state: State) -> None:
            results[name] = await state.store.recover_interrupted()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(recover, "b", b)
            nursery.start_soon(recover, "c", c)
        claimed = results["b"] + results["c"]
        assert [record.id for record in claimed] == [job.builder.id]
        recovered = claimed[0]
        assert recovered.status == "failed" and recovered.replica is None
        assert recovered.response["error"]["code"] == "server_restarted"
        assert await b.store.get(job.builder.id, owner=OWNER) == recovered
        assert pttl(redis, f"response:{job.builder.id}") > 0
        assert redis.cli("HKEYS", PREFIX + "running") == own.builder.id
        assert await c.store.recover_interrupted() == []

        # The log ended with the terminal event, in the same script; terminate is a no-op.
        await b.logs.terminate(recovered)
        subscription = await c.logs.open(job.builder.id, owner=OWNER, starting_after=-1)
        assert subscription is not None
        frames = await read_all(subscription)
        assert frames[:-1] == job.frames
        last = decode_event(frames[-1])
        assert last["type"] == "response.failed"
        assert last["sequence_number"] == len(job.frames)
        assert last["response"]["error"]["code"] == "server_restarted"
        assert 0 < pttl(redis, f"log:{job.builder.id}") <= 600_000
        assert job.builder.id in finished_index(redis)
        assert job.builder.id in retained_index(redis)
        controls.cancel_scope.cancel()


async def test_an_expired_lease_makes_a_replica_dead(url: str, redis: RedisServer) -> None:
    job = Job()
    lease = PREFIX + "lease:crashed"
    redis.cli("SET", lease, "host:1", "PX", "60000")
    async with replica(url) as b:
        await b.store.put(job.record("crashed"))
        assert await b.store.recover_interrupted() == []
        # The lease runs out (the key is gone, as when Redis expires it), however
        # slow this machine is.
        redis.cli("DEL", lease)
        recovered = await b.store.recover_interrupted()
        assert [record.status for record in recovered] == ["failed"]


async def test_terminate_ends_an_open_log_once(url: str) -> None:
    job = Job()
    async with replica(url) as state:
        await append(state, job, job.tokens(3))
        interrupted = job.record("gone").interrupted()
        await state.logs.terminate(interrupted)
        await state.logs.terminate(interrupted)
        await state.logs.terminate(Job("resp_without_log").record(None).interrupted())
        subscription = await state.logs.open(job.builder.id, owner=OWNER, starting_after=-1)
        assert subscription is not None
        frames = await read_all(subscription)
        assert frames[:-1] == job.frames
        assert decode_event(frames[-1])["type"] == "response.failed"
        assert sequence_numbers(frames) == list(range(len(job.frames) + 1))


async def test_a_replica_that_stalled_past_its_lease_cannot_undo_the_recovery(
    url: str, redis: RedisServer
) -> None:
    job = Job()
    async with replica(url) as stalled, replica(url) as survivor:
        # The stalled replica's lease is gone (as if it had stopped heart-beating).
        await stalled.store.put(job.record("stalled-replica"))
        await append(stalled, job, job.tokens(5))
        [recovered] = await survivor.store.recover_interrupted()
        # It wakes up and goes on as if nothing happened: more frames, then its end.
        await append(stalled, job, job.tokens(1))
        await append(stalled, job, job.tokens(20))
        await append(stalled, job, job.complete())
        await stalled.store.put(job.record(None))
        record = await survivor.store.get(job.builder.id, owner=OWNER)
        assert record == recovered and record.status == "failed"
        subscription = await survivor.logs.open(job.builder.id, owner=OWNER, starting_after=-1)
        assert subscription is not None
        events = [decode_event(frame) for frame in await read_all(subscription)]
        terminal = [e for e in events if e["type"] in ("response.completed", "response.failed")]
        assert len(terminal) == 1 and terminal[0] is events[-1]
        assert terminal[0]["response"]["error"]["code"] == "server_restarted"
        assert sequence_numbers(await read_all_frames(survivor, job)) == list(range(len(events)))


async def read_all_frames(state: State, job: Job) -> list[bytes]:
    subscription = await state.logs.open(job.builder.id, owner=OWNER, starting_after=-1)
    assert subscription is not None
    return await read_all(subscription)


async def test_a_fresh_server_logs_nothing_about_its_scripts(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A server that has never run our scripts: coredis would retry the first call of
    # each (a cache miss), logging "Retry attempt 1 due to error: No matching script".
    redis.flush()
    redis.cli("SCRIPT", "FLUSH")
    caplog.set_level(logging.INFO)
    job = Job()
    job.complete()
    record = job.record(None)
    async with replica(redis.url) as state:
        await state.store.put(record)
        assert await state.store.get(record.id, owner=OWNER) == record
    noise = [record for record in caplog.records if record.name.startswith("coredis")]
    assert noise == [], [record.getMessage() for record in noise]
